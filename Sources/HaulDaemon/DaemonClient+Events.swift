import AsyncHTTPClient
import Haul
import NIOCore
import Synchronization

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
        /// Where the stream stands, sent as it opens: every event up to this ID has been delivered.
        case position(String)
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

    /// The events of one stream, parsed from `text/event-stream`. A stream is read once.
    public final class EventStream: AsyncSequence, Sendable {
        /// What the stream yields.
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
                    for message in parser.feed(chunk.readableBytesView) {
                        if let id = message.id {
                            last.value = id
                            if message.events.isEmpty { ready.append(.position(id)) }
                        }
                        ready += message.events
                    }
                }
                return ready.removeFirst()
            }
        }
    }

    /// The last event ID a stream saw.
    final class LastEventID: Sendable {
        private let stored = Mutex<String?>(nil)

        var value: String? {
            get { stored.withLock { $0 } }
            set { stored.withLock { $0 = newValue } }
        }
    }
}

/// Cuts `text/event-stream` into messages and turns each into the events it stands for. Lines end
/// with LF, CR LF or CR, wherever the chunks are cut; each line is decoded as UTF-8 once whole.
struct EventParser {
    /// One message: its ID and what it says.
    struct Message {
        var id: String?
        var events: [DaemonClient.Event]
    }

    private var line: [UInt8] = []
    /// The last byte was a CR: an LF right after it belongs to the same line end.
    private var afterCR = false
    private var fields = Fields()

    private struct Fields {
        var id: String?
        var name = "message"
        var data: [String] = []
    }

    /// The messages `bytes` completes.
    mutating func feed(_ bytes: some Sequence<UInt8>) -> [Message] {
        var messages: [Message] = []
        for byte in bytes {
            if afterCR {
                afterCR = false
                if byte == UInt8(ascii: "\n") { continue }
            }
            switch byte {
            case UInt8(ascii: "\n"), UInt8(ascii: "\r"):
                afterCR = byte == UInt8(ascii: "\r")
                if let message = endLine() { messages.append(message) }
            default:
                line.append(byte)
            }
        }
        return messages
    }

    /// Takes in the line read; a blank line ends a message.
    private mutating func endLine() -> Message? {
        defer { line = [] }
        guard !line.isEmpty else {
            defer { fields = Fields() }
            guard fields.id != nil || !fields.data.isEmpty else { return nil }
            return Message(id: fields.id, events: Self.events(fields.name, fields.data.joined(separator: "\n")))
        }
        guard line.first != UInt8(ascii: ":") else { return nil }
        let text = String(decoding: line, as: UTF8.self)
        let field: Substring
        var value: Substring = ""
        if let colon = text.firstIndex(of: ":") {
            field = text[..<colon]
            value = text[text.index(after: colon)...]
            if value.first == " " { value = value.dropFirst() }
        } else {
            field = Substring(text)
        }
        switch field {
        case "id": fields.id = String(value)
        case "event": fields.name = String(value)
        case "data": fields.data.append(String(value))
        default: break
        }
        return nil
    }

    /// The event a message of `name` with `data` stands for; none for a name this client does not
    /// know. One it cannot read counts as a reset: what it said is read anew.
    static func events(_ name: String, _ data: String) -> [DaemonClient.Event] {
        if name == "reset" { return [.reset] }
        guard Self.known.contains(name) else { return [] }
        let decoder = JSONDecoder()
        decoder.userInfo[DownloadRequest.describesDownload] = true
        decoder.dateDecodingStrategy = .iso8601
        guard let body = try? decoder.decode(DownloadEventBody.self, from: Data(data.utf8)) else { return [.reset] }
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
            guard let start = body.start else { return [.reset] }
            kind = .transfer(.started(start))
        case "restarted":
            // A reason this client does not know (a newer daemon's) is not shown rather than misnamed.
            guard let restart = body.restart, let reason = RestartReason(name: restart.reason, detail: restart.detail)
            else { return [] }
            kind = .transfer(.restarted(reason))
        case "retrying":
            guard let retry = body.retry else { return [.reset] }
            kind = .transfer(
                .retrying(
                    attempt: retry.attempt, delay: .milliseconds(Int64(retry.delaySeconds * 1000)),
                    error: HaulError(HaulError.Code(retry.error.code), retry.error.message)))
        case "mirror":
            guard let mirror = body.mirror else { return [.reset] }
            kind = .transfer(.mirror(mirror))
        case "completed":
            guard let result = body.result else { return [.reset] }
            kind = .transfer(.completed(result))
        default:
            return []
        }
        return [.download(DownloadManagerEvent(kind: kind, download: info))]
    }

    private static let known: Set<String> = [
        "added", "state", "removed", "progress", "started", "restarted", "retrying", "mirror", "completed",
    ]
}
