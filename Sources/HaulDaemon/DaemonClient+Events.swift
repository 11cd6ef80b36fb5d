import AsyncHTTPClient
import Haul
import NIOCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

extension DaemonClient {
    /// One event of the daemon's stream.
    public enum Event: Sendable {
        /// What happened to a download, as a ``DownloadManager`` in this process would report it.
        case download(DownloadManagerEvent)
        /// The daemon no longer holds the events since the last one received: read again what is shown.
        case reset
    }

    /// The daemon's live events: those after `lastEventID` when given (else from now on), until either
    /// side closes the stream. Returns once the daemon has begun the stream, so no event that happens
    /// after this call returns is missed. The stream ends with ``HaulError/Code/network`` when the
    /// connection is lost; ``lastEventID`` then tells where to go on.
    public func events(after lastEventID: String? = nil) async throws -> EventStream {
        var request = request(.GET, "/events")
        if let lastEventID { request.headers.add(name: "Last-Event-ID", value: lastEventID) }
        let response: HTTPClientResponse
        do {
            response = try await client.execute(request, timeout: .seconds(30))
        } catch {
            throw HaulError(.network, "cannot reach the haul daemon at \(url): \(error)")
        }
        guard response.status == .ok else {
            throw Self.failure(response.status, try await response.body.collect(upTo: 1 << 20))
        }
        return EventStream(body: response.body, url: url)
    }

    /// The events of one stream, parsed from `text/event-stream`.
    public final class EventStream: AsyncSequence, Sendable {
        public typealias Element = Event
        private let body: HTTPClientResponse.Body
        private let url: String
        private let last = LastEventID()

        init(body: HTTPClientResponse.Body, url: String) {
            self.body = body
            self.url = url
        }

        /// The ID of the last event received, to reconnect from.
        public var lastEventID: String? { last.value }

        /// Reads the events in order.
        public func makeAsyncIterator() -> Iterator {
            Iterator(chunks: body.makeAsyncIterator(), url: url, last: last)
        }

        /// Reads the events in order.
        public struct Iterator: AsyncIteratorProtocol {
            var chunks: HTTPClientResponse.Body.AsyncIterator
            let url: String
            let last: LastEventID
            var parser = EventParser()
            var ready: [Event] = []

            /// The next event; `nil` when the daemon ended the stream.
            public mutating func next() async throws -> Event? {
                while ready.isEmpty {
                    let chunk: ByteBuffer?
                    do {
                        chunk = try await chunks.next()
                    } catch {
                        throw HaulError(.network, "lost the haul daemon's event stream at \(url): \(error)")
                    }
                    guard let chunk else { return nil }
                    for message in parser.feed(String(buffer: chunk)) {
                        if let id = message.id { last.value = id }
                        ready += message.events
                    }
                }
                return ready.removeFirst()
            }
        }
    }

    /// The last event ID a stream saw, read by its owner while the iterator runs.
    final class LastEventID: @unchecked Sendable {
        // Written by the one iterator of a stream, read by the task that owns both.
        var value: String?
    }
}

/// Cuts `text/event-stream` into messages and turns each into the events it stands for.
struct EventParser {
    /// One message: its ID and what it says.
    struct Message {
        var id: String?
        var events: [DaemonClient.Event]
    }

    private var pending = ""

    /// The messages `text` completes.
    mutating func feed(_ text: String) -> [Message] {
        pending += text.replacingOccurrences(of: "\r\n", with: "\n")
        var messages: [Message] = []
        while let end = pending.range(of: "\n\n") {
            let block = pending[..<end.lowerBound]
            pending.removeSubrange(..<end.upperBound)
            if let message = Self.message(block) { messages.append(message) }
        }
        return messages
    }

    private static func message(_ block: Substring) -> Message? {
        var id: String?
        var name = "message"
        var data: [Substring] = []
        for line in block.split(separator: "\n", omittingEmptySubsequences: false) where !line.hasPrefix(":") {
            let (field, value) = Self.field(line)
            switch field {
            case "id": id = String(value)
            case "event": name = String(value)
            case "data": data.append(value)
            default: break
            }
        }
        guard id != nil || !data.isEmpty else { return nil }
        return Message(id: id, events: Self.events(name, data.joined(separator: "\n")))
    }

    private static func field(_ line: Substring) -> (Substring, Substring) {
        guard let colon = line.firstIndex(of: ":") else { return (line, "") }
        var value = line[line.index(after: colon)...]
        if value.first == " " { value = value.dropFirst() }
        return (line[..<colon], value)
    }

    /// The event a message of `name` with `data` stands for; none for a name this client does not know.
    static func events(_ name: String, _ data: String) -> [DaemonClient.Event] {
        if name == "reset" { return [.reset] }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        guard let body = try? decoder.decode(DownloadEventBody.self, from: Data(data.utf8)) else { return [] }
        let info = body.download.info
        let kind: DownloadManagerEvent.Kind
        switch name {
        case "added": kind = .added
        case "state": kind = .stateChanged
        case "removed": kind = .removed
        case "progress":
            kind = .transfer(
                .progress(
                    DownloadProgress(
                        bytes: info.bytes, totalBytes: info.totalBytes, bytesPerSecond: info.bytesPerSecond ?? 0,
                        secondsRemaining: info.secondsRemaining, connections: info.openConnections ?? 0)))
        case "started":
            guard let start = body.start else { return [] }
            kind = .transfer(.started(start.start))
        case "restarted":
            guard let restart = body.restart else { return [] }
            let reason =
                RestartReason(name: restart.reason, detail: restart.detail) ?? .untrustedPartial(restart.message)
            kind = .transfer(.restarted(reason))
        case "retrying":
            guard let retry = body.retry else { return [] }
            kind = .transfer(
                .retrying(
                    attempt: retry.attempt, delay: .milliseconds(Int64(retry.delaySeconds * 1000)),
                    error: HaulError(HaulError.Code(retry.error.code), retry.error.message)))
        case "completed":
            guard let result = body.result else { return [] }
            kind = .transfer(.completed(result.result))
        default:
            return []
        }
        return [.download(DownloadManagerEvent(kind: kind, download: info))]
    }
}
