import NIOCore
import NIOPosix

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Short, human wording for the errors the network stack throws, for one-line messages.
enum TransportErrorDescription {
    static func describe(_ error: any Error, url: DownloadURL) -> String {
        let host = url.url.host ?? url.string
        let port = url.url.port ?? (url.isHTTPS ? 443 : 80)
        if let connection = error as? NIOConnectionError {
            let reason =
                connection.connectionErrors.first.map { describeCause($0.error) }
                ?? connection.dnsAError.map { "cannot resolve the name (\(describeCause($0)))" }
                ?? "no address to connect to"
            return "cannot connect to \(connection.host):\(connection.port): \(reason)"
        }
        if let io = error as? IOError, connectErrors.contains(io.errnoCode) {
            return "cannot connect to \(host):\(port): \(describeCause(io))"
        }
        return "transfer from \(host) failed: \(describeCause(error))"
    }

    /// A TLS failure in a few words: BoringSSL's reason code rather than the whole error chain.
    static func describeTLS(_ error: any Error, host: String) -> String {
        let text = "\(error)"
        guard let marker = text.range(of: "OPENSSL_internal:") else {
            return "TLS with \(host) failed: \(text)"
        }
        let reason = text[marker.upperBound...].prefix { $0 != " " && $0 != "]" && $0 != ")" }
        if reason == "CERTIFICATE_VERIFY_FAILED" {
            return "TLS with \(host) failed: its certificate could not be verified (not valid for \(host), "
                + "expired, or signed by no trusted authority)"
        }
        return "TLS with \(host) failed: \(reason)"
    }

    /// Whether the host refused the connection: nothing listens at its address and port (every
    /// address tried said so).
    static func isRefusal(_ error: any Error) -> Bool {
        if let connection = error as? NIOConnectionError {
            return !connection.connectionErrors.isEmpty
                && connection.connectionErrors.allSatisfy { ($0.error as? IOError)?.errnoCode == ECONNREFUSED }
        }
        return (error as? IOError)?.errnoCode == ECONNREFUSED
    }

    /// Errors that only happen while a connection is being set up.
    private static let connectErrors: Set<Int32> = [ECONNREFUSED, EHOSTUNREACH, ENETUNREACH, EADDRNOTAVAIL]

    private static func describeCause(_ error: any Error) -> String {
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)).lowercased() }
        return "\(error)"
    }
}
