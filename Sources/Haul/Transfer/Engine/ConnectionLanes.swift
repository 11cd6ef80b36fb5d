import AsyncHTTPClient

/// One HTTP client per connection of a download, so that `N` connections are `N` transport
/// connections whatever the protocol: over HTTP/2 the requests given to one client share one TCP
/// connection, so the ranges of a download would otherwise share one congestion window and one path.
///
/// Connection `k` of every download uses client `k`: with HTTP/1.1 each client keeps its own
/// connections alive for the next request; with HTTP/2 client `k` multiplexes connection `k` of every
/// download running at once over one connection per host.
final class ConnectionLanes: Sendable {
    private let clients: [HTTPClient]

    init(count: Int, make: () -> HTTPClient) {
        clients = (0..<max(1, count)).map { _ in make() }
    }

    /// The client for connection `connection` of a download.
    func client(for connection: Int) -> HTTPClient {
        clients[min(max(0, connection), clients.count - 1)]
    }

    /// Closes every connection.
    func shutdown() async throws {
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
