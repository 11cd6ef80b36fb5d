import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import Synchronization

/// An HTTP server on 127.0.0.1 that serves generated files, misbehaves on request, and remembers
/// what it was asked. It speaks HTTP/1.1 in the clear, or over TLS with HTTP/2 offered by ALPN
/// (see ``Transport``).
///
/// ```swift
/// try await HaulTestServer.withRunning { server in
///     server.add("/file", TestResource(name: "file", size: 1 << 20))
///     server.script("/file", [[.closeAfter(bytes: 1000)], []])
///     // download server.url("/file") …
///     #expect(server.requests(for: "/file")[1].header("range") == "bytes=1000-")
/// }
/// ```
public final class HaulTestServer: Sendable {
    /// A request as the server received it.
    public struct RecordedRequest: Sendable {
        public let method: String
        public let uri: String
        public let headers: [(name: String, value: String)]
        /// Which connection carried it, counting from 1. HTTP/2 streams carry their connection's number.
        public let connection: Int
        /// `HTTP/1.1` or `HTTP/2`.
        public let version: String
        /// The request's body (a webhook's POST), empty for most requests.
        public var body: [UInt8] = []

        public var path: String { String(uri.split(separator: "?", maxSplits: 1).first ?? "") }

        /// The first value of a header, case-insensitively.
        public func header(_ name: String) -> String? {
            headers.first { $0.name.lowercased() == name.lowercased() }?.value
        }
    }

    struct State {
        var resources: [String: TestResource] = [:]
        var scripts: [String: [[Fault]]] = [:]
        var standingFaults: [String: [Fault]] = [:]
        var requests: [RecordedRequest] = []
        var openConnections = 0
        var maximumOpenConnections = 0
        var connectionsAccepted = 0
        /// Requests being answered now: from their head's arrival until their answer is sent or fails.
        var requestsAnswering = 0
        var maximumRequestsAnswering = 0
        /// Requests of each path being answered now, and the most there were at once.
        var answeringByPath: [String: Int] = [:]
        var maximumAnsweringByPath: [String: Int] = [:]
        /// Body bytes written in answer to each request, indexed like `requests`.
        var bodyBytesSent: [Int64] = []
        /// The most body bytes per second the whole server sends, over all its connections.
        var bandwidth: Int?
        /// When the bandwidth is free again for the next chunk.
        var bandwidthFree: ContinuousClock.Instant?
    }

    /// How clients reach the server.
    public enum Transport: Sendable {
        /// HTTP/1.1 without TLS (`http://`).
        case plain
        /// TLS (`https://`) with a certificate signed by ``certificateAuthorityPEM``, offering HTTP/2
        /// and HTTP/1.1 by ALPN.
        case tls
        /// TLS offering only HTTP/1.1.
        case tlsHTTP1Only
    }

    /// The certificate authority that signed the server's TLS certificate (PEM): what a client
    /// must trust to reach a ``Transport/tls`` server.
    public static let certificateAuthorityPEM = TestCertificates.authorityPEM

    let state = Mutex(State())
    /// The port the server listens on.
    public let port: Int
    public let transport: Transport

    private init(port: Int, transport: Transport) {
        self.port = port
        self.transport = transport
    }

    /// A request/response channel: an HTTP/1.1 connection or one HTTP/2 stream.
    typealias HTTPChannel = NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>

    /// An accepted connection, before TLS has told which protocol it speaks (with the connection
    /// itself, to close it when its client never finishes the handshake).
    enum Accepted: Sendable {
        case http1(HTTPChannel)
        case negotiated(
            EventLoopFuture<
                NIONegotiatedHTTPVersion<
                    HTTPChannel, (any Channel, NIOHTTP2Handler.AsyncStreamMultiplexer<HTTPChannel>)
                >
            >,
            any Channel
        )
    }

    /// An accepted connection on its way to a handler. One the stopping server drops before any
    /// handler took it (a client opened it as the test ended) is closed here: a dropped async
    /// channel would end the process ("Deinited NIOAsyncWriter without calling finish()").
    final class Arrival: Sendable {
        private let accepted: Accepted
        private let taken = Atomic<Bool>(false)

        init(_ accepted: Accepted) { self.accepted = accepted }

        /// The connection, for its handler.
        func take() -> Accepted {
            taken.store(true, ordering: .relaxed)
            return accepted
        }

        deinit {
            guard !taken.load(ordering: .relaxed) else { return }
            switch accepted {
            case .http1(let connection):
                Task { try? await connection.executeThenClose { _, _ in } }
            case .negotiated(let negotiation, _):
                negotiation.whenSuccess { negotiated in
                    switch negotiated {
                    case .http1_1(let connection): Task { try? await connection.executeThenClose { _, _ in } }
                    case .http2((let connection, _)): connection.close(promise: nil)
                    }
                }
            }
        }
    }

    /// Starts a server, runs `body` with it, and stops it when `body` returns or throws.
    public static func withRunning<Result: Sendable>(
        transport: Transport = .plain,
        _ body: @Sendable (HaulTestServer) async throws -> Result
    ) async throws -> Result {
        let tls = try transport.tlsContext()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .bind(host: "127.0.0.1", port: 0) { child in
                guard let tls else {
                    return child.eventLoop.makeCompletedFuture {
                        try child.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                        return Arrival(.http1(try HTTPChannel(wrappingChannelSynchronously: child)))
                    }
                }
                return child.eventLoop.makeCompletedFuture {
                    try child.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls))
                }.flatMap {
                    child.configureAsyncHTTPServerPipeline(
                        http1ConnectionInitializer: { connection in
                            connection.eventLoop.makeCompletedFuture {
                                try HTTPChannel(wrappingChannelSynchronously: connection)
                            }
                        },
                        http2ConnectionInitializer: { connection in
                            connection.eventLoop.makeSucceededFuture(connection)
                        },
                        http2StreamInitializer: { stream in
                            stream.eventLoop.makeCompletedFuture {
                                try stream.pipeline.syncOperations.addHandler(HTTP2FramePayloadToHTTP1ServerCodec())
                                return try HTTPChannel(wrappingChannelSynchronously: stream)
                            }
                        }
                    )
                }.map { Arrival(.negotiated($0, child)) }
            }
        let server = HaulTestServer(port: channel.channel.localAddress?.port ?? 0, transport: transport)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await server.accept(channel) }
            do {
                let result = try await body(server)
                group.cancelAll()
                return result
            } catch {
                group.cancelAll()
                throw error
            }
        }
    }

    private func accept(_ channel: NIOAsyncChannel<Arrival, Never>) async throws {
        try await withThrowingDiscardingTaskGroup { group in
            try await channel.executeThenClose { inbound in
                for try await arrival in inbound {
                    let connection = arrival.take()
                    group.addTask { await self.handle(connection) }
                }
            }
        }
    }

    /// Serves one connection: its requests one after another over HTTP/1.1, or its streams at once over HTTP/2.
    private func handle(_ accepted: Accepted) async {
        let number = state.withLock { state in
            state.openConnections += 1
            state.connectionsAccepted += 1
            state.maximumOpenConnections = max(state.maximumOpenConnections, state.openConnections)
            return state.connectionsAccepted
        }
        defer { state.withLock { $0.openConnections -= 1 } }
        switch accepted {
        case .http1(let connection):
            await serve(connection, connection: number, version: "HTTP/1.1")
        case .negotiated(let negotiation, let channel):
            // A client that refuses the certificate ends here; one that never finishes its handshake
            // is closed once the server stops.
            let negotiating = try? await withTaskCancellationHandler {
                try await negotiation.get()
            } onCancel: {
                channel.close(promise: nil)
            }
            guard let negotiated = negotiating else { return }
            switch negotiated {
            case .http1_1(let connection):
                await serve(connection, connection: number, version: "HTTP/1.1")
            case .http2((let connection, let streams)):
                await withDiscardingTaskGroup { group in
                    do {
                        for try await stream in streams.inbound {
                            group.addTask { await self.serve(stream, connection: number, version: "HTTP/2") }
                        }
                    } catch {
                        // The connection closed.
                    }
                }
                try? await connection.close()
            }
        }
    }

    // MARK: Configuration

    /// The URL of `path` on this server. `host` may be `localhost` to reach it as another origin.
    public func url(_ path: String, host: String = "127.0.0.1") -> String {
        "\(transport == .plain ? "http" : "https")://\(host):\(port)\(path)"
    }

    /// Serves `resource` at `path`.
    public func add(_ path: String, _ resource: TestResource) {
        state.withLock { $0.resources[path] = resource }
    }

    /// Changes the resource at `path`, e.g. `server.update("/f") { $0.version += 1 }`.
    public func update(_ path: String, _ change: (inout TestResource) -> Void) {
        state.withLock { state in
            guard var resource = state.resources[path] else { return }
            change(&resource)
            state.resources[path] = resource
        }
    }

    public func resource(_ path: String) -> TestResource? { state.withLock { $0.resources[path] } }

    /// Faults for the next requests to `path`: the first request gets `steps[0]`, the second `steps[1]`…
    public func script(_ path: String, _ steps: [[Fault]]) {
        state.withLock { $0.scripts[path] = steps }
    }

    /// Faults applied to every request to `path` (after any scripted ones).
    public func setStandingFaults(_ path: String, _ faults: [Fault]) {
        state.withLock { $0.standingFaults[path] = faults }
    }

    // MARK: Observations

    public var requests: [RecordedRequest] { state.withLock { $0.requests } }

    /// Limits the body bytes per second the whole server sends, shared by all its connections, like
    /// a mirror's uplink (`nil`: no limit). ``Fault/throttle(bytesPerSecond:)`` limits one answer.
    public func limitBandwidth(bytesPerSecond: Int?) {
        state.withLock { state in
            state.bandwidth = bytesPerSecond
            state.bandwidthFree = nil
        }
    }

    /// Reserves the server's bandwidth for a chunk of `bytes`: returns when the chunk may leave.
    func reserveBandwidth(_ bytes: Int64) -> ContinuousClock.Instant? {
        state.withLock { state in
            guard let rate = state.bandwidth, rate > 0 else { return nil }
            let now = ContinuousClock.now
            let start = max(now, state.bandwidthFree ?? now)
            let end = start + .seconds(Double(bytes) / Double(rate))
            state.bandwidthFree = end
            return end
        }
    }

    public func requests(for path: String) -> [RecordedRequest] { requests.filter { $0.path == path } }

    /// The most connections that were open at the same time.
    public var maximumOpenConnections: Int { state.withLock { $0.maximumOpenConnections } }

    public var connectionsAccepted: Int { state.withLock { $0.connectionsAccepted } }

    /// The most requests that were being answered at the same time (over HTTP/2, the streams of
    /// every connection).
    public var maximumRequestsAnswering: Int { state.withLock { $0.maximumRequestsAnswering } }

    /// The most requests for `path` that were being answered at the same time: more than one
    /// means two clients (or two connections of one) fetched the file at once.
    public func maximumRequestsAnswering(for path: String) -> Int {
        state.withLock { $0.maximumAnsweringByPath[path] ?? 0 }
    }

    /// Body bytes written to all connections so far.
    public var bodyBytesSent: Int64 { state.withLock { $0.bodyBytesSent.reduce(0, +) } }

    /// Body bytes written in answer to one request, counted in the order of `requests`.
    public func bodyBytesSent(answering request: Int) -> Int64 {
        state.withLock { $0.bodyBytesSent[request] }
    }
}

extension HaulTestServer.Transport {
    /// The server's TLS context, or nil for plain HTTP.
    func tlsContext() throws -> NIOSSLContext? {
        let protocols: [String]
        switch self {
        case .plain: return nil
        case .tls: protocols = NIOHTTP2SupportedALPNProtocols
        case .tlsHTTP1Only: protocols = ["http/1.1"]
        }
        var configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: [
                .certificate(try NIOSSLCertificate(bytes: Array(TestCertificates.serverPEM.utf8), format: .pem))
            ],
            privateKey: .privateKey(
                try NIOSSLPrivateKey(bytes: Array(TestCertificates.serverKeyPEM.utf8), format: .pem))
        )
        configuration.applicationProtocols = protocols
        return try NIOSSLContext(configuration: configuration)
    }
}
