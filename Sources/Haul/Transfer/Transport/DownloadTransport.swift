import AsyncHTTPClient
import NIOCore
import NIOHTTP1
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Sends the HTTP requests of downloads: the one part of a download a transport does.
///
/// Everything else stays Haul's, whichever transport sends the requests: which request to send (the
/// `Range` and `If-Range` a stored download needs), following redirects (so credentials never leave
/// their origin), cookies, the checks of every answer (status, `Content-Range`, validators, lengths,
/// `Content-Digest`, piece hashes), writing the body into the partial file at its offset, retries,
/// stalls, rate limits and the final rename.
///
/// A transport must:
/// - send one `GET` for ``TransportRequest/url`` with ``TransportRequest/headers`` (no cookies,
///   cache or compression of its own; headers a system stack always adds, such as `Accept`, may
///   join them), and not follow redirects: a `3xx` answer is the answer;
/// - hand the answer's status and headers, and its body as it arrives (or a file of it), to the
///   closure ``send(_:receive:)`` takes, and keep the connection until that closure returns;
/// - stop sending when the calling task is cancelled (Haul pauses and retries by cancelling);
/// - say what its failures mean (``failure(of:sending:)``).
///
/// ``DownloaderConfiguration/transport`` is `nil` unless an app gives one: Haul's own HTTP client
/// on SwiftNIO (HTTP/1.1 and HTTP/2, proxies, a cap per host, its own TLS trust) sends the
/// requests then. The `HaulURLSession` module has a transport on `URLSession`.
public protocol DownloadTransport: Sendable {
    /// Refuses a downloader's settings this transport cannot honour, with a ``HaulError`` that says
    /// which (a download with them fails with it rather than going on without them). The default
    /// accepts all.
    func check(_ configuration: DownloaderConfiguration) throws

    /// Sends `request` and gives `receive` its answer (a redirect included); returns what
    /// `receive` returns. The body is read, or left unread, within `receive`: the transport may
    /// close the connection once it returns.
    ///
    /// - Throws: when no answer came; ``failure(of:sending:)`` tells what the error means. A
    ///   failure while the body is read is thrown by the body's iterator.
    func send<Result>(
        _ request: TransportRequest, receive: (TransportResponse) async -> Result
    ) async throws -> Result

    /// What `error`, thrown by ``send(_:receive:)`` or by an answer's body, means for the download.
    /// `request` is the request that failed; for a failure while a body is read, one with the
    /// download's URL and no headers.
    /// The default: a ``HaulError`` with code ``HaulError/Code/network`` or
    /// ``HaulError/Code/timedOut`` is retried, another ``HaulError`` is not, and any other error is
    /// a network failure that is retried.
    func failure(of error: any Error, sending request: TransportRequest) -> TransportFailure

    /// Closes what the transport holds open. ``Downloader/shutdown()`` calls it.
    func shutdown() async throws
}

extension DownloadTransport {
    /// Accepts every setting.
    public func check(_ configuration: DownloaderConfiguration) throws {}

    /// ``HaulError``s by their code, and any other error as a network failure that is retried.
    public func failure(of error: any Error, sending request: TransportRequest) -> TransportFailure {
        if let error = error as? HaulError { return TransportFailure(error) }
        let host = request.url.host ?? request.url.absoluteString
        return .retryable(HaulError(.network, "transfer from \(host) failed: \(error)", underlying: error))
    }
}

/// One request of a download, as Haul asks a ``DownloadTransport`` to send it.
public struct TransportRequest: Sendable {
    /// Where the request goes: the download's URL, a mirror, or where a redirect led.
    public let url: URL
    /// The request's headers, in order: every one is sent as it is (`Range`, `If-Range`,
    /// `User-Agent`, `Accept-Encoding: identity`, the caller's own and its cookies).
    public var headers: [(name: String, value: String)] { fields.map { ($0.name, $0.value) } }
    /// Which of the download's connections sends it, from 0: requests with different numbers may
    /// run at the same time, over different connections unless HTTP/2 shares one.
    public let connection: Int
    /// Which networks the request may use (``DownloaderConfiguration/networkAccess``).
    public let networkAccess: NetworkAccess
    /// Names the download the request belongs to, the same in every run of the app: its URL and
    /// where its file goes. A transport whose transfers go on while the app is not running matches
    /// them to the download's requests on the next run by it.
    public let download: String
    /// The headers as Haul's own client takes them.
    let fields: HTTPHeaders
    /// Tells the download that the server is heard from (see ``noteActivity()``).
    let activity: (@Sendable () -> Void)?

    /// A request for `url` with `headers`, sent by connection `connection` over the networks
    /// `networkAccess` allows.
    public init(
        url: URL, headers: [(name: String, value: String)], connection: Int = 0,
        networkAccess: NetworkAccess = NetworkAccess(), download: String = ""
    ) {
        self.init(
            url: url, fields: HTTPHeaders(headers.map { ($0.name, $0.value) }), connection: connection,
            networkAccess: networkAccess, download: download, activity: nil)
    }

    init(
        url: URL, fields: HTTPHeaders, connection: Int, networkAccess: NetworkAccess = NetworkAccess(),
        download: String = "", activity: (@Sendable () -> Void)?
    ) {
        self.url = url
        self.fields = fields
        self.connection = connection
        self.networkAccess = networkAccess
        self.download = download
        self.activity = activity
    }

    /// Tells Haul that the server is sending this request's answer while Haul cannot see its bytes
    /// yet (a download task writing the body to a file of its own). Haul takes a request that it
    /// hears nothing of for ``DownloaderConfiguration/Timeouts/stall`` for a stalled one; a transport
    /// that holds the body back calls this as bytes arrive. One that streams the body needs not.
    public func noteActivity() { activity?() }

    /// The value of the first header named `name` (case does not matter).
    public func header(_ name: String) -> String? { fields.first(name: name) }
}

/// The answer to a ``TransportRequest``: its status and headers, and its body.
public struct TransportResponse: Sendable {
    /// The status code: `200`, `206`, a redirect, an error.
    public let status: Int
    /// The answer's headers, in order.
    public var headers: [(name: String, value: String)] { fields.map { ($0.name, $0.value) } }
    /// The major HTTP version the answer came over: `2` when it shares its connection with other
    /// requests (a cap on connections per host then counts that connection once).
    public let httpVersion: Int
    /// The body, as it arrives.
    public let body: TransportBody
    let fields: HTTPHeaders

    /// An answer with `status`, `headers` and `body`, over HTTP/`httpVersion`.
    public init(status: Int, headers: [(name: String, value: String)], httpVersion: Int = 1, body: TransportBody) {
        self.init(
            status: status, fields: HTTPHeaders(headers.map { ($0.name, $0.value) }), httpVersion: httpVersion,
            body: body)
    }

    init(status: Int, fields: HTTPHeaders, httpVersion: Int, body: TransportBody) {
        self.status = status
        self.fields = fields
        self.httpVersion = httpVersion
        self.body = body
    }

    /// The value of the first header named `name` (case does not matter).
    public func header(_ name: String) -> String? { fields.first(name: name) }
}

/// What a transport's failure means for a download.
public enum TransportFailure: Sendable {
    /// What `error` means by its code: ``HaulError/Code/network`` and ``HaulError/Code/timedOut``
    /// are retried, any other code is final.
    public init(_ error: HaulError) {
        self = Self.retriedCodes.contains(error.code) ? .retryable(error) : .fatal(error)
    }

    /// The codes of failures worth another attempt.
    static let retriedCodes: Set<HaulError.Code> = [.network, .timedOut]

    /// Retried after a delay, up to ``DownloaderConfiguration/Retry/maximumRetries`` (no answer, a
    /// connection lost, a timeout).
    case retryable(HaulError)
    /// The server refused the connection: retried only when
    /// ``DownloaderConfiguration/Retry/retriesRefusedConnections`` says so.
    case refused(HaulError)
    /// Not retried: the download fails with the error (a certificate that is not trusted, a URL the
    /// transport cannot send).
    case fatal(HaulError)
    /// The request was stopped because Haul cancelled it (the transport's own cancellation error).
    case cancelled
}

/// The body of a ``TransportResponse``: its bytes in the order they arrive, as `ByteBuffer`s.
///
/// A transport that receives the body as it comes makes one from an `AsyncThrowingStream`; one
/// that receives it as a finished file (a `URLSession` download task) makes one with
/// ``file(atPath:removingIt:)``, and Haul reads it into the partial file at its offset with the
/// same checks.
public struct TransportBody: AsyncSequence, Sendable {
    /// A chunk of the body.
    public typealias Element = ByteBuffer

    enum Source: Sendable {
        case client(HTTPClientResponse.Body)
        case stream(AsyncThrowingStream<ByteBuffer, any Error>)
        case file(path: @Sendable () async throws -> String, remove: Bool)
        /// A body read whole before the answer was handed over; `cut`: it was longer than what is
        /// read whole, and reading it fails.
        case whole(ByteBuffer, cut: Bool)
    }

    let source: Source

    init(_ body: HTTPClientResponse.Body) { source = .client(body) }

    /// A body read whole (see ``WholeAnswerTransport``); one that was `cut` fails when read.
    init(whole body: ByteBuffer, cut: Bool) { source = .whole(body, cut: cut) }

    /// The body a stream yields; the stream's error is the body's failure.
    public init(_ stream: AsyncThrowingStream<ByteBuffer, any Error>) { source = .stream(stream) }

    /// The body held in the file at `path`, read in blocks; with `removingIt`, the file is removed
    /// once the body is read to its end or fails.
    public static func file(atPath path: String, removingIt: Bool) -> TransportBody {
        TransportBody(source: .file(path: { path }, remove: removingIt))
    }

    /// A body that will be in a file: `path` waits until the file is complete and returns where it
    /// is (or throws the transfer's failure). A transport that knows the answer's head before its
    /// body is stored (a download task's response) gives the head at once and the file this way.
    public static func file(removingIt: Bool, whenReady path: @escaping @Sendable () async throws -> String)
        -> TransportBody
    {
        TransportBody(source: .file(path: path, remove: removingIt))
    }

    private init(source: Source) { self.source = source }

    /// Reads and drops up to `limit` bytes, so that a connection can be used again. A body still to
    /// come as a file is left alone: its transport stops its transfer once the answer is let go.
    func discard(upTo limit: Int) async {
        if case .file = source { return }
        var count = 0
        do {
            for try await chunk in self {
                count += chunk.readableBytes
                if count >= limit { break }
            }
        } catch {}
    }

    /// Reads the body, chunk after chunk.
    public func makeAsyncIterator() -> Iterator {
        switch source {
        case .client(let body): Iterator(client: body.makeAsyncIterator())
        case .stream(let stream): Iterator(stream: stream.makeAsyncIterator())
        case .file(let path, let remove): Iterator(file: FileChunks(path: path, remove: remove))
        case .whole(let body, let cut): Iterator(whole: cut ? nil : body, cut: cut)
        }
    }

    /// Reads a ``TransportBody``.
    public struct Iterator: AsyncIteratorProtocol {
        // One of the first three is set, or none for a body read whole. Each is advanced in place:
        // the client's, on every chunk of Haul's own transport, is neither copied out nor stored back.
        var client: HTTPClientResponse.Body.AsyncIterator?
        var stream: AsyncThrowingStream<ByteBuffer, any Error>.AsyncIterator?
        var file: FileChunks?
        /// A body read whole, until it is given.
        var whole: ByteBuffer?
        /// The body read whole was cut: reading it fails.
        var cut = false

        /// The next chunk, or `nil` at the end of the body.
        public mutating func next() async throws -> ByteBuffer? {
            if client != nil { return try await client?.next() }
            if stream != nil { return try await stream?.next() }
            if file != nil { return try await file?.next() }
            if cut { throw WholeReply.TooLong() }
            defer { whole = nil }
            return whole?.readableBytes == 0 ? nil : whole
        }
    }
}

/// Reads a body held in a file, a block at a time, on the I/O threads.
final class FileChunks: Sendable {
    private struct State {
        var path: String?
        var descriptor: Int32?
        var offset: Int64 = 0
        var done = false
    }

    private let ready: @Sendable () async throws -> String
    private let remove: Bool
    private let state = Mutex(State())
    static let chunkSize = 1 << 20

    init(path: @escaping @Sendable () async throws -> String, remove: Bool) {
        self.ready = path
        self.remove = remove
    }

    deinit { finish() }

    func next() async throws -> ByteBuffer? {
        do {
            let known = state.withLock { $0.path }
            let path: String
            if let known {
                path = known
            } else {
                path = try await ready()
                state.withLock { $0.path = path }
            }
            let chunk = try await BlockingIO.shared.run { [self] () -> [UInt8]? in
                try state.withLock { state -> [UInt8]? in
                    if state.done { return nil }
                    let descriptor = try state.descriptor ?? POSIX.open(path, flags: O_RDONLY)
                    state.descriptor = descriptor
                    let bytes = try POSIX.read(descriptor, count: Self.chunkSize, at: state.offset, path: path)
                    state.offset += Int64(bytes.count)
                    return bytes.isEmpty ? nil : bytes
                }
            }
            guard let chunk else {
                finish()
                return nil
            }
            return ByteBuffer(bytes: chunk)
        } catch {
            finish()
            throw error
        }
    }

    /// Closes the file, and removes it when asked to.
    private func finish() {
        let ended = state.withLock { state -> (descriptor: Int32?, path: String?)? in
            guard !state.done else { return nil }
            state.done = true
            defer { state.descriptor = nil }
            return (state.descriptor, state.path)
        }
        guard let ended else { return }
        if let descriptor = ended.descriptor { POSIX.close(descriptor) }
        if remove, let path = ended.path { try? POSIX.unlink(path) }
    }
}
