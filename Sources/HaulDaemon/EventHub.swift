import Haul
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The daemon's live events, numbered, kept in a bounded ring for replay and sent to every listener.
///
/// Each event is one Server-Sent Event: `id` (`RUN-N`: this run of the daemon, and a number
/// increasing from 1), `event` (`added`, `state`,
/// `progress`, `retrying`, `removed`) and `data` (the download as the API shows it, plus the retry's
/// details). A client that reconnects with `Last-Event-ID` gets every event after that one while the
/// ring still holds it; otherwise a `reset` event first, telling it to load the list again. Progress
/// comes at most once per download per progress interval (the manager's). A listener that falls
/// more than ``listenerBuffer`` events behind is cut off: reconnecting replays what it missed.
final class EventHub: Sendable {
    /// One event, ready to send.
    struct Event: Sendable, Equatable {
        let id: UInt64
        let name: String
        /// One line of JSON.
        let data: String
    }

    /// What a new listener gets first: the events it missed, or a reset.
    enum Start: Sendable, Equatable {
        case replay([Event])
        case reset
    }

    static let listenerBuffer = 4096
    let capacity: Int
    /// This run of the daemon: event numbers of another run mean nothing here.
    let run: String

    private struct State {
        var ring: [Event] = []
        /// Index of the oldest event in `ring` once it is full.
        var head = 0
        var lastID: UInt64 = 0
        var nextListener = 0
        var listeners: [Int: AsyncStream<Event>.Continuation] = [:]
        var closed = false
    }

    private let state = Mutex(State())

    init(capacity: Int = 10_000) {
        self.capacity = max(1, capacity)
        var generator = SystemRandomNumberGenerator()
        run = String(UInt32.random(in: 0...UInt32.max, using: &generator), radix: 36)
    }

    /// The event in the `text/event-stream` format.
    func text(_ event: Event) -> String { "id: \(run)-\(event.id)\nevent: \(event.name)\ndata: \(event.data)\n\n" }

    /// The number in a `Last-Event-ID` of this run; `nil` for one of another run or one that is not
    /// an ID of the hub's (the client missed everything: it gets a reset).
    func number(ofLastEventID text: String) -> UInt64? {
        let parts = text.split(separator: "-")
        guard parts.count == 2, parts[0] == run, let number = UInt64(parts[1]) else { return nil }
        return number
    }

    /// Publishes a manager event, if the API shows it.
    func publish(_ event: DownloadManagerEvent) {
        guard let (name, data) = Self.describe(event) else { return }
        publish(name, data)
    }

    /// Numbers an event, keeps it and sends it to every listener.
    func publish(_ name: String, _ data: String) {
        let (event, targets) = state.withLock { state -> (Event, [(Int, AsyncStream<Event>.Continuation)]) in
            state.lastID += 1
            let event = Event(id: state.lastID, name: name, data: data)
            if state.ring.count < capacity {
                state.ring.append(event)
            } else {
                state.ring[state.head] = event
                state.head = (state.head + 1) % capacity
            }
            return (event, Array(state.listeners))
        }
        for (key, continuation) in targets {
            if case .dropped = continuation.yield(event) {
                // Too far behind: it reconnects and replays what it missed.
                continuation.finish()
                _ = state.withLock { $0.listeners.removeValue(forKey: key) }
            }
        }
    }

    /// A listener's events: first what it missed since `lastEventID` (or a reset when the ring no
    /// longer holds them), then every new event until the hub closes or the listener goes; and the
    /// number of the last event published when it began listening (every event after it comes in
    /// the stream).
    /// - Parameter lastEventID: `nil` for a client that has seen nothing of this run: a new one
    ///   (`fresh`) gets only new events, a returning one (`Last-Event-ID` of another run) a reset.
    func listen(after lastEventID: UInt64?, fresh: Bool = false) -> (Start, UInt64, AsyncStream<Event>) {
        let (stream, continuation) = AsyncStream<Event>.makeStream(
            bufferingPolicy: .bufferingOldest(Self.listenerBuffer))
        let (start, position, key) = state.withLock { state -> (Start, UInt64, Int?) in
            let ordered = Array(state.ring[state.head...] + state.ring[..<state.head])
            let start: Start
            if let lastEventID {
                let oldest = ordered.first?.id ?? state.lastID + 1
                if lastEventID > state.lastID || lastEventID + 1 < oldest {
                    start = .reset
                } else {
                    start = .replay(ordered.filter { $0.id > lastEventID })
                }
            } else {
                start = fresh ? .replay([]) : .reset
            }
            guard !state.closed else { return (start, state.lastID, nil) }
            state.nextListener += 1
            state.listeners[state.nextListener] = continuation
            return (start, state.lastID, state.nextListener)
        }
        if let key {
            continuation.onTermination = { [weak self] _ in
                _ = self?.state.withLock { $0.listeners.removeValue(forKey: key) }
            }
        } else {
            continuation.finish()
        }
        return (start, position, stream)
    }

    /// The ID of the last event published.
    var lastID: UInt64 { state.withLock { $0.lastID } }

    /// The last event's ID as clients see it (`RUN-N`; `RUN-0` before the first event).
    var lastEventID: String { "\(run)-\(lastID)" }

    /// Ends every listener's stream.
    func close() {
        let listeners = state.withLock { state -> [AsyncStream<Event>.Continuation] in
            state.closed = true
            defer { state.listeners = [:] }
            return Array(state.listeners.values)
        }
        for listener in listeners { listener.finish() }
    }

    /// The SSE name and JSON data of a manager event; `nil` for those the API does not show.
    static func describe(_ event: DownloadManagerEvent) -> (String, String)? {
        let download = DownloadBody(event.download)
        switch event.kind {
        case .added:
            return ("added", Self.json(DownloadEventBody(download: download)))
        case .stateChanged:
            return ("state", Self.json(DownloadEventBody(download: download)))
        case .removed:
            return ("removed", Self.json(DownloadEventBody(download: download)))
        case .transfer(.progress):
            return ("progress", Self.json(DownloadEventBody(download: download)))
        case .transfer(.started(let start)):
            return ("started", Self.json(DownloadEventBody(download: download, start: start)))
        case .transfer(.restarted(let reason)):
            return ("restarted", Self.json(DownloadEventBody(download: download, restart: RestartBody(reason))))
        case .transfer(.completed(let result)):
            return ("completed", Self.json(DownloadEventBody(download: download, result: result)))
        case .transfer(.retrying(let attempt, let delay, let error)):
            let retry = RetryBody(
                attempt: attempt,
                delaySeconds: Double(delay.components.seconds)
                    + Double(delay.components.attoseconds) / 1e18,
                error: .init(code: error.code.name, message: error.message))
            return ("retrying", Self.json(DownloadEventBody(download: download, retry: retry)))
        case .transfer(.mirror(let report)):
            return ("mirror", Self.json(DownloadEventBody(download: download, mirror: report)))
        case .transfer(.failed):
            // The state event that follows carries the error.
            return nil
        }
    }

    private static func json(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        // JSON without pretty printing has no newline, so the event's data is one line.
        return (try? encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }
}

/// The data of an event: the download as it stands, and the details of a start, restart, retry or
/// completion.
struct DownloadEventBody: Codable, Sendable {
    var download: DownloadBody
    var retry: RetryBody?
    var start: DownloadStart?
    var restart: RestartBody?
    var result: DownloadResult?
    var mirror: MirrorReport?
}

/// Why a download threw its partial data away and started again.
struct RestartBody: Codable, Sendable {
    /// The reason's name, e.g. `remoteChanged`.
    var reason: String
    var detail: String?
    /// The reason for people.
    var message: String

    init(_ reason: RestartReason) {
        (self.reason, detail) = reason.parts
        message = reason.description
    }
}

/// A retry a download waits for.
struct RetryBody: Codable, Sendable {
    var attempt: Int
    var delaySeconds: Double
    var error: ErrorResponse.Detail
}
