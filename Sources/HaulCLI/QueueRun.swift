import ArgumentParser
import Haul
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
    /// Opens the manager on the state directory; one not `claiming` leaves what it queues to the
    /// manager that runs the queue (see ``DownloadManager/Configuration/claimsQueuedDownloads``).
    static func openManager(
        _ state: StateOptions, _ transfer: TransferOptions, restoring: DownloadManager.Configuration.RestoredDownloads,
        claiming: Bool = true, verbose: Bool = false
    ) throws -> DownloadManager {
        var configuration = transfer.managerConfiguration(restoring: restoring)
        configuration.claimsQueuedDownloads = claiming
        return try DownloadManager(
            stateDirectory: state.directory, configuration: configuration,
            downloaderConfiguration: try transfer.downloaderConfiguration(),
            logger: VerboseLogHandler.logger(verbose: verbose))
    }

    /// Runs `downloads` (as the manager answered when they were queued, not read again) to their
    /// end and exits with the documented code: 0 when every download is saved, else the code of the
    /// first one that is not. Ctrl-C or SIGTERM stops them with a checkpoint.
    /// - Parameter finishing: runs once the downloads have stopped, before the last lines (saving
    ///   the cookies); a failure is reported on its line and changes nothing else.
    static func run(
        _ manager: DownloadManager, _ downloads: [DownloadInfo], output: OutputOptions,
        finishing: () throws -> Void = {}
    ) async throws -> Never {
        let ids = downloads.map(\.id)
        let display = QueueDisplay(output: output, downloads: downloads)
        let events = display.wants.map { manager.events(where: $0) } ?? manager.events()
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
        let final = await manager.downloads(ids: ids, in: display.endingStates)
        do {
            try finishing()
        } catch {
            display.clear()
            Output.standardError("haul: error: \((error as? HaulError)?.message ?? "\(error)")\n")
        }
        try display.end(final, interrupted: signals.received)
    }
}

/// What a command shows of the downloads it runs or follows, and the exit code their end gives.
final class QueueDisplay: Sendable {
    private let ids: [DownloadID]
    private let single: ProgressRenderer?
    private let queue: QueueRenderer
    private let style: ProgressRenderer.Style
    private let completion = Mutex<DownloadResult?>(nil)

    /// - Parameter noting: say at once when the one download is already complete (a download followed
    ///   in the daemon is known to be so only once its events have been read).
    init(output: OutputOptions, downloads: [DownloadInfo], noting: Bool = true) {
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
        if noting, downloads.first?.state == .completed { noteAlreadyComplete(downloads[0]) }
    }

    /// The states of the downloads ``end(_:interrupted:leftRunning:)`` needs to see, when not all:
    /// of many, only those that did not complete tell the end (a long list is not read back whole).
    var endingStates: Set<DownloadState>? {
        single == nil ? Set(DownloadState.allCases).subtracting([.completed]) : nil
    }

    /// The events it shows anything of, when not all: the quiet display of many downloads tells
    /// only failures.
    var wants: (@Sendable (DownloadManagerEvent.Kind, DownloadState) -> Bool)? {
        style == .quiet && single == nil ? QueueRenderer.quietlyShown : nil
    }

    /// Says that the one download was complete before the command began.
    func noteAlreadyComplete(_ info: DownloadInfo) {
        guard let single, info.id == ids.first, style == .terminal || style == .lines else { return }
        single.note("\(info.destination ?? info.name) is already complete")
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
        case .stateChanged where event.download.isWaitingForSpace:
            single.note("paused: \(event.download.error?.message ?? "disk full"); continues once there is room")
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

    /// For a download followed in the daemon that completed while its events were missed: the
    /// result as far as the download tells it.
    func completedUnseen(_ info: DownloadInfo) {
        guard info.id == ids.first, completion.withLock({ $0 }) == nil else { return }
        let result = DownloadResult(
            destination: info.destination ?? info.name, url: info.url, bytes: info.bytes, bytesFetched: 0,
            resumedFrom: 0, restarts: 0, validator: ResourceValidator())
        completion.withLock { $0 = result }
        single?.handle(.completed(result))
    }

    /// Takes the progress off the screen before a message.
    func clear() {
        if let single { single.clearBar() } else { queue.clear() }
    }

    /// Prints the last lines and exits: 0 when every download is saved, else the code of the first
    /// that is not. `leftRunning`: an interruption leaves the downloads running in the daemon.
    /// `final` holds the downloads as they ended: those in ``endingStates`` are enough.
    func end(_ final: [DownloadInfo], interrupted: Int32?, leftRunning: Bool = false) throws -> Never {
        if interrupted != nil && leftRunning {
            if style != .quiet {
                clear()
                let running = final.filter { !DaemonFollower.isOver($0) }.map(\.id.description)
                var line = "haul: left running in the haul daemon: `haul ls` shows "
                line += running.count == 1 ? "it" : "them"
                if !running.isEmpty {
                    line +=
                        ", `haul pause \(running.joined(separator: " "))` pauses "
                        + (running.count == 1 ? "it" : "them")
                }
                Output.standardError(line + "\n")
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
