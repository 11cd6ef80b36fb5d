import HaulTestServer
import NIOCore
import NIOPosix
import Synchronization
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

    /// A client that keeps its connection open but stops reading the answer, or never finishes its
    /// TLS handshake, does not hold the stopping server: its connection is closed. (Held, the test
    /// run waited for the server forever.)
    @Test(arguments: [HaulTestServer.Transport.plain, .tls])
    func aClientThatNeitherReadsNorLeavesDoesNotHoldTheStop(transport: HaulTestServer.Transport) async throws {
        let stopped = Atomic(false)
        let client = Mutex<(any Channel)?>(nil)
        let stopping = Task {
            defer { stopped.store(true, ordering: .relaxed) }
            try await HaulTestServer.withRunning(transport: transport) { server in
                server.add("/big", TestResource(name: "big", size: 64 << 20))
                // Reads nothing: the server's writes fill the sockets' buffers and wait.
                let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .channelOption(.autoRead, value: false)
                    .connect(host: "127.0.0.1", port: server.port).get()
                client.withLock { $0 = channel }
                let deadline = ContinuousClock.now + .seconds(10)
                guard transport == .plain else {
                    // Taken by a handler, which waits for the handshake.
                    while server.connectionsAccepted == 0 && ContinuousClock.now < deadline {
                        try await Task.sleep(for: .milliseconds(10))
                    }
                    #expect(server.connectionsAccepted == 1)
                    return
                }
                try await channel.writeAndFlush(ByteBuffer(string: "GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
                    .get()
                while server.requests(for: "/big").isEmpty && ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(10))
                }
                #expect(server.requests(for: "/big").count == 1)
            }
        }
        let deadline = ContinuousClock.now + .seconds(20)
        while !stopped.load(ordering: .relaxed) && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        let ended = stopped.load(ordering: .relaxed)
        #expect(ended, "the server did not stop within 20 s")
        if ended { try await stopping.value }
        try? await client.withLock { $0 }?.close()
    }
}
