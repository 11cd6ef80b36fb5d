import HaulPostgreSQL
import HaulTestServer

/// The tests' PostgreSQL server (see ``PostgreSQLTestServer``), in the store's own terms.
enum PostgreSQLTesting {
    /// Runs `body` with a new, empty database of its own, dropped afterwards.
    static func withDatabase<Result>(_ body: (PostgreSQLLocation) async throws -> Result) async throws -> Result {
        try await PostgreSQLTestServer.withDatabase { database in
            try await body(try PostgreSQLLocation(parsing: database.url))
        }
    }

    /// Runs `statement` in a test's database.
    static func sql(_ statement: String, in location: PostgreSQLLocation) async throws {
        try await PostgreSQLTestServer.sql(statement, inDatabaseNamed: location.database)
    }

    /// The server, started on first use.
    static func server() async throws -> PostgreSQLTestServer.Server { try await PostgreSQLTestServer.server() }
}
