import ArgumentParser
import Haul
import HaulDaemon
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Runs downloads of a manager until they are all over, or follows them in the haul daemon, showing
/// their progress. Shared by `get`, `resume` and `retry`.
enum QueueRun {
    /// Opens the manager on the state directory.
    static func openManager(
        _ state: StateOptions, _ transfer: TransferOptions, restoring: DownloadManager.Configuration.RestoredDownloads,
        verbose: Bool = false
    ) throws -> DownloadManager {
        try DownloadManager(
            stateDirectory: state.directory, configuration: transfer.managerConfiguration(restoring: restoring),
            downloaderConfiguration: transfer.downloaderConfiguration,
            logger: VerboseLogHandler.logger(verbose: verbose))
    }

    /// Runs `ids` to their end and exits with the documented code: 0 when every download is saved,
    /// else the code of the first one that is not. Ctrl-C or SIGTERM stops them with a checkpoint.
    static func run(_ manager: DownloadManager, _ ids: [DownloadID], output: OutputOptions) async throws -> Never {
        var infos: [DownloadInfo] = []
        for id in ids {
            if let info = await manager.download(id) { infos.append(info) }
        }
        let display = QueueDisplay(output: output, downloads: infos)
        let events = manager.events()
        let signals = SignalWatcher(signals: [SIGINT, SIGTERM])
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for await event in events { display.handle(event) }
            }
            group.addTask {
                await withTaskGroup(of: Void.self) { runner in
                    runner.addTask { await manager.runUntilIdle() }
                    runner.addTask { await signals.next() }
                    // Whichever ends first: the queue ran out, or a signal asks to stop (cancelling
                    // checkpoints every running download before `runUntilIdle` returns).
                    await runner.next()
                    runner.cancelAll()
                }
                await manager.close()
            }
        }
        signals.stop()
        var final: [DownloadInfo] = []
        for id in ids {
            if let info = await manager.download(id) { final.append(info) }
        }
        try display.end(final, interrupted: signals.received)
    }

    /// Follows `ids` in the haul daemon until each is over (completed, failed, cancelled, removed, or
    /// paused other than for disk space) and exits as ``run(_:_:output:)`` does. Ctrl-C or SIGTERM
    /// leaves them running in the daemon, with a hint.
    ///
    /// - Parameter stream: the daemon's events, opened before the downloads were queued so that none
    ///   of theirs is missed.
    static func follow(
        _ client: DaemonClient, _ stream: DaemonClient.EventStream, _ ids: [DownloadID], output: OutputOptions
    ) async throws -> Never {
        var infos: [DownloadInfo] = []
        for id in ids {
            if let info = try await reportingErrors({ try? await client.download(id) }) { infos.append(info) }
        }
        let display = QueueDisplay(output: output, downloads: infos)
        let follower = DaemonFollower(ids: ids, downloads: infos)
        let signals = SignalWatcher(signals: [SIGINT, SIGTERM])
        let lost = await withTaskGroup(of: HaulError?.self) { group -> HaulError? in
            group.addTask { await follower.follow(client, stream, display) }
            group.addTask {
                await signals.next()
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        signals.stop()
        try? await client.shutdown()
        if let lost {
            display.clear()
            Output.standardError("haul: error: \(lost.message)\n")
            throw ExitCode(ExitCodes.code(for: lost.code))
        }
        try display.end(follower.downloads, interrupted: signals.received, leftRunning: true)
    }
}

/// Reads the daemon's events for a set of downloads into a display until each is over, reconnecting
/// once the stream drops (with `Last-Event-ID`, so nothing is missed).
final class DaemonFollower: Sendable {
    private let ids: [DownloadID]
    private let state: Mutex<[DownloadID: DownloadInfo]>
    /// Reconnections tried in a row before the daemon counts as gone.
    private let attempts = 3

    init(ids: [DownloadID], downloads: [DownloadInfo]) {
        self.ids = ids
        state = Mutex(Dictionary(downloads.map { ($0.id, $0) }, uniquingKeysWith: { $1 }))
    }

    /// The downloads as last seen, in the order of `ids`.
    var downloads: [DownloadInfo] { state.withLock { known in ids.compactMap { known[$0] } } }

    /// Whether every download is over: it will not transfer again unless asked.
    var allOver: Bool { state.withLock { known in ids.allSatisfy { known[$0].map(Self.isOver) ?? true } } }

    static func isOver(_ info: DownloadInfo) -> Bool {
        switch info.state {
        case .completed, .failed, .cancelled: true
        // A download paused for a full disk goes on by itself once there is room.
        case .paused: info.error?.code != .diskFull
        case .queued, .running: false
        }
    }

    /// Follows until every download is over (`nil`), the task is cancelled (`nil`), or the daemon is
    /// gone (the error).
    func follow(_ client: DaemonClient, _ first: DaemonClient.EventStream, _ display: QueueDisplay) async
        -> HaulError?
    {
        var stream: DaemonClient.EventStream? = first
        var lastEventID: String?
        var failures = 0
        while !allOver && !Task.isCancelled {
            if let current = stream {
                // A stream is read once: whatever ends it, the next round opens a new one.
                stream = nil
                do {
                    for try await event in current {
                        failures = 0
                        switch event {
                        case .reset:
                            // Events were missed: what each download is now is read anew.
                            for id in ids {
                                guard let info = try? await client.download(id) else { continue }
                                take(DownloadManagerEvent(kind: .stateChanged, download: info), display)
                            }
                        case .download(let event):
                            take(event, display)
                        }
                        if allOver || Task.isCancelled { return nil }
                    }
                } catch {
                    // Lost: reconnected below.
                }
                lastEventID = current.lastEventID ?? lastEventID
                continue
            }
            failures += 1
            if failures > attempts {
                return HaulError(
                    .network,
                    "lost the haul daemon at \(client.url); its downloads go on when it runs again (`haul ls` shows them)"
                )
            }
            try? await Task.sleep(for: .milliseconds(500 * failures))
            stream = try? await client.events(after: lastEventID)
        }
        return nil
    }

    private func take(_ event: DownloadManagerEvent, _ display: QueueDisplay) {
        let id = event.download.id
        let followed = state.withLock { known -> Bool in
            guard ids.contains(id) else { return false }
            known[id] = event.download
            return true
        }
        guard followed else { return }
        if case .removed = event.kind {
            state.withLock { known in
                // Gone from the daemon: over, with nothing saved.
                var removed = event.download
                removed.state = .cancelled
                removed.error = HaulError(.cancelled, "the download was removed from the haul daemon")
                known[id] = removed
            }
        }
        display.handle(event)
        // In this process, the transfer's own end comes before the state it leaves the download in:
        // the single download's renderer prints a failure from it.
        if case .stateChanged = event.kind, Self.isOver(event.download), event.download.state != .completed {
            display.handleEnd(of: event.download)
        }
    }
}

/// What a command shows of the downloads it runs or follows, and the exit code their end gives.
final class QueueDisplay: Sendable {
    private let ids: [DownloadID]
    private let single: ProgressRenderer?
    private let queue: QueueRenderer
    private let style: ProgressRenderer.Style
    private let completion = Mutex<DownloadResult?>(nil)

    init(output: OutputOptions, downloads: [DownloadInfo]) {
        let style: ProgressRenderer.Style
        if output.json {
            style = .json
        } else if output.quiet {
            style = .quiet
        } else {
            // A bar redrawn in place would tear the lines --verbose prints between its frames.
            style = isatty(STDERR_FILENO) != 0 && !output.verbose ? .terminal : .lines
        }
        self.style = style
        ids = downloads.map(\.id)
        single = downloads.count == 1 ? ProgressRenderer(style: style, url: downloads[0].url) : nil
        queue = QueueRenderer(style: style, downloads: downloads)
        if let single, downloads[0].state == .completed, style == .terminal || style == .lines {
            single.note("\(downloads[0].destination ?? downloads[0].name) is already complete")
        }
    }

    func handle(_ event: DownloadManagerEvent) {
        guard let single else {
            queue.handle(event)
            return
        }
        guard event.download.id == ids.first else { return }
        switch event.kind {
        case .transfer(let transfer):
            single.handle(transfer)
            if case .completed(let result) = transfer { completion.withLock { $0 = result } }
        case .stateChanged where event.download.state == .paused && event.download.error != nil:
            single.note("paused: \(event.download.error!.message); continues once there is room")
        default:
            break
        }
    }

    /// For a download followed in the daemon: the failure event a transfer in this process reports
    /// when it ends without its file (only JSON shows it before the end).
    func handleEnd(of info: DownloadInfo) {
        guard let single, info.id == ids.first, style == .json else { return }
        single.handle(.failed(info.error ?? HaulError.interrupted))
    }

    /// Takes the progress off the screen before a message.
    func clear() {
        if let single { single.clearBar() } else { queue.clear() }
    }

    /// Prints the last lines and exits: 0 when every download is saved, else the code of the first
    /// that is not. `leftRunning`: an interruption leaves the downloads running in the daemon.
    func end(_ final: [DownloadInfo], interrupted: Int32?, leftRunning: Bool = false) throws -> Never {
        if interrupted != nil && leftRunning {
            if style != .quiet {
                clear()
                let ids = final.filter { !DaemonFollower.isOver($0) }.map(\.id.description).joined(separator: " ")
                Output.standardError(
                    "haul: left running in the haul daemon: `haul ls` shows it, `haul pause \(ids)` pauses it\n")
            }
        } else if let single {
            let info = final.first
            if let result = completion.withLock({ $0 }) {
                single.finish(result)
            } else if info?.state != .completed {
                single.fail(
                    interrupted != nil || info?.state == .queued
                        ? HaulError.interrupted : info?.error ?? HaulError.interrupted)
            }
        } else {
            queue.finish(interrupted: interrupted != nil)
        }
        if let interrupted {
            throw ExitCode(interrupted == SIGTERM ? ExitCodes.terminated : ExitCodes.interrupted)
        }
        for info in final where info.state != .completed {
            throw ExitCode(info.error.map { ExitCodes.code(for: $0.code) } ?? ExitCodes.unexpected)
        }
        throw ExitCode.success
    }
}

extension HaulError {
    static var interrupted: HaulError { HaulError(.cancelled, "stopped before the download finished") }
}
