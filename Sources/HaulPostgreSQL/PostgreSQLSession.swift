import Haul
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO
import Synchronization

/// One connection to the queue's PostgreSQL server, used by one caller at a time, made again when
/// the last one broke. Every wait has a limit: connecting, and each statement.
///
/// The calls are synchronous, as ``QueueStore``'s are: they block the calling thread (never an
/// event loop's) until the server answers.
final class PostgreSQLConnector: Sendable {
    let location: PostgreSQLLocation
    /// How long a statement may take before the connection is closed and the statement fails.
    let statementTimeout: TimeAmount
    /// How long connecting (and signing in) may take.
    let connectTimeout: TimeAmount
    private let connection = Mutex<(open: PostgresConnection, watch: CloseWatch)?>(nil)
    private let serial = Mutex(0)
    private static let logger = Logger(label: "haul.postgresql", factory: { _ in SwiftLogNoOpLogHandler() })

    init(location: PostgreSQLLocation, statementTimeout: TimeAmount, connectTimeout: TimeAmount) {
        self.location = location
        self.statementTimeout = statementTimeout
        self.connectTimeout = connectTimeout
    }

    deinit {
        // The connection lives until it is closed (PostgresNIO checks that it was).
        if let open = connection.withLock({ $0?.open }) {
            open.close().whenComplete { _ in withExtendedLifetime(open) {} }
        }
    }

    /// Runs `body` with the connection, alone; a connection that broke is made again first.
    func withSession<T>(_ body: (PostgreSQLSession) throws -> T) throws -> T {
        try connection.withLock { current in
            let (open, watch): (PostgresConnection, CloseWatch)
            if let current, !current.open.isClosed {
                (open, watch) = current
            } else {
                open = try connect()
                watch = CloseWatch(open.closeFuture)
                current = (open, watch)
            }
            do {
                return try body(
                    PostgreSQLSession(connection: open, watch: watch, timeout: statementTimeout, logger: Self.logger))
            } catch {
                // A connection that broke, or that a statement's limit closed, is never taken again,
                // even while it does not look closed yet (the error may come before the close): the
                // next call connects anew.
                if PostgreSQLSession.isLostConnection(error) || error is PostgreSQLSession.CommitOutcomeUnknown
                    || error is PostgreSQLSession.TimedOut
                {
                    current = nil
                    open.close().whenComplete { _ in withExtendedLifetime(open) {} }
                }
                throw error
            }
        }
    }

    private func connect() throws -> PostgresConnection {
        let connecting = try makeConnection()
        // A server that takes the connection but never finishes the handshake: the connection,
        // should it come after all, is closed.
        return try waitAtMost(connectTimeout, for: connecting) {
            connecting.whenSuccess { late in late.close().whenComplete { _ in withExtendedLifetime(late) {} } }
        }
    }

    /// A connection of its own for the caller, who closes it (listening for notices). Connecting
    /// and signing in take at most ``connectTimeout``; a connection that comes later is closed.
    func connection() async throws -> PostgresConnection {
        let connecting = try makeConnection()
        let limit = connectTimeout
        return try await withCheckedThrowingContinuation { continuation in
            let answered = Mutex(false)
            let first: @Sendable () -> Bool = {
                answered.withLock { done in
                    defer { done = true }; return !done
                }
            }
            let timer = connecting.eventLoop.scheduleTask(in: limit) {
                if first() { continuation.resume(throwing: PostgreSQLSession.TimedOut(after: limit)) }
            }
            connecting.whenComplete { result in
                timer.cancel()
                if first() {
                    continuation.resume(with: result)
                } else if case .success(let late) = result {
                    late.close().whenComplete { _ in withExtendedLifetime(late) {} }
                }
            }
        }
    }

    private func makeConnection() throws -> EventLoopFuture<PostgresConnection> {
        let tls: PostgresConnection.Configuration.TLS
        switch location.tls {
        case .disable: tls = .disable
        case .prefer: tls = .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
        case .require: tls = .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
        }
        var configuration = PostgresConnection.Configuration(
            host: location.host, port: location.port, username: location.user, password: location.password,
            database: location.database, tls: tls)
        // The wait for the connection has the limit (and says so); the driver's own comes later,
        // only to close a socket that never connected.
        configuration.options.connectTimeout = connectTimeout + .seconds(1)
        configuration.options.additionalStartupParameters = [("application_name", "haul")]
        let id = serial.withLock { value -> Int in
            value += 1
            return value
        }
        return PostgresConnection.connect(
            on: MultiThreadedEventLoopGroup.singleton.any(), configuration: configuration, id: id, logger: Self.logger)
    }
}

/// The statements of one caller on the connection (see ``PostgreSQLConnector/withSession(_:)``).
struct PostgreSQLSession {
    let connection: PostgresConnection
    /// Tells a statement waiting on ``connection`` that it closed.
    let watch: CloseWatch
    let timeout: TimeAmount
    let logger: Logger

    /// Runs one statement and reads all its rows. A statement that takes longer than `timeout`
    /// closes the connection, which fails it.
    @discardableResult
    func query(_ sql: String, _ binds: PostgresBindings = PostgresBindings()) throws -> PostgresQueryResult {
        let connection = self.connection
        let answer = connection.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger)
        // A statement written to a connection that closed at that moment is never answered at all:
        // the wait ends when the connection does (a server stopped or restarted), else at the limit.
        return try waitAtMost(timeout, for: answer, watching: watch) {
            connection.close().whenComplete { _ in }
        }
    }

    /// A statement whose connection closed before the server answered it.
    struct ConnectionClosed: Error, CustomStringConvertible {
        var description: String { "the connection to the server closed before it answered" }
    }

    /// A statement the server did not answer in time; its connection was closed.
    struct TimedOut: Error, CustomStringConvertible {
        let after: TimeAmount
        var description: String {
            let milliseconds = after.nanoseconds / 1_000_000
            let seconds = milliseconds % 1000 == 0 ? "\(milliseconds / 1000)" : "\(Double(milliseconds) / 1000)"
            return "the server did not answer within \(seconds) s; the connection was closed"
        }
    }

    /// Runs `body` in one transaction, committed when it returns and rolled back when it throws.
    /// A connection lost while the commit was under way throws ``CommitOutcomeUnknown``: the
    /// server may have made the changes or not.
    func transaction<T>(_ body: () throws -> T) throws -> T {
        try query("BEGIN")
        let value: T
        do {
            value = try body()
        } catch {
            if !connection.isClosed { _ = try? query("ROLLBACK") }
            throw error
        }
        do {
            try query("COMMIT")
        } catch let error where PostgreSQLSession.isLostConnection(error) {
            throw CommitOutcomeUnknown(underlying: error)
        }
        return value
    }

    /// A commit whose answer never came: the connection broke after it was sent.
    struct CommitOutcomeUnknown: Error {
        let underlying: any Error
    }

    /// Whether `error` says the connection to the server is gone (the server stopped, restarted or
    /// ended this session, or the network dropped it), so that a statement not yet sent may be sent
    /// again on a new connection.
    static func isLostConnection(_ error: (any Error)?) -> Bool {
        if error is ConnectionClosed { return true }
        guard let error = error as? PSQLError else { return false }
        // A statement given to a connection that had closed meanwhile (after the server's last
        // word, which comes with it) was never sent.
        if [.serverClosedConnection, .uncleanShutdown, .connectionError, .clientClosedConnection].contains(error.code) {
            return true
        }
        // The server ended the session: an administrator, a shutdown, a crash, or it cannot take
        // connections yet.
        guard let state = error.serverInfo?[.sqlState] else { return false }
        return ["57P01", "57P02", "57P03", "08000", "08003", "08006"].contains(state)
    }
}

/// Tells the statement that waits on a connection when the connection closes. One callback on the
/// connection's close serves its whole life: a callback for each statement would stay with the
/// connection, holding that statement's answer, until it closed.
final class CloseWatch: Sendable {
    private struct State {
        var closed = false
        var waiter: (@Sendable () -> Void)?
    }
    private let state = Mutex(State())

    /// Watches the connection that `closing` (its `closeFuture`) ends.
    init(_ closing: EventLoopFuture<Void>) {
        closing.whenComplete { _ in self.closed() }
    }

    private func closed() {
        let waiter = state.withLock { state -> (@Sendable () -> Void)? in
            state.closed = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?()
    }

    /// Runs `closed` when the connection closes (now, when it has), unless ``stop()`` comes first.
    func start(_ closed: @escaping @Sendable () -> Void) {
        let already = state.withLock { state -> Bool in
            if !state.closed { state.waiter = closed }
            return state.closed
        }
        if already { closed() }
    }

    /// Forgets what ``start(_:)`` was given.
    func stop() { state.withLock { $0.waiter = nil } }
}

/// Waits for `future` at most `limit`, from a thread that is not an event loop's; past the limit,
/// runs `expire` (on the future's event loop) and throws ``PostgreSQLSession/TimedOut``. When the
/// connection `watch` watches closes first, throws ``PostgreSQLSession/ConnectionClosed``.
func waitAtMost<Value: Sendable>(
    _ limit: TimeAmount, for future: EventLoopFuture<Value>, watching watch: CloseWatch? = nil,
    expire: @escaping @Sendable () -> Void
) throws -> Value {
    let loop = future.eventLoop
    let outcome = loop.makePromise(of: Value.self)
    let timer = loop.scheduleTask(in: limit) {
        outcome.fail(PostgreSQLSession.TimedOut(after: limit))
        expire()
    }
    future.whenComplete { result in
        timer.cancel()
        // A second completion of a promise is ignored: whichever came first stands.
        outcome.completeWith(result)
    }
    watch?.start {
        timer.cancel()
        outcome.fail(PostgreSQLSession.ConnectionClosed())
    }
    defer { watch?.stop() }
    return try outcome.futureResult.wait()
}
