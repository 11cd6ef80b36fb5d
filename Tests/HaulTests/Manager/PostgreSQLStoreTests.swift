import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Testing

@testable import Haul
@testable import HaulPostgreSQL

#if canImport(Glibc)
    import Glibc
#endif

/// What the PostgreSQL store does beyond the conformance suite: reading its URL, never showing
/// the password, limits on every wait, and a connection that comes back.
@Suite(.timeLimit(.minutes(2))) struct PostgreSQLStoreTests {
    /// A queue URL reads as libpq's do; a bad one is refused with a line that never holds the password.
    @Test func queueURLsAreReadAndShownWithoutThePassword() throws {
        let full = try PostgreSQLLocation(parsing: "postgresql://fleet:p%40ss@db.example:6543/queue?sslmode=require")
        #expect(full.user == "fleet" && full.password == "p@ss" && full.host == "db.example")
        #expect(full.port == 6543 && full.database == "queue" && full.tls == .require)
        #expect(full.description == "postgresql://fleet@db.example:6543/queue?sslmode=require")
        let short = try PostgreSQLLocation(parsing: "postgres://haul@[::1]/q")
        #expect(short.host == "::1" && short.port == 5432 && short.password == nil && short.tls == .prefer)
        #expect(short.description == "postgresql://haul@[::1]:5432/q")
        for bad in [
            "mysql://u:hunter2@h/d", "postgresql://h/d", "postgresql://u:hunter2@h", "postgresql://u:hunter2@/d",
            "postgresql://u:hunter2@h/d?sslmode=sometimes", "postgresql://u:hunter2@h/d?timeout=3", "not a url at all",
        ] {
            do {
                _ = try PostgreSQLLocation(parsing: bad)
                Issue.record("\(bad) was accepted")
            } catch let error as HaulError {
                #expect(error.code == .invalidArgument)
                #expect(!error.message.contains("hunter2"), "\(error.message)")
                #expect(!error.message.contains("\n"))
            }
        }
    }

    /// A server that cannot be reached fails the open with one ``HaulError/Code/database`` line
    /// that names the queue without the password.
    @Test func anUnreachableServerIsNamedWithoutThePassword() async throws {
        let server = try await PostgreSQLTesting.server()
        // A port of the test server's host where nothing listens: the server's own, plus one.
        let location = try PostgreSQLLocation(
            parsing: "postgresql://haul:hunter2@127.0.0.1:\(server.port + 1)/nothing?sslmode=disable")
        do {
            _ = try PostgreSQLQueueStore(location: location)
            Issue.record("a store opened on a port where nothing listens")
        } catch let error as HaulError {
            #expect(error.code == .database)
            #expect(
                error.message.contains("postgresql://haul@127.0.0.1:\(server.port + 1)/nothing"), "\(error.message)")
            #expect(!error.message.contains("hunter2"), "\(error.message)")
            #expect(!error.message.contains("\n"))
        }
    }

    /// A server that takes the connection but never answers the sign-in fails the open within the
    /// connect limit, with a line that says so.
    @Test func aServerThatNeverAnswersFailsTheOpen() throws {
        // A socket that listens and never accepts: the kernel completes the handshake, nobody answers.
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #expect(listener >= 0)
        defer { close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let listening = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(listener, pointer, length) == 0 && listen(listener, 8) == 0
                    && getsockname(listener, pointer, &length) == 0
            }
        }
        #expect(listening)
        let port = Int(UInt16(bigEndian: address.sin_port))
        let location = try PostgreSQLLocation(parsing: "postgresql://haul@127.0.0.1:\(port)/q?sslmode=disable")
        do {
            _ = try PostgreSQLQueueStore(location: location, connectTimeout: .milliseconds(300))
            Issue.record("a store opened on a server that never answered")
        } catch let error as HaulError {
            #expect(error.code == .database)
            #expect(error.message.contains("did not answer within 0.3 s"), "\(error.message)")
        }
    }

    /// A statement the server does not answer in time fails with a database error that says so,
    /// and the next call works on a new connection.
    @Test func aStatementThatWaitsTooLongFailsAndTheStoreGoesOn() async throws {
        try await PostgreSQLTesting.withDatabase { location in
            let store = try PostgreSQLQueueStore(location: location, statementTimeout: .milliseconds(300))
            try store.insert([QueueStoreConformanceTests.record("a")])
            // Another session holds the table, so that a read waits.
            let holder = try await PostgresConnection.connect(
                on: MultiThreadedEventLoopGroup.singleton.any(),
                configuration: .init(
                    host: location.host, port: location.port, username: location.user, password: nil,
                    database: location.database, tls: .disable),
                id: 1, logger: Logger(label: "test"))
            try await holder.query("BEGIN", logger: Logger(label: "test"))
            try await holder.query("LOCK TABLE download IN ACCESS EXCLUSIVE MODE", logger: Logger(label: "test"))
            let error = await expectHaulError(.database) { _ = try store.allDownloads() }
            #expect(error?.message.contains("did not answer within 0.3 s") == true, "\(error?.message ?? "")")
            try await holder.query("ROLLBACK", logger: Logger(label: "test"))
            try await holder.close()
            #expect(try store.allDownloads().map(\.key) == ["file:/d/a"])
        }
    }

    /// A statement's wait ends as soon as its connection closes, not at the statement's limit:
    /// a statement written to a connection that closed at that moment is never answered, and a
    /// fleet's worker waiting that long could not stop its downloads before its lease ran out.
    /// The end counts as a lost connection (made again for the next call).
    @Test func aStatementsWaitEndsWhenItsConnectionCloses() throws {
        let loop = MultiThreadedEventLoopGroup.singleton.any()
        let answer = loop.makePromise(of: Int.self)
        let closed = loop.makePromise(of: Void.self)
        // Never answered before the close; completed afterwards only so that no promise leaks.
        defer { answer.succeed(0) }
        let watch = CloseWatch(closed.futureResult)
        loop.scheduleTask(in: .milliseconds(20)) { closed.succeed() }
        let error = #expect(throws: (any Error).self) {
            try waitAtMost(.seconds(60), for: answer.futureResult, watching: watch) {}
        }
        #expect(error is PostgreSQLSession.ConnectionClosed, "\(String(describing: error))")
        #expect(PostgreSQLSession.isLostConnection(error))
        // A statement after the close fails at once.
        let next = loop.makePromise(of: Int.self)
        defer { next.succeed(0) }
        #expect(throws: PostgreSQLSession.ConnectionClosed.self) {
            try waitAtMost(.seconds(60), for: next.futureResult, watching: watch) {}
        }
    }

    /// The server ending the store's session (a restart, an administrator) costs nothing: the
    /// next call connects again and is carried out, however soon after the end it comes (the
    /// server's last word may arrive before its connection has closed: the retry must not take
    /// that connection again). Ended twenty times, since the moment varies.
    @Test func aLostConnectionIsMadeAgain() async throws {
        try await PostgreSQLTesting.withDatabase { location in
            let store = try PostgreSQLQueueStore(location: location)
            let first = try store.insert([QueueStoreConformanceTests.record("a")])
            for _ in 0..<20 {
                try await PostgreSQLTesting.sql(
                    """
                    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                    WHERE application_name = 'haul' AND datname = '\(location.database)'
                    """, in: location)
                #expect(try store.download(first[0])?.key == "file:/d/a")
            }
            let second = try store.insert([QueueStoreConformanceTests.record("b")])
            #expect(try store.allDownloads().map(\.downloadID) == first + second)
        }
    }

    /// A connection whose statement failed as lost is not taken again, even while it does not
    /// look closed yet: the next call connects anew (a retry that took it again failed too).
    @Test func aLostConnectionIsNotTakenAgain() async throws {
        try await PostgreSQLTesting.withDatabase { location in
            let connector = PostgreSQLConnector(
                location: location, statementTimeout: .seconds(30), connectTimeout: .seconds(10))
            func backend() throws -> Int32? {
                try connector.withSession { session in
                    try session.query("SELECT pg_backend_pid()").first?.decode(Int32.self)
                }
            }
            let first = try #require(try backend())
            #expect(try backend() == first, "a connection that works is kept")
            #expect(throws: PostgreSQLSession.ConnectionClosed.self) {
                try connector.withSession { _ in throw PostgreSQLSession.ConnectionClosed() }
            }
            let second = try #require(try backend())
            #expect(second != first)
        }
    }

    /// A database whose schema a newer haul made is refused, not written.
    @Test func aSchemaFromANewerHaulIsRefused() async throws {
        try await PostgreSQLTesting.withDatabase { location in
            _ = try PostgreSQLQueueStore(location: location)
            try await PostgreSQLTesting.sql(
                "INSERT INTO haul_migration (version, name) VALUES (99, 'later')", in: location)
            let error = #expect(throws: HaulError.self) { _ = try PostgreSQLQueueStore(location: location) }
            #expect(error?.code == .database)
            #expect(error?.message.contains("schema version 99") == true, "\(error?.message ?? "")")
        }
    }
}
