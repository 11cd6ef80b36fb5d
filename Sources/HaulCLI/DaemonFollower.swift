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

extension QueueRun {
    /// Follows downloads queued in the haul daemon until each is over (completed, failed, cancelled,
    /// removed, or paused other than for disk space) and exits as ``run(_:_:output:)`` does. A
    /// signal leaves them running in the daemon, with a hint.
    ///
    /// - Parameters:
    ///   - stream: the daemon's events, opened before the downloads were queued.
    ///   - queued: the downloads as the daemon answered when they were queued.
    ///   - target: the daemon's last event ID once they were queued: until the stream has reached it,
    ///     what the answers said may already have changed.
    static func follow(
        _ client: DaemonClient, _ stream: DaemonClient.EventStream, _ queued: [DownloadInfo], syncedAt target: String,
        signals: SignalWatcher, output: OutputOptions
    ) async throws -> Never {
        let display = QueueDisplay(output: output, downloads: queued, noting: false)
        let follower = DaemonFollower(downloads: queued, target: target)
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
/// when the stream drops (with `Last-Event-ID`, so nothing is missed; or, after a reset, reading each
/// download anew).
final class DaemonFollower: Sendable {
    private struct State {
        var downloads: [DownloadID: DownloadInfo]
        /// Downloads an event of the stream told about before it reached the target.
        var seen: Set<DownloadID> = []
        /// Downloads whose end has been shown.
        var ended: Set<DownloadID> = []
        var synced = false
    }

    private let ids: [DownloadID]
    private let target: EventPosition?
    private let state: Mutex<State>
    /// Reconnections tried in a row before the daemon counts as gone.
    private let attempts = 3

    init(downloads: [DownloadInfo], target: String) {
        ids = downloads.map(\.id)
        self.target = EventPosition(target)
        state = Mutex(State(downloads: Dictionary(downloads.map { ($0.id, $0) }, uniquingKeysWith: { $1 })))
    }

    /// The downloads as last seen, in the order they were queued.
    var downloads: [DownloadInfo] { state.withLock { state in ids.compactMap { state.downloads[$0] } } }

    /// Whether every download is over, as far as the stream has told: before it reached the target,
    /// nothing is.
    var allOver: Bool {
        state.withLock { state in state.synced && ids.allSatisfy { state.downloads[$0].map(Self.isOver) ?? true } }
    }

    /// Whether a download will not transfer again unless asked.
    static func isOver(_ info: DownloadInfo) -> Bool {
        switch info.state {
        case .completed, .failed, .cancelled: true
        // A download paused for a full disk goes on by itself once there is room.
        case .paused: !info.isWaitingForSpace
        case .queued, .running: false
        }
    }

    /// The error of a command whose daemon went while it followed the daemon's downloads.
    static func lost(_ client: DaemonClient, _ reason: String) -> HaulError {
        HaulError(
            .network,
            "lost the haul daemon at \(client.url) (\(reason)); its downloads go on when it runs again "
                + "(`haul ls` shows them)")
    }

    /// Follows until every download is over (`nil`), the task is cancelled (`nil`), or the daemon is
    /// gone (the error).
    func follow(_ client: DaemonClient, _ first: DaemonClient.EventStream, _ display: QueueDisplay) async
        -> HaulError?
    {
        var stream: DaemonClient.EventStream? = first
        var lastEventID: String?
        var failures = 0
        var lastFailure = ""
        while !Task.isCancelled {
            if let current = stream {
                // A stream is read once: whatever ends it, the next round opens a new one.
                stream = nil
                do {
                    for try await event in current {
                        failures = 0
                        switch event {
                        case .reset:
                            try await reread(client, display)
                        case .position:
                            break
                        case .download(let event):
                            take(event, display)
                        }
                        reached(EventPosition(current.lastEventID), display)
                        if allOver || Task.isCancelled { return nil }
                    }
                    lastFailure = "the daemon ended the event stream"
                } catch {
                    lastFailure = (error as? HaulError)?.message ?? "\(error)"
                }
                lastEventID = current.lastEventID ?? lastEventID
                continue
            }
            failures += 1
            if failures > attempts { return Self.lost(client, lastFailure) }
            try? await Task.sleep(for: .milliseconds(500 * failures))
            do {
                stream = try await client.events(after: lastEventID)
            } catch {
                lastFailure = (error as? HaulError)?.message ?? "\(error)"
            }
        }
        return nil
    }

    /// Reads every download anew, after the daemon said events were missed: one it no longer has was
    /// removed. Any other failure ends this stream (the caller reconnects).
    private func reread(_ client: DaemonClient, _ display: QueueDisplay) async throws {
        for id in ids {
            do {
                take(DownloadManagerEvent(kind: .stateChanged, download: try await client.download(id)), display)
            } catch let error as HaulError where error.code == .unknownDownload {
                guard let last = state.withLock({ $0.downloads[id] }) else { continue }
                take(DownloadManagerEvent(kind: .removed, download: last), display)
            }
        }
        state.withLock { $0.synced = true }
    }

    /// Notes where the stream stands; once it reaches the target, what is known is current.
    private func reached(_ position: EventPosition?, _ display: QueueDisplay) {
        let newlySynced = state.withLock { state -> [DownloadInfo]? in
            guard !state.synced else { return nil }
            // A stream of another run of the daemon (it restarted) began with a reset, read above.
            guard let position, let target, position.run == target.run, position.number < target.number else {
                state.synced = true
                return ids.compactMap { state.downloads[$0] }.filter { !state.seen.contains($0.id) }
            }
            return nil
        }
        // Complete before any event of this command: complete before the command began.
        for info in newlySynced ?? [] where info.state == .completed { display.noteAlreadyComplete(info) }
    }

    private func take(_ event: DownloadManagerEvent, _ display: QueueDisplay) {
        let id = event.download.id
        var info = event.download
        if case .removed = event.kind {
            // Gone from the daemon: over, with nothing saved.
            info.state = .cancelled
            info.error = HaulError(.unknownDownload, "removed from the haul daemon (haul rm)")
        }
        let outcome = state.withLock { state -> (followed: Bool, ends: Bool) in
            guard ids.contains(id) else { return (false, false) }
            if !state.synced { state.seen.insert(id) }
            state.downloads[id] = info
            let ends: Bool
            switch event.kind {
            case .stateChanged, .removed: ends = Self.isOver(info) && state.ended.insert(id).inserted
            case .added, .transfer: ends = false
            }
            return (true, ends)
        }
        guard outcome.followed else { return }
        // A download in this process is seen only from after it was queued: an addition is not news.
        if case .added = event.kind { return }
        display.handle(event)
        if outcome.ends {
            if info.state == .completed {
                display.completedUnseen(info)
            } else {
                // In this process, the transfer's own end comes before the state it leaves: the single
                // download's renderer prints a failure from it.
                display.handleEnd(of: info)
            }
        }
    }
}

/// An event ID of the daemon, `RUN-N`: this run of the daemon and the event's number.
struct EventPosition: Equatable {
    let run: Substring
    let number: UInt64

    init?(_ id: String?) {
        guard let id, let dash = id.lastIndex(of: "-"), let number = UInt64(id[id.index(after: dash)...]) else {
            return nil
        }
        run = id[..<dash]
        self.number = number
    }
}
