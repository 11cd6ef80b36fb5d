import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// An HTTP/1.1 server on 127.0.0.1 that serves generated files, misbehaves on request, and
/// remembers what it was asked.
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
        /// Which connection carried it, counting from 1.
        public let connection: Int

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
        var bodyBytesSent: Int64 = 0
    }

    let state = Mutex(State())
    /// The port the server listens on.
    public let port: Int

    private init(port: Int) { self.port = port }

    /// Starts a server, runs `body` with it, and stops it when `body` returns or throws.
    public static func withRunning<Result: Sendable>(
        _ body: @Sendable (HaulTestServer) async throws -> Result
    ) async throws -> Result {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .bind(host: "127.0.0.1", port: 0) { child in
                child.eventLoop.makeCompletedFuture {
                    try child.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    return try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(
                        wrappingChannelSynchronously: child
                    )
                }
            }
        let server = HaulTestServer(port: channel.channel.localAddress?.port ?? 0)
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

    private func accept(
        _ channel: NIOAsyncChannel<NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>, Never>
    )
        async throws
    {
        try await withThrowingDiscardingTaskGroup { group in
            try await channel.executeThenClose { inbound in
                for try await connection in inbound {
                    group.addTask { await self.serve(connection) }
                }
            }
        }
    }

    // MARK: Configuration

    /// The URL of `path` on this server. `host` may be `localhost` to reach it as another origin.
    public func url(_ path: String, host: String = "127.0.0.1") -> String { "http://\(host):\(port)\(path)" }

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

    public func requests(for path: String) -> [RecordedRequest] { requests.filter { $0.path == path } }

    /// The most connections that were open at the same time.
    public var maximumOpenConnections: Int { state.withLock { $0.maximumOpenConnections } }

    public var connectionsAccepted: Int { state.withLock { $0.connectionsAccepted } }

    /// Body bytes written to all connections so far.
    public var bodyBytesSent: Int64 { state.withLock { $0.bodyBytesSent } }
}
