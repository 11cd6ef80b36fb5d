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
    static func describe(_ error: any Error, host: String) -> String {
        if let connection = error as? NIOConnectionError {
            let reason =
                connection.connectionErrors.first.map { describeCause($0.error) }
                ?? connection.dnsAError.map { "cannot resolve the name (\(describeCause($0)))" }
                ?? "no address to connect to"
            return "cannot connect to \(connection.host):\(connection.port): \(reason)"
        }
        return "transfer from \(host) failed: \(describeCause(error))"
    }

    private static func describeCause(_ error: any Error) -> String {
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)).lowercased() }
        return "\(error)"
    }
}
