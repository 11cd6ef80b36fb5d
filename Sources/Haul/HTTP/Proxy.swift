#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A proxy server, as curl names them: `http://[USER:PASSWORD@]HOST[:PORT]` (port 1080 by default, as
/// curl's), `socks5h://HOST[:PORT]` (the proxy resolves host names) or `socks5://HOST[:PORT]`.
/// Through an HTTP proxy, https requests go in a `CONNECT` tunnel (the server's certificate is
/// checked as without a proxy) and http requests are forwarded to their absolute URL, as curl does.
///
/// Credentials in a proxy's URL go to the proxy only (`Proxy-Authorization`), never to a server,
/// and are never stored or shown: ``description`` leaves them out.
public struct Proxy: Sendable, Hashable, CustomStringConvertible {
    /// How the proxy is spoken to.
    public enum Kind: String, Sendable {
        /// An HTTP proxy.
        case http
        /// A SOCKS5 proxy given addresses: Haul resolves host names itself, as curl does, and keeps
        /// an answer for a minute.
        case socks5
        /// A SOCKS5 proxy that resolves host names itself.
        case socks5h
    }

    /// How the proxy is spoken to.
    public var kind: Kind
    /// Its host name or address.
    public var host: String
    /// Its port.
    public var port: Int
    /// Credentials for the proxy itself (HTTP proxies only).
    public var credentials: BasicCredentials?

    /// A proxy with these parts.
    public init(kind: Kind, host: String, port: Int, credentials: BasicCredentials? = nil) {
        self.kind = kind
        self.host = host
        self.port = port
        self.credentials = credentials
    }

    /// Reads a proxy URL; without a scheme it is an HTTP proxy, as for curl.
    /// - Throws: ``HaulError/Code/invalidArgument`` for another scheme, a missing host, a bad port,
    ///   or credentials for a SOCKS proxy (which Haul cannot send).
    public init(parsing text: String) throws {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        let withScheme = trimmed.contains("://") ? trimmed : "http://" + trimmed
        guard let url = URL(string: withScheme), let scheme = url.scheme?.lowercased(), let host = url.host,
            !host.isEmpty
        else { throw HaulError(.invalidArgument, "not a proxy URL: \(Self.redacted(text))") }
        guard let kind = Kind(rawValue: scheme == "https" ? "" : scheme) else {
            throw HaulError(
                .invalidArgument, "unsupported proxy scheme \(scheme) (http, socks5 or socks5h): \(Self.redacted(text))"
            )
        }
        var credentials: BasicCredentials?
        if let user = url.user {
            credentials = BasicCredentials(
                user: user.removingPercentEncoding ?? user,
                password: (url.password ?? "").removingPercentEncoding ?? url.password ?? "")
            guard kind == .http else {
                throw HaulError(
                    .invalidArgument, "a SOCKS proxy with a user name is not supported: \(Self.redacted(text))")
            }
        }
        let port = url.port ?? 1080
        guard (1...65535).contains(port) else {
            throw HaulError(.invalidArgument, "the proxy's port is out of range: \(Self.redacted(text))")
        }
        self.init(
            kind: kind, host: host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host, port: port,
            credentials: credentials)
    }

    /// The proxy's URL without its credentials.
    public var description: String {
        let shownHost = host.contains(":") ? "[\(host)]" : host
        return "\(kind.rawValue)://\(shownHost):\(port)"
    }

    /// A proxy URL as it may be shown: the password replaced.
    static func redacted(_ text: String) -> String {
        guard let at = text.lastIndex(of: "@"), let start = text.range(of: "://")?.upperBound ?? text.indices.first,
            start < at
        else { return text }
        let userInfo = text[start..<at]
        let user = userInfo.prefix { $0 != ":" }
        return text[..<start] + user + (userInfo.count > user.count ? ":***" : "") + text[at...]
    }
}

/// Which proxy each URL goes through, decided for every request (redirects too) as curl decides:
/// the proxy for the URL's scheme, unless the host is in ``noProxy``.
public struct ProxySettings: Sendable, Equatable {
    /// The proxy for `http://` URLs.
    public var http: Proxy?
    /// The proxy for `https://` URLs.
    public var https: Proxy?
    /// Hosts reached directly: `*` (every one), host names (which also cover their subdomains; a
    /// leading dot is ignored), IP addresses, and CIDR ranges such as `10.0.0.0/8` or `fd00::/8`.
    public var noProxy: [String]

    /// No proxy at all.
    public init(http: Proxy? = nil, https: Proxy? = nil, noProxy: [String] = []) {
        self.http = http
        self.https = https
        self.noProxy = noProxy
    }

    /// The proxy a request to `url` goes through; `nil`: directly.
    public func proxy(for url: URL) -> Proxy? {
        let proxy = url.scheme?.lowercased() == "https" ? https : http
        guard let proxy, let host = url.host else { return nil }
        return Self.bypasses(host, noProxy) ? nil : proxy
    }

    /// Whether `host` is one the patterns send directly.
    static func bypasses(_ host: String, _ patterns: [String]) -> Bool {
        var host = host.lowercased()
        if host.hasPrefix("[") { host = String(host.dropFirst().dropLast()) }
        for raw in patterns {
            var pattern = raw.trimmingCharacters(in: .whitespaces).lowercased()
            if pattern.isEmpty { continue }
            if pattern == "*" { return true }
            if pattern.contains("/") {
                if IPAddress.contains(cidr: pattern, host) { return true }
                continue
            }
            if pattern.hasPrefix("[") { pattern = String(pattern.dropFirst().dropLast()) }
            if pattern.hasPrefix(".") { pattern.removeFirst() }
            if let left = IPAddress(pattern), let right = IPAddress(host) {
                if left == right { return true }
                continue
            }
            if host == pattern || host.hasSuffix("." + pattern) { return true }
        }
        return false
    }
}

/// An IPv4 or IPv6 address as bytes, for `no_proxy`'s addresses and ranges.
struct IPAddress: Equatable {
    let bytes: [UInt8]

    init?(_ text: String) {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            bytes = withUnsafeBytes(of: &v4) { Array($0) }
            return
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, text, &v6) == 1 else { return nil }
        bytes = withUnsafeBytes(of: &v6) { Array($0) }
    }

    /// Whether `host` is an address inside `cidr` (`ADDRESS/BITS`).
    static func contains(cidr: String, _ host: String) -> Bool {
        let parts = cidr.split(separator: "/")
        guard parts.count == 2, let network = IPAddress(String(parts[0])), let bits = Int(parts[1]),
            let address = IPAddress(host), address.bytes.count == network.bytes.count,
            (0...network.bytes.count * 8).contains(bits)
        else { return false }
        for index in 0..<network.bytes.count {
            let remaining = bits - index * 8
            if remaining <= 0 { break }
            let mask: UInt8 = remaining >= 8 ? 0xFF : ~(0xFF >> UInt8(remaining))
            if address.bytes[index] & mask != network.bytes[index] & mask { return false }
        }
        return true
    }
}
