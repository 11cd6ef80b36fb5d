#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// What to download and where to put it.
public struct DownloadRequest: Sendable {
    /// Where the finished file goes.
    public enum Destination: Sendable, Equatable {
        /// Exactly this path.
        case file(String)
        /// A file in this directory, named by the server's `Content-Disposition`, else the URL's last
        /// path segment, else `index.html`; always sanitized so it stays inside the directory.
        case directory(String)
    }

    /// The http or https URL of the file. Credentials written into it (`https://user:pass@host/…`)
    /// are taken out as soon as it is set: they become ``credentials`` (unless credentials are given
    /// already, which win, as curl's `-u` does), so the URL that is stored, shown, logged or handed to
    /// a hook never holds them.
    public var url: String {
        didSet { moveCredentialsOutOfURL() }
    }
    /// Other http or https URLs that serve the same file (mirrors), tried after ``url``. When a
    /// ``checksum`` is given, or every server sends the same `Repr-Digest`, the file's ranges are
    /// spread over all of them and a mirror that fails or serves other bytes is dropped; otherwise
    /// nothing proves they hold the same bytes, and they are used one after another, never mixed.
    /// Credentials (``headers``, ``credentials``) go to ``url``'s origin only; cookies go where
    /// they match.
    public var mirrors: [String]
    /// Where the file goes.
    public var destination: Destination
    /// Extra request headers. Secret ones (see ``isSecret(_:)``) are held in memory only and go to
    /// ``url``'s origin only; the others are stored with a queued download.
    public var headers: [(name: String, value: String)]
    /// Names of further headers to treat as secret, beside those ``isSecret(_:)`` knows by name
    /// (`haul get --secret-header NAME`); compared without regard to case.
    public var secretHeaders: Set<String> = []
    /// Replace an existing file at the destination once the new one is complete.
    public var overwrite: Bool
    /// The digest the complete file must have; checked before the file gets its final name.
    public var checksum: Checksum?
    /// The most bytes per second this download may receive (`nil`: no limit of its own).
    public var bytesPerSecondLimit: Int64?
    /// The connections this download opens at once when the server serves ranges, from 1 to
    /// ``maximumConnections`` (`nil`: as the downloader's
    /// ``DownloaderConfiguration/Segmentation`` says).
    public var connections: Int?

    /// Cookies to send where they match, after redirects too, and to update from the servers'
    /// `Set-Cookie`; held in memory only (see ``CookieJar``).
    public var cookies: CookieJar?

    /// HTTP Basic credentials, carried as the request's `Authorization` header: sent to the URL's
    /// origin only (a redirect elsewhere drops them, as any `Authorization`), never stored, so a
    /// resume in a later process needs them again.
    public var credentials: BasicCredentials? {
        get {
            headers.first { $0.name.lowercased() == "authorization" }.flatMap {
                BasicCredentials(authorization: $0.value)
            }
        }
        set { headers = Self.headers(headers, with: newValue) }
    }

    /// `headers` with their `Authorization` replaced by one carrying `credentials` (removed for `nil`).
    package static func headers(_ headers: [(name: String, value: String)], with credentials: BasicCredentials?)
        -> [(name: String, value: String)]
    {
        var headers = headers.filter { $0.name.lowercased() != "authorization" }
        if let credentials { headers.append((name: "Authorization", value: credentials.authorization)) }
        return headers
    }

    /// The most connections one download may ask for.
    public static let maximumConnections = 64
    /// The most mirrors one download may name.
    public static let maximumMirrors = 16

    /// A request for `url` into `destination`; the rest has defaults (no extra headers, no overwriting,
    /// no checksum, no limit of its own, the downloader's connections).
    public init(
        url: String, destination: Destination, headers: [(name: String, value: String)] = [], overwrite: Bool = false,
        checksum: Checksum? = nil, bytesPerSecondLimit: Int64? = nil, connections: Int? = nil,
        cookies: CookieJar? = nil,
        mirrors: [String] = []
    ) {
        self.url = url
        self.mirrors = mirrors
        self.destination = destination
        self.headers = headers
        self.overwrite = overwrite
        self.checksum = checksum
        self.bytesPerSecondLimit = bytesPerSecondLimit
        self.connections = connections
        self.cookies = cookies
        moveCredentialsOutOfURL()
    }

    /// Takes the credentials written into ``url`` out of it, into ``credentials`` unless some are
    /// given already.
    private mutating func moveCredentialsOutOfURL() {
        let (plain, found) = Self.splittingCredentials(url)
        guard let found else { return }
        url = plain
        if credentials == nil { credentials = found }
    }

    /// `url` without the user information of its authority, and the credentials it held
    /// (percent-decoded); `url` itself and `nil` when it holds none.
    package static func splittingCredentials(_ url: String) -> (url: String, credentials: BasicCredentials?) {
        guard let schemeEnd = url.range(of: "://") else { return (url, nil) }
        let authorityStart = schemeEnd.upperBound
        let authorityEnd = url[authorityStart...].firstIndex { "/?#".contains($0) } ?? url.endIndex
        guard let at = url[authorityStart..<authorityEnd].lastIndex(of: "@") else { return (url, nil) }
        let userInformation = url[authorityStart..<at]
        let plain = String(url[..<authorityStart] + url[url.index(after: at)...])
        let parts = userInformation.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
        let decode = { (part: Substring) in String(part).removingPercentEncoding ?? String(part) }
        let credentials = BasicCredentials(user: decode(parts[0]), password: parts.count > 1 ? decode(parts[1]) : "")
        return (plain, credentials)
    }

    /// Throws ``HaulError/Code/invalidArgument`` for a header that is not valid (no name, a line
    /// break or NUL in its value) or that Haul manages itself (`Range`, `Host`, …).
    package static func check(headers: [(name: String, value: String)]) throws {
        let reserved = ["range", "if-range", "accept-encoding", "host", "content-length", "transfer-encoding"]
        for header in headers {
            let name = header.name.lowercased()
            guard !name.isEmpty, name.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: ":") }) else {
                throw HaulError(.invalidArgument, "invalid header name \"\(header.name)\"")
            }
            guard !header.value.utf8.contains(where: { $0 == 0x0A || $0 == 0x0D || $0 == 0 }) else {
                throw HaulError(.invalidArgument, "header \(header.name) contains a line break")
            }
            guard !reserved.contains(name) else {
                throw HaulError(.invalidArgument, "header \(header.name) is managed by Haul and cannot be set")
            }
        }
    }

    /// Whether the header `name` is secret in this request: one Haul knows by name (see
    /// ``looksSecret(_:)``) or one of ``secretHeaders``.
    ///
    /// Secret headers are held in the memory of the process that was given them, never stored (a
    /// queued download resumed by a later process needs them again); they go to ``url``'s origin
    /// only, dropped on a redirect to another scheme, host or port and never sent to a mirror
    /// elsewhere; and they go only to a haul daemon on the same machine. Stricter than curl, which
    /// drops only `Authorization` and `Cookie` on such a redirect: a token in `X-Api-Key` is worth
    /// as much to whoever runs the other host.
    public func isSecret(_ name: String) -> Bool { Self.isSecret(name, marked: secretHeaders) }

    /// Whether the header `name` is secret when the names in `marked` are marked so.
    package static func isSecret(_ name: String, marked: Set<String>) -> Bool {
        looksSecret(name) || marked.contains { $0.lowercased() == name.lowercased() }
    }

    /// Whether the header `name` is secret whatever the request: `Authorization`,
    /// `Proxy-Authorization`, `Cookie`, and names that look like credentials: with `auth`, `token`,
    /// `secret`, `password`, `session`, `credential` or `signature` in them, or ending in `key` (`X-Api-Key`,
    /// `X-Auth-Token`, `Private-Token`, `Ocp-Apim-Subscription-Key`).
    public static func looksSecret(_ name: String) -> Bool {
        let name = name.lowercased()
        if name == "cookie" || name.hasSuffix("key") { return true }
        return ["auth", "token", "secret", "password", "passwd", "session", "credential", "signature"].contains {
            name.contains($0)
        }
    }

    /// Throws ``HaulError`` for what no download could use: a URL that is not http or https, a header
    /// that is not valid or that Haul manages itself, a limit or a connection count out of range, a
    /// mirror that is not an http or https URL or that repeats another. Returns the URL, parsed.
    @discardableResult
    package func check() throws -> DownloadURL {
        let parsed = try DownloadURL(url)
        _ = try checkMirrors(of: parsed)
        try Self.check(headers: headers)
        if let limit = bytesPerSecondLimit, limit <= 0 {
            throw HaulError(
                .invalidArgument, "a rate limit must be a positive number of bytes per second, not \(limit)")
        }
        if let connections, !(1...Self.maximumConnections).contains(connections) {
            throw HaulError(
                .invalidArgument, "connections must be from 1 to \(Self.maximumConnections), not \(connections)")
        }
        return parsed
    }

    /// The mirrors, parsed; throws for one that is not an http or https URL, or that names the
    /// same URL as ``url`` or another mirror.
    package func checkMirrors(of parsed: DownloadURL) throws -> [DownloadURL] {
        guard mirrors.count <= Self.maximumMirrors else {
            throw HaulError(.invalidArgument, "at most \(Self.maximumMirrors) mirrors, not \(mirrors.count)")
        }
        var seen: Set<String> = [parsed.string]
        return try mirrors.map { mirror in
            if Self.splittingCredentials(mirror).credentials != nil {
                throw HaulError(
                    .invalidArgument,
                    "mirror \(Self.splittingCredentials(mirror).url) has credentials in its URL: mirrors get none")
            }
            let url: DownloadURL
            do { url = try DownloadURL(mirror) } catch let error as HaulError {
                throw HaulError(error.code, "mirror: \(error.message)")
            }
            guard seen.insert(url.string).inserted else {
                throw HaulError(.invalidArgument, "mirror \(mirror) is named twice")
            }
            return url
        }
    }
}
