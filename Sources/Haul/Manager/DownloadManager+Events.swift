import Synchronization

extension DownloadManager {
    /// Events of every download: additions, state changes, transfer progress (at most one progress
    /// event per download per ``Configuration/progressInterval``) and removals. The sequence ends
    /// when the manager is closed.
    public nonisolated func events() -> AsyncStream<DownloadManagerEvent> {
        subscribers.subscribe(to: nil)
    }

    /// ``events()`` for a reader that may fall behind: past `count` events not read, the oldest go.
    package nonisolated func events(keepingNewest count: Int) -> AsyncStream<DownloadManagerEvent> {
        subscribers.subscribe(to: nil, buffering: .bufferingNewest(count))
    }

    /// ``events()`` for a reader that wants only some: `wants` tells, from an event's kind and the
    /// state of its download after it, whether the reader hears the event. An event no reader wants
    /// is not made: a reader that shows only failures spares the manager the events of every
    /// download that goes well.
    package nonisolated func events(
        where wants: @escaping @Sendable (DownloadManagerEvent.Kind, DownloadState) -> Bool
    ) -> AsyncStream<DownloadManagerEvent> {
        subscribers.subscribe(to: nil, wants: wants)
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

    /// Publishes what another worker of a fleet changed, as read from the store: a download added
    /// or changed (progress, while it still runs), or removed. What this worker runs it has told
    /// already.
    func othersChanged(_ notice: QueueNotice) {
        guard notice.sender != claim.name else { return }
        let added = Set(notice.added)
        let read = (notice.added + notice.changed).filter { jobs[$0] == nil }
        for start in stride(from: 0, to: read.count, by: 500) {
            guard let records = try? store.downloads(ids: Array(read[start..<min(read.count, start + 500)])) else {
                continue
            }
            for record in records {
                let entry = listed(record)
                let id = entry.id
                // Running on the same worker as last told: progress; anything else is a change.
                let runningOn = othersRunning[id]
                othersRunning[id] = entry.state == .running ? record.owner ?? "" : nil
                if added.contains(id) {
                    publish(.added, entry, fromAnotherWorker: true)
                    // Read once it had started (or ended already): that is told as well, as a worker
                    // told of its start or end on its own would have been.
                    if entry.state != .queued && entry.state != .paused {
                        publish(.stateChanged, entry, fromAnotherWorker: true)
                    }
                } else if entry.state == .running && runningOn == record.owner {
                    let progress = DownloadProgress(
                        bytes: record.bytes, totalBytes: record.totalBytes, bytesPerSecond: record.bytesPerSecond ?? 0,
                        secondsRemaining: nil, connections: 0)
                    publish(.transfer(.progress(progress)), entry, fromAnotherWorker: true)
                } else {
                    publish(.stateChanged, entry, fromAnotherWorker: true)
                }
            }
        }
        for id in notice.removed where jobs[id] == nil {
            othersRunning[id] = nil
            // Only its ID is left to tell.
            var gone = StoredDownload(
                key: "", definition: DownloadRequest(url: "", destination: .directory("/")), destination: nil,
                priority: 0, owner: nil, now: 0)
            gone.id = id.rawValue
            publish(.removed, entries[id] ?? Entry(record: gone), fromAnotherWorker: true)
        }
    }

    /// Sends an event to those listening, and ends the streams of a download that is over.
    func publish(_ kind: DownloadManagerEvent.Kind, _ entry: Entry, fromAnotherWorker: Bool = false) {
        let ends: Bool
        switch kind {
        case .removed: ends = true
        case .stateChanged: ends = entry.state == .completed || entry.state == .cancelled
        default: ends = false
        }
        subscribers.send(kind, entry.state, of: entry.id, ending: ends) {
            DownloadManagerEvent(kind: kind, download: entry.info, isFromAnotherWorker: fromAnotherWorker)
        }
    }
}

/// The continuations of the event streams, reachable without the actor so a stream can be made and
/// dropped synchronously.
final class Subscribers: Sendable {
    private struct Subscriber {
        let download: DownloadID?
        /// Which events it hears, by kind and the download's state after them (`nil`: all).
        let wants: (@Sendable (DownloadManagerEvent.Kind, DownloadState) -> Bool)?
        let continuation: AsyncStream<DownloadManagerEvent>.Continuation

        func hears(_ kind: DownloadManagerEvent.Kind, _ state: DownloadState, of id: DownloadID) -> Bool {
            guard download == nil || download == id else { return false }
            return wants?(kind, state) ?? true
        }
    }

    private struct State {
        var next = 0
        var subscribers: [Int: Subscriber] = [:]
        var closed = false
    }

    private let state = Mutex(State())

    /// A stream of the events of `download` (`nil`: of every download) that `wants` lets through
    /// (`nil`: all), starting with `first`.
    func subscribe(
        to download: DownloadID?, first: DownloadManagerEvent? = nil,
        wants: (@Sendable (DownloadManagerEvent.Kind, DownloadState) -> Bool)? = nil,
        buffering: AsyncStream<DownloadManagerEvent>.Continuation.BufferingPolicy = .unbounded
    ) -> AsyncStream<DownloadManagerEvent> {
        let (stream, continuation) = AsyncStream<DownloadManagerEvent>.makeStream(bufferingPolicy: buffering)
        if let first { continuation.yield(first) }
        let key = state.withLock { state -> Int? in
            guard !state.closed else { return nil }
            state.next += 1
            state.subscribers[state.next] = Subscriber(
                download: download, wants: wants, continuation: continuation)
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

    /// Sends the event `make` makes, of `kind` of download `id` (in `downloadState` after it), to the
    /// streams that hear it, and ends those of that one download when `ending`. The event is made
    /// only when a stream hears it.
    func send(
        _ kind: DownloadManagerEvent.Kind, _ downloadState: DownloadState, of id: DownloadID, ending: Bool,
        _ make: () -> DownloadManagerEvent
    ) {
        let targets = state.withLock { state -> [(AsyncStream<DownloadManagerEvent>.Continuation, Bool)] in
            var targets: [(AsyncStream<DownloadManagerEvent>.Continuation, Bool)] = []
            for (key, subscriber) in state.subscribers where subscriber.hears(kind, downloadState, of: id) {
                let finishes = ending && subscriber.download != nil
                targets.append((subscriber.continuation, finishes))
                if finishes { state.subscribers[key] = nil }
            }
            return targets
        }
        guard !targets.isEmpty else { return }
        let event = make()
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
