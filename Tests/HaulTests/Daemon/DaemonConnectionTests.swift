import Haul
import NIOCore
import NIOEmbedded
import Testing

@testable import HaulDaemon

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A plain TCP connection to the daemon, for what an HTTP client would not send.
struct RawConnection {
    let descriptor: Int32

    init(port: Int) throws {
        descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw TestFailure("socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            let reason = String(cString: strerror(errno))
            systemClose(descriptor)
            throw TestFailure("connect: \(reason)")
        }
    }

    func send(_ text: String) {
        _ = text.utf8CString.withUnsafeBufferPointer { write(descriptor, $0.baseAddress, $0.count - 1) }
    }

    /// What the daemon sends until it closes the connection, or until `timeout` (real time) passes;
    /// `closed` tells which.
    func readToEnd(timeout: Duration = .seconds(10)) -> (text: String, closed: Bool) {
        var bytes: [UInt8] = []
        let deadline = ContinuousClock.now + timeout
        var buffer = [UInt8](repeating: 0, count: 4096)
        while ContinuousClock.now < deadline {
            var wait = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            guard poll(&wait, 1, 50) > 0 else { continue }
            let count = read(descriptor, &buffer, buffer.count)
            if count <= 0 { return (String(decoding: bytes, as: UTF8.self), true) }
            bytes += buffer[0..<count]
        }
        return (String(decoding: bytes, as: UTF8.self), false)
    }

    /// Whether the daemon has closed the connection (checked without waiting).
    var isClosedByDaemon: Bool {
        var wait = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        guard poll(&wait, 1, 0) > 0 else { return false }
        var byte: UInt8 = 0
        return recv(descriptor, &byte, 1, Int32(MSG_PEEK)) <= 0
    }

    func close() { systemClose(descriptor) }
}

private func systemClose(_ descriptor: Int32) {
    #if canImport(Glibc)
        _ = Glibc.close(descriptor)
    #else
        _ = Darwin.close(descriptor)
    #endif
}

/// The listener's limits: idle and slow connections are closed on the daemon's clock, floods make
/// room instead of locking clients out, event streams are counted apart.
@Suite(.timeLimit(.minutes(2)), .serialized)
struct DaemonConnectionTests {
    /// A figure of `/metrics`.
    static func metric(_ daemon: DaemonHarness, _ name: String) async throws -> Int {
        let text = try await daemon.send(.GET, "/metrics").body
        let line = try #require(text.split(separator: "\n").first { $0.hasPrefix(name + " ") })
        return try #require(Int(line.split(separator: " ")[1]))
    }

    /// The cap's rule on a small scale (`scripts/connection-flood.py` holds thousands against a
    /// `haul daemon` and measures its memory).
    @Test func heldConnectionsPastTheCapMakeRoomForTheAPIAndAreLetGo() async throws {
        try await withDaemon(
            {
                $0.connections.maximumConnections = 40
                $0.connections.maximumConnectionsPerClient = 30
            }, live: true
        ) { daemon in
            var held: [RawConnection] = []
            defer { for connection in held { connection.close() } }
            for index in 0..<120 {
                let connection = try RawConnection(port: daemon.port)
                // Half of them never finish their request's head.
                if index % 2 == 0 { connection.send("GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0") }
                held.append(connection)
            }
            // The API still answers, and the daemon holds no more than its cap for one client.
            #expect(try await daemon.send(.GET, "/api/v1/stats").status == 200)
            #expect(try await Self.metric(daemon, "haul_api_connections") <= 30)
            try await waitUntil("the oldest are closed") { held.filter(\.isClosedByDaemon).count >= 120 - 30 }
            // The newest are the ones kept.
            #expect(!held.last!.isClosedByDaemon)
            for connection in held { connection.close() }
            held = []
            try await waitUntilAsync("the daemon lets go of the closed connections") {
                try await Self.metric(daemon, "haul_api_connections") <= 2
            }
        }
    }

    @Test func idleAndSlowConnectionsAreClosedOnTheDaemonsClock() async throws {
        let clock = ManualClock()
        try await withDaemon({ _ in }, clock: clock, live: true) { daemon in
            let idle = try (0..<20).map { _ in try RawConnection(port: daemon.port) }
            let slow = try (0..<20).map { _ in try RawConnection(port: daemon.port) }
            defer { for connection in idle + slow { connection.close() } }
            for connection in slow { connection.send("GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0") }
            // The slow ones' first bytes must have reached the daemon before its clock moves.
            try await waitUntilAsync("the daemon holds them") {
                let open = try await Self.metric(daemon, "haul_api_connections")
                let arriving = try await Self.metric(daemon, "haul_api_requests_arriving")
                return open >= 40 && arriving >= 20
            }
            // A request's head and body must arrive within 10 s of its first byte.
            clock.advance(by: .seconds(10))
            try await waitUntil("the slow ones are closed") { slow.allSatisfy(\.isClosedByDaemon) }
            #expect(idle.allSatisfy { !$0.isClosedByDaemon })
            // A connection with no request under way goes after 30 s.
            clock.advance(by: .seconds(20))
            try await waitUntil("the idle ones are closed") { idle.allSatisfy(\.isClosedByDaemon) }
            // A new connection is served (the client's own pooled one went the same way).
            let fresh = try RawConnection(port: daemon.port)
            defer { fresh.close() }
            fresh.send(
                "GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(daemon.token)\r\n"
                    + "Connection: close\r\n\r\n")
            #expect(fresh.readToEnd().text.hasPrefix("HTTP/1.1 200"))
        }
    }

    @Test func eventStreamsAreCountedApart() async throws {
        try await withDaemon({ $0.connections.maximumEventStreams = 2 }, live: true) { daemon in
            let first = try await EventReader(daemon)
            let second = try await EventReader(daemon)
            #expect(first.status == 200 && second.status == 200)
            let third = try await daemon.send(.GET, "/api/v1/events")
            #expect(third.status == 503 && third.errorCode == "tooManyEventStreams", "\(third.body)")
            #expect(third.headers["Retry-After"].first == "5")
            #expect(try await Self.metric(daemon, "haul_api_event_streams") == 2)
            // Other requests go on.
            #expect(try await daemon.send(.GET, "/api/v1/stats").status == 200)
        }
    }

    @Test func whenEveryConnectionIsAnsweringANewOneIsRefusedAtOnce() async throws {
        try await withDaemon({ $0.connections.maximumConnections = 2 }, live: true) { daemon in
            let streams = [try await EventReader(daemon), try await EventReader(daemon)]
            #expect(streams.allSatisfy { $0.status == 200 })
            let refused = try RawConnection(port: daemon.port)
            defer { refused.close() }
            refused.send("GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            let (answer, closed) = refused.readToEnd()
            #expect(answer.hasPrefix("HTTP/1.1 503") && answer.contains("Retry-After: 1") && closed, "\(answer)")
        }
    }

    @Test func aRequestNamesItsHostAsHTTP1Says() async throws {
        try await withDaemon(live: true) { daemon in
            // HTTP/1.0 without Host: refused, and the connection closes as HTTP/1.0 expects.
            let old = try RawConnection(port: daemon.port)
            defer { old.close() }
            old.send("GET /api/v1/stats HTTP/1.0\r\nAuthorization: Bearer \(daemon.token)\r\n\r\n")
            let (refused, closed) = old.readToEnd()
            #expect(refused.contains(" 421 ") && closed, "\(refused)")
            // An absolute-form target names the server, whatever Host says (RFC 9112 §3.2.2).
            let absolute = try RawConnection(port: daemon.port)
            defer { absolute.close() }
            absolute.send(
                "GET http://attacker.example/api/v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    + "Authorization: Bearer \(daemon.token)\r\nConnection: close\r\n\r\n")
            let (rebound, _) = absolute.readToEnd()
            #expect(rebound.contains(" 421 ") && rebound.contains("forbiddenHost"), "\(rebound)")
            let own = try RawConnection(port: daemon.port)
            defer { own.close() }
            own.send(
                "GET http://127.0.0.1:\(daemon.port)/api/v1/stats HTTP/1.1\r\nHost: attacker.example\r\n"
                    + "Authorization: Bearer \(daemon.token)\r\nConnection: close\r\n\r\n")
            #expect(own.readToEnd().text.hasPrefix("HTTP/1.1 200"))
        }
    }

    /// A client that asks and never reads its answer keeps its connection answering: after a minute
    /// on the daemon's clock it is closed, while an event stream (which cuts off a client that stops
    /// reading by itself) stays.
    @Test func aResponseItsClientDoesNotReadIsCutOff() throws {
        let clock = ManualClock()
        let ledger = ConnectionLedger(limits: ConnectionLimits(), clock: TransferClock(clock))
        let slow = EmbeddedChannel()
        let stream = EmbeddedChannel()
        let client = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
        slow.connect(to: client, promise: nil)
        stream.connect(to: client, promise: nil)
        #expect(ledger.admit(slow) && ledger.admit(stream))
        ledger.note(slow, .responding)
        ledger.note(stream, .responding)
        ledger.noteEventStream(stream)
        clock.advance(by: .seconds(59))
        ledger.sweep()
        #expect(slow.isActive && stream.isActive)
        clock.advance(by: .seconds(1))
        ledger.sweep()
        #expect(!slow.isActive)
        #expect(stream.isActive)
        _ = try? stream.finish()
    }

    /// A client whose last connection was closed to make room is forgotten: a daemon that meets many
    /// clients keeps a count only for those still connected.
    @Test func aClientClosedToMakeRoomIsForgotten() throws {
        var limits = ConnectionLimits()
        limits.maximumConnections = 1
        let ledger = ConnectionLedger(limits: limits, clock: TransferClock(ManualClock()))
        let first = EmbeddedChannel()
        let second = EmbeddedChannel()
        first.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 1), promise: nil)
        second.connect(to: try SocketAddress(ipAddress: "127.0.0.2", port: 1), promise: nil)
        #expect(ledger.admit(first))
        #expect(ledger.admit(second))
        #expect(!first.isActive)
        #expect(ledger.openConnections == 1)
        #expect(ledger.clientsWithConnections == 1)
        ledger.remove(second)
        #expect(ledger.clientsWithConnections == 0)
        _ = try? second.finish()
    }
}
