import AsyncHTTPClient
import Synchronization

/// One HTTP client per connection of a download, so that `N` connections are `N` transport
/// connections whatever the protocol: over HTTP/2 the requests given to one client share one TCP
/// connection, so the ranges of a download would otherwise share one congestion window and one path.
///
/// Connection `k` of every download uses client `k`: with HTTP/1.1 each client keeps its own
/// connections alive for the next request; with HTTP/2 client `k` multiplexes connection `k` of every
/// download running at once over one connection per host. The clients of the configured connection
/// count are made at once; a download that asks for more (``DownloadRequest/connections``) adds
/// clients when it first uses them.
final class ConnectionLanes: Sendable {
    private struct State {
        var clients: [HTTPClient]
        var shutDown = false
    }

    private let state: Mutex<State>
    private let make: @Sendable () -> HTTPClient
    /// The most clients: the configured count, or as many as one request may ask for.
    private let limit: Int

    init(count: Int, make: @escaping @Sendable () -> HTTPClient) {
        self.make = make
        limit = max(count, DownloadRequest.maximumConnections)
        state = Mutex(State(clients: (0..<max(1, count)).map { _ in make() }))
    }

    /// The client for connection `connection` of a download.
    func client(for connection: Int) -> HTTPClient {
        let index = min(max(0, connection), limit - 1)
        return state.withLock { state in
            // After shutdown no client is made that nobody would close: the last one refuses.
            while state.clients.count <= index && !state.shutDown { state.clients.append(make()) }
            return state.clients[min(index, state.clients.count - 1)]
        }
    }

    /// Closes every connection.
    func shutdown() async throws {
        let clients = state.withLock { state in
            state.shutDown = true
            return state.clients
        }
        var failure: (any Error)?
        for client in clients {
            do {
                try await client.shutdown()
            } catch {
                failure = failure ?? error
            }
        }
        if let failure { throw failure }
    }
}

/// The connection lanes of each way out: directly, or through each proxy a download's requests
/// take (see ``ProxySettings``); made when first needed.
final class ProxiedLanes: Sendable {
    private let count: Int
    private let configuration: HTTPClient.Configuration
    private let lanes: Mutex<[Proxy?: ConnectionLanes]> = Mutex([:])

    init(count: Int, configuration: HTTPClient.Configuration) {
        self.count = count
        self.configuration = configuration
    }

    /// The lanes for requests through `proxy` (`nil`: directly).
    func lanes(through proxy: Proxy?) -> ConnectionLanes {
        lanes.withLock { lanes in
            if let existing = lanes[proxy] { return existing }
            var proxied = self.configuration
            proxied.proxy = proxy.map(Self.clientProxy)
            let configuration = proxied
            let made = ConnectionLanes(count: count) {
                HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
            }
            lanes[proxy] = made
            return made
        }
    }

    /// Closes every connection.
    func shutdown() async throws {
        var failure: (any Error)?
        for lane in lanes.withLock({ Array($0.values) }) {
            do { try await lane.shutdown() } catch { failure = failure ?? error }
        }
        if let failure { throw failure }
    }

    private static func clientProxy(_ proxy: Proxy) -> HTTPClient.Configuration.Proxy {
        switch proxy.kind {
        case .http:
            .server(
                host: proxy.host, port: proxy.port,
                authorization: proxy.credentials.map { .basic(username: $0.user, password: $0.password) })
        case .socks5, .socks5h:
            .socksServer(host: proxy.host, port: proxy.port)
        }
    }
}
