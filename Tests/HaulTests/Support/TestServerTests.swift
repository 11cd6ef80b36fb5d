import HaulTestServer
import NIOCore
import NIOPosix
import Testing

/// The in-process test server itself.
@Suite("The test server", .timeLimit(.minutes(1)))
struct TestServerTests {
    /// Connections a client opens as a test's body returns are accepted while the server stops:
    /// each must reach a handler (a dropped one would end the whole test process).
    @Test func connectionsOpenedAsItStopsAreHandled() async throws {
        var opened: [EventLoopFuture<any Channel>] = []
        for _ in 0..<20 {
            try await HaulTestServer.withRunning { server in
                // Not waited for: they are accepted while the server stops.
                let port = server.port
                return (0..<8).map { _ in
                    ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port)
                }
            }.forEach { opened.append($0) }
        }
        var connected = 0
        for connection in opened {
            guard let channel = try? await connection.get() else { continue }
            connected += 1
            try? await channel.close()
        }
        #expect(connected > 0)
    }
}
