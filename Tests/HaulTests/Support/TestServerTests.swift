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
        var opened: [any Channel] = []
        for _ in 0..<20 {
            opened += try await HaulTestServer.withRunning { server in
                // Connected (the kernel queued them), then left to the stopping server at once.
                let port = server.port
                let connecting = (0..<8).map { _ in
                    ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port)
                }
                var connected: [any Channel] = []
                for connection in connecting { connected.append(try await connection.get()) }
                return connected
            }
        }
        #expect(opened.count == 160)
        for channel in opened { try? await channel.close() }
    }
}
