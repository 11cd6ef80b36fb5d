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

    /// The http or https URL of the file.
    public var url: String
    /// Other http or https URLs that serve the same file (mirrors), tried after ``url``. When a
    /// ``checksum`` is given, or every server sends the same `Repr-Digest`, the file's ranges are
    /// spread over all of them and a mirror that fails or serves other bytes is dropped; otherwise
    /// nothing proves they hold the same bytes, and they are used one after another, never mixed.
    /// Credentials (``headers``, ``credentials``) go to ``url``'s origin only; cookies go where
    /// they match.
    public var mirrors: [String]
    /// Where the file goes.
    public var destination: Destination
    /// Extra request headers, e.g. `Authorization`. They are sent, never stored; `Authorization`
    /// and `Cookie` are dropped when a redirect leaves the origin.
    public var headers: [(name: String, value: String)]
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

    /// Whether a header carries credentials: such headers live only in the memory of the process
    /// that was given them, and go only to a daemon on the same machine.
    package static func carriesCredentials(_ name: String) -> Bool {
        ["authorization", "proxy-authorization", "cookie"].contains(name.lowercased())
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
