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
    private let clients: Mutex<[HTTPClient]>
    private let make: @Sendable () -> HTTPClient

    init(count: Int, make: @escaping @Sendable () -> HTTPClient) {
        self.make = make
        clients = Mutex((0..<max(1, count)).map { _ in make() })
    }

    /// The client for connection `connection` of a download.
    func client(for connection: Int) -> HTTPClient {
        let index = min(max(0, connection), DownloadRequest.maximumConnections - 1)
        return clients.withLock { clients in
            while clients.count <= index { clients.append(make()) }
            return clients[index]
        }
    }

    /// Closes every connection.
    func shutdown() async throws {
        var failure: (any Error)?
        for client in clients.withLock({ $0 }) {
            do {
                try await client.shutdown()
            } catch {
                failure = failure ?? error
            }
        }
        if let failure { throw failure }
    }
}
