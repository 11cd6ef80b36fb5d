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
    private let connection = Mutex<PostgresConnection?>(nil)
    private let serial = Mutex(0)
    private static let logger = Logger(label: "haul.postgresql", factory: { _ in SwiftLogNoOpLogHandler() })

    init(location: PostgreSQLLocation, statementTimeout: TimeAmount = .seconds(30)) {
        self.location = location
        self.statementTimeout = statementTimeout
    }

    deinit {
        // The connection lives until it is closed (PostgresNIO checks that it was).
        if let open = connection.withLock({ $0 }) { open.close().whenComplete { _ in withExtendedLifetime(open) {} } }
    }

    /// Runs `body` with the connection, alone; a connection that broke is made again first.
    func withSession<T>(_ body: (PostgreSQLSession) throws -> T) throws -> T {
        try connection.withLock { current in
            let open: PostgresConnection
            if let current, !current.isClosed {
                open = current
            } else {
                open = try connect()
                current = open
            }
            return try body(PostgreSQLSession(connection: open, timeout: statementTimeout, logger: Self.logger))
        }
    }

    private func connect() throws -> PostgresConnection {
        let tls: PostgresConnection.Configuration.TLS
        switch location.tls {
        case .disable: tls = .disable
        case .prefer: tls = .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
        case .require: tls = .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
        }
        var configuration = PostgresConnection.Configuration(
            host: location.host, port: location.port, username: location.user, password: location.password,
            database: location.database, tls: tls)
        configuration.options.connectTimeout = .seconds(10)
        configuration.options.additionalStartupParameters = [("application_name", "haul")]
        let id = serial.withLock { value -> Int in
            value += 1
            return value
        }
        return try PostgresConnection.connect(
            on: MultiThreadedEventLoopGroup.singleton.any(), configuration: configuration, id: id, logger: Self.logger
        ).wait()
    }
}

/// The statements of one caller on the connection (see ``PostgreSQLConnector/withSession(_:)``).
struct PostgreSQLSession {
    let connection: PostgresConnection
    let timeout: TimeAmount
    let logger: Logger

    /// Runs one statement and reads all its rows. A statement that takes longer than `timeout`
    /// closes the connection, which fails it.
    @discardableResult
    func query(_ sql: String, _ binds: PostgresBindings = PostgresBindings()) throws -> PostgresQueryResult {
        let connection = self.connection
        let timer = connection.eventLoop.scheduleTask(in: timeout) { connection.close().whenComplete { _ in } }
        defer { timer.cancel() }
        return try connection.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger).wait()
    }

    /// Runs `body` in one transaction, committed when it returns and rolled back when it throws.
    func transaction<T>(_ body: () throws -> T) throws -> T {
        try query("BEGIN")
        do {
            let value = try body()
            try query("COMMIT")
            return value
        } catch {
            if !connection.isClosed { _ = try? query("ROLLBACK") }
            throw error
        }
    }
}
