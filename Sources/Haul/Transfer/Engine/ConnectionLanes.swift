import AsyncHTTPClient
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One HTTP client per connection of a download, so that `N` connections are `N` transport
/// connections whatever the protocol: over HTTP/2 the requests given to one client share one TCP
/// connection, so the ranges of a download would otherwise share one congestion window and one path.
///
/// Connection `k` of every download uses client `k`: with HTTP/1.1 each client keeps its own
/// connections alive for the next request; with HTTP/2 client `k` multiplexes connection `k` of every
/// download running at once over one connection per host. Clients are made when first used, up to
/// the configured connection count or what a download asks for (``DownloadRequest/connections``).
final class ConnectionLanes: Sendable {
    private struct State {
        var clients: [HTTPClient] = []
        var shutDown = false
    }

    private let state: Mutex<State>
    private let make: @Sendable () -> HTTPClient
    /// The most clients: the configured count, or as many as one request may ask for.
    private let limit: Int

    /// Lanes whose clients are made when first used; `shutDown` ones make none.
    init(count: Int, shutDown: Bool = false, make: @escaping @Sendable () -> HTTPClient) {
        self.make = make
        limit = max(count, DownloadRequest.maximumConnections)
        state = Mutex(State(shutDown: shutDown))
    }

    /// The client for connection `connection` of a download.
    /// - Throws: `CancellationError` once the lanes are shut down: no client is made that nobody
    ///   would close.
    func client(for connection: Int) throws -> HTTPClient {
        let index = min(max(0, connection), limit - 1)
        return try state.withLock { state in
            guard !state.shutDown else { throw CancellationError() }
            while state.clients.count <= index { state.clients.append(make()) }
            return state.clients[index]
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
/// take (see ``ProxySettings``); made when first needed. A `socks5://` proxy is given addresses,
/// not names (as curl's): its lanes are per host, their client told the address Haul resolved for
/// it (kept a minute: ``AddressCache``), and the server's certificate is still checked against the
/// host's name.
final class ProxiedLanes: Sendable {
    /// One way out: a proxy (`nil`: directly), and for a `socks5://` proxy the host and the address
    /// resolved for it.
    private struct Route: Hashable {
        var proxy: Proxy?
        var host: String?
        var address: String?
    }

    private let count: Int
    private let configuration: HTTPClient.Configuration
    private let addresses: AddressCache
    private let lanes: Mutex<(byRoute: [Route: ConnectionLanes], shutDown: Bool)> = Mutex(([:], false))

    init(count: Int, configuration: HTTPClient.Configuration, addresses: AddressCache) {
        self.count = count
        self.configuration = configuration
        self.addresses = addresses
    }

    /// The lanes for requests through `proxy` (`nil`: directly).
    func lanes(through proxy: Proxy?) -> ConnectionLanes {
        lanes(for: Route(proxy: proxy))
    }

    /// The lanes for requests to `url` through `proxy` (`nil`: directly): for a `socks5://` proxy,
    /// the host's name is resolved here first, its answer kept a minute as curl keeps it, so an
    /// address that changes is followed within a minute (the proxy is given the address; the lanes
    /// of an address already used, and their open connections, serve it again).
    func lanes(to url: URL, through proxy: Proxy?) async throws -> ConnectionLanes {
        guard let proxy, proxy.kind == .socks5, let host = url.host, IPAddress(host) == nil,
            !host.hasPrefix("[")
        else { return lanes(through: proxy) }
        let address = try await addresses.address(of: host)
        return lanes(for: Route(proxy: proxy, host: host, address: address))
    }

    private func lanes(for route: Route) -> ConnectionLanes {
        lanes.withLock { lanes in
            if let existing = lanes.byRoute[route] { return existing }
            var proxied = self.configuration
            proxied.proxy = route.proxy.map(Self.clientProxy)
            if let host = route.host, let address = route.address { proxied.dnsOverride = [host: address] }
            let configuration = proxied
            let made = ConnectionLanes(count: count, shutDown: lanes.shutDown) {
                HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
            }
            lanes.byRoute[route] = made
            return made
        }
    }

    /// Closes every connection.
    func shutdown() async throws {
        var failure: (any Error)?
        let all = lanes.withLock { lanes in
            lanes.shutDown = true
            return Array(lanes.byRoute.values)
        }
        for lane in all {
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
