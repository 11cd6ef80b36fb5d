import Haul

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Where a queue in PostgreSQL lives, as a connection URL:
/// `postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=MODE]` (`postgres://` too).
///
/// The password is kept for connecting and never shown: ``description`` leaves it out, and so does
/// every error that names the queue.
package struct PostgreSQLLocation: Sendable, Equatable, CustomStringConvertible {
    /// Whether the connection is encrypted, as libpq's `sslmode` says it.
    package enum TLSMode: String, Sendable {
        /// Never.
        case disable
        /// When the server offers it (the default); the server's certificate is then checked.
        case prefer
        /// Always, with the server's certificate checked against the system's trusted roots
        /// (`require`, `verify-ca` and `verify-full` all mean this).
        case require
    }

    /// The server's name or address.
    package var host: String
    /// The server's port (5432 unless given).
    package var port: Int
    /// The user haul connects as.
    package var user: String
    /// The user's password, when the URL has one (else the server must not ask for one).
    package var password: String?
    /// The database the queue's tables are in.
    package var database: String
    /// Whether the connection is encrypted.
    package var tls: TLSMode

    /// The location `text` names; a text that is not such a URL throws
    /// ``HaulError/Code/invalidArgument`` with a message that never holds the password.
    package init(parsing text: String) throws {
        func invalid(_ reason: String) -> HaulError {
            HaulError(
                .invalidArgument,
                "not a PostgreSQL queue URL (\(reason)): expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
        }
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased() else {
            throw invalid("it does not parse as a URL")
        }
        guard scheme == "postgresql" || scheme == "postgres" else {
            throw invalid("the scheme is \(scheme), not postgresql")
        }
        guard let host = components.host, !host.isEmpty else { throw invalid("no host") }
        guard let user = components.user, !user.isEmpty else { throw invalid("no user") }
        let database = String(components.path.drop { $0 == "/" })
        guard !database.isEmpty, !database.contains("/") else { throw invalid("no database name after the host") }
        var tls = TLSMode.prefer
        for item in components.queryItems ?? [] {
            switch (item.name, item.value ?? "") {
            case ("sslmode", "disable"): tls = .disable
            case ("sslmode", "allow"), ("sslmode", "prefer"): tls = .prefer
            case ("sslmode", "require"), ("sslmode", "verify-ca"), ("sslmode", "verify-full"): tls = .require
            case ("sslmode", let value): throw invalid("unknown sslmode \(value)")
            case (let name, _): throw invalid("unknown parameter \(name); only sslmode is read")
            }
        }
        self.host = host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host
        self.port = components.port ?? 5432
        self.user = components.user?.removingPercentEncoding ?? user
        self.password = components.password?.removingPercentEncoding
        self.database = database.removingPercentEncoding ?? database
        self.tls = tls
    }

    /// The URL without its password.
    package var description: String {
        let shownHost = host.contains(":") ? "[\(host)]" : host
        let mode = tls == .prefer ? "" : "?sslmode=\(tls.rawValue)"
        return "postgresql://\(user)@\(shownHost):\(port)/\(database)\(mode)"
    }
}
