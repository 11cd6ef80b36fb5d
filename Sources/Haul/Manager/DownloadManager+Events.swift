import Synchronization

extension DownloadManager {
    /// Events of every download: additions, state changes, transfer progress (at most one progress
    /// event per download per ``Configuration/progressInterval``) and removals. The sequence ends
    /// when the manager is closed.
    public nonisolated func events() -> AsyncStream<DownloadManagerEvent> {
        subscribers.subscribe(to: nil)
    }

    /// Events of one download, starting with its current state. The sequence ends when the download
    /// completes, is cancelled or removed, or the manager is closed; it ends at once for an unknown ID
    /// or a download that is already over.
    public func events(for id: DownloadID) -> AsyncStream<DownloadManagerEvent> {
        try? learn(id)
        guard let entry = entries[id] else {
            return AsyncStream { $0.finish() }
        }
        let current = DownloadManagerEvent(kind: .stateChanged, download: entry.info)
        if entry.state == .completed || entry.state == .cancelled {
            return AsyncStream {
                $0.yield(current)
                $0.finish()
            }
        }
        return subscribers.subscribe(to: id, first: current)
    }

    /// Sends an event to those listening, and ends the streams of a download that is over.
    func publish(_ kind: DownloadManagerEvent.Kind, _ entry: Entry) {
        let event = DownloadManagerEvent(kind: kind, download: entry.info)
        let ends: Bool
        switch kind {
        case .removed: ends = true
        case .stateChanged: ends = entry.state == .completed || entry.state == .cancelled
        default: ends = false
        }
        subscribers.send(event, ending: ends)
    }
}

/// The continuations of the event streams, reachable without the actor so a stream can be made and
/// dropped synchronously.
final class Subscribers: Sendable {
    private struct Subscriber {
        let download: DownloadID?
        let continuation: AsyncStream<DownloadManagerEvent>.Continuation
    }

    private struct State {
        var next = 0
        var subscribers: [Int: Subscriber] = [:]
        var closed = false
    }

    private let state = Mutex(State())

    func subscribe(to download: DownloadID?, first: DownloadManagerEvent? = nil) -> AsyncStream<DownloadManagerEvent> {
        let (stream, continuation) = AsyncStream<DownloadManagerEvent>.makeStream()
        if let first { continuation.yield(first) }
        let key = state.withLock { state -> Int? in
            guard !state.closed else { return nil }
            state.next += 1
            state.subscribers[state.next] = Subscriber(download: download, continuation: continuation)
            return state.next
        }
        guard let key else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.subscribers.removeValue(forKey: key) }
        }
        return stream
    }

    func send(_ event: DownloadManagerEvent, ending: Bool) {
        let targets = state.withLock { state -> [(AsyncStream<DownloadManagerEvent>.Continuation, Bool)] in
            var targets: [(AsyncStream<DownloadManagerEvent>.Continuation, Bool)] = []
            for (key, subscriber) in state.subscribers
            where subscriber.download == nil || subscriber.download == event.download.id {
                let finishes = ending && subscriber.download != nil
                targets.append((subscriber.continuation, finishes))
                if finishes { state.subscribers[key] = nil }
            }
            return targets
        }
        for (continuation, finishes) in targets {
            continuation.yield(event)
            if finishes { continuation.finish() }
        }
    }

    /// How many streams are open.
    var count: Int { state.withLock { $0.subscribers.count } }

    func finishAll() {
        let all = state.withLock { state -> [Subscriber] in
            state.closed = true
            defer { state.subscribers = [:] }
            return Array(state.subscribers.values)
        }
        for subscriber in all { subscriber.continuation.finish() }
    }
}
