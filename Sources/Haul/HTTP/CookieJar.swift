import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Cookies as a browser keeps them, for files behind a login: read from a Netscape cookie file (the
/// format curl, wget and aria2 read and write), sent only where their domain, path and scheme match
/// and while they have not expired (after redirects too), and updated from the servers'
/// `Set-Cookie`. Cookies are credentials: Haul never writes them into its manifest or database;
/// ``netscapeText(now:)`` gives them back for the caller to save.
///
/// One jar may be shared by several downloads; it is safe to use from any task.
public final class CookieJar: Sendable {
    /// One cookie.
    public struct Cookie: Sendable, Equatable {
        /// The host, or the domain when ``includeSubdomains`` is set (no leading dot).
        public var domain: String
        /// Whether hosts below ``domain`` get it too.
        public var includeSubdomains: Bool
        /// Sent only for request paths at or below this one.
        public var path: String
        /// Sent only over https.
        public var secure: Bool
        /// Seconds since 1970 after which it is gone; `nil` for a cookie of the session.
        public var expires: Int64?
        /// Its name.
        public var name: String
        /// Its value.
        public var value: String
        /// Not for scripts (kept only to be written back).
        public var httpOnly: Bool

        /// A cookie with these parts.
        public init(
            domain: String, includeSubdomains: Bool = false, path: String = "/", secure: Bool = false,
            expires: Int64? = nil, name: String, value: String, httpOnly: Bool = false
        ) {
            self.domain = domain.lowercased()
            self.includeSubdomains = includeSubdomains
            self.path = path
            self.secure = secure
            self.expires = expires
            self.name = name
            self.value = value
            self.httpOnly = httpOnly
        }

        /// Whether it goes with a request to `url` at `now`.
        func matches(_ url: URL, now: Int64) -> Bool {
            guard let host = url.host?.lowercased() else { return false }
            if let expires, expires <= now { return false }
            if secure && url.scheme?.lowercased() != "https" { return false }
            guard host == domain || (includeSubdomains && host.hasSuffix("." + domain)) else { return false }
            let requestPath = url.path.isEmpty ? "/" : url.path
            guard requestPath.hasPrefix(path) else { return false }
            return requestPath.count == path.count || path.hasSuffix("/")
                || requestPath.dropFirst(path.count).first == "/"
        }
    }

    private let stored: Mutex<[Cookie]>

    /// A jar holding `cookies`.
    public init(cookies: [Cookie] = []) {
        stored = Mutex(cookies)
    }

    /// A jar holding the cookies of a Netscape cookie file's text that have not expired at `now`.
    /// - Throws: ``HaulError/Code/invalidArgument`` naming the first line that is not a cookie.
    public convenience init(netscape text: String, now: Int64) throws {
        var cookies: [Cookie] = []
        for (index, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            var line = raw.hasSuffix("\r") ? raw.dropLast() : raw
            var httpOnly = false
            if line.hasPrefix("#HttpOnly_") {
                httpOnly = true
                line = line.dropFirst("#HttpOnly_".count)
            } else if line.hasPrefix("#") || line.allSatisfy({ $0 == " " || $0 == "\t" }) {
                continue
            }
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false)
            guard fields.count == 7, let expiry = Int64(fields[4]) else {
                throw HaulError(
                    .invalidArgument,
                    "line \(index + 1) of the cookie file is not a cookie (7 fields separated by tabs: domain, "
                        + "subdomains, path, secure, expiry, name, value)")
            }
            let domain = fields[0].hasPrefix(".") ? fields[0].dropFirst() : fields[0]
            let cookie = Cookie(
                domain: String(domain), includeSubdomains: fields[1].uppercased() == "TRUE" || fields[0].hasPrefix("."),
                path: String(fields[2]), secure: fields[3].uppercased() == "TRUE", expires: expiry == 0 ? nil : expiry,
                name: String(fields[5]), value: String(fields[6]), httpOnly: httpOnly)
            if let expires = cookie.expires, expires <= now { continue }
            cookies.append(cookie)
        }
        self.init(cookies: cookies)
    }

    /// Every cookie held.
    public var cookies: [Cookie] { stored.withLock { $0 } }

    /// The `Cookie` header value for a request to `url` at `now` (longer paths first, as browsers
    /// send them); `nil` when no cookie goes there.
    public func header(for url: URL, now: Int64) -> String? {
        let matching = stored.withLock { cookies in cookies.filter { $0.matches(url, now: now) } }
        guard !matching.isEmpty else { return nil }
        return matching.sorted { $0.path.count > $1.path.count }.map { "\($0.name)=\($0.value)" }
            .joined(separator: "; ")
    }

    /// Takes in the `Set-Cookie` values of an answer from `url` at `now` (RFC 6265): a `Domain`
    /// that does not cover the host is refused, `Max-Age` wins over `Expires`, and one that has
    /// expired removes the cookie of the same name, domain and path.
    public func store(setCookie values: [String], from url: URL, now: Int64) {
        guard let host = url.host?.lowercased() else { return }
        for value in values {
            guard let cookie = Self.parse(value, host: host, path: url.path, now: now) else { continue }
            stored.withLock { cookies in
                cookies.removeAll { $0.name == cookie.name && $0.domain == cookie.domain && $0.path == cookie.path }
                if cookie.expires.map({ $0 > now }) ?? true { cookies.append(cookie) }
            }
        }
    }

    /// The cookies that have not expired at `now`, in the Netscape format curl, wget and aria2 read.
    public func netscapeText(now: Int64) -> String {
        var text =
            "# Netscape HTTP Cookie File\n# Written by haul. Cookies are credentials: keep this file private.\n\n"
        for cookie in cookies where cookie.expires.map({ $0 > now }) ?? true {
            let domain = (cookie.httpOnly ? "#HttpOnly_" : "") + (cookie.includeSubdomains ? "." : "") + cookie.domain
            let fields = [
                domain, cookie.includeSubdomains ? "TRUE" : "FALSE", cookie.path, cookie.secure ? "TRUE" : "FALSE",
                String(cookie.expires ?? 0), cookie.name, cookie.value,
            ]
            text += fields.joined(separator: "\t") + "\n"
        }
        return text
    }

    private static func parse(_ header: String, host: String, path: String, now: Int64) -> Cookie? {
        let parts = header.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }
        guard let pair = parts.first, let equals = pair.firstIndex(of: "="), equals != pair.startIndex else {
            return nil
        }
        var cookie = Cookie(
            domain: host, path: defaultPath(path), name: String(pair[..<equals]),
            value: String(pair[pair.index(after: equals)...]))
        var maxAge: Int64?
        for attribute in parts.dropFirst() {
            let (name, value) = Self.split(attribute)
            switch name.lowercased() {
            case "domain":
                var domain = value.lowercased()
                if domain.hasPrefix(".") { domain.removeFirst() }
                // A server may widen a cookie only to a domain it belongs to.
                guard !domain.isEmpty, host == domain || host.hasSuffix("." + domain) else { return nil }
                cookie.domain = domain
                cookie.includeSubdomains = true
            case "path" where value.hasPrefix("/"): cookie.path = value
            case "secure": cookie.secure = true
            case "httponly": cookie.httpOnly = true
            case "max-age": maxAge = Int64(value).map { now + $0 }
            case "expires": cookie.expires = cookie.expires ?? HTTPDate.parse(value)
            default: break
            }
        }
        if let maxAge { cookie.expires = maxAge }
        return cookie
    }

    private static func split(_ attribute: String) -> (String, String) {
        guard let equals = attribute.firstIndex(of: "=") else { return (attribute, "") }
        return (
            attribute[..<equals].trimmingCharacters(in: .whitespaces),
            attribute[attribute.index(after: equals)...].trimmingCharacters(in: .whitespaces)
        )
    }

    /// The directory of a request path (RFC 6265 §5.1.4).
    private static func defaultPath(_ path: String) -> String {
        guard path.hasPrefix("/"), let slash = path.lastIndex(of: "/"), slash != path.startIndex else { return "/" }
        return String(path[..<slash])
    }
}
