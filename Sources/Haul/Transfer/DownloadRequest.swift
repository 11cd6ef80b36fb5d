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
    /// The limiter that keeps ``bytesPerSecondLimit``, when its holder may change the rate while the
    /// download runs (a queue's running download); never stored or compared.
    package var rateLimiter: RateLimiter?
    /// The connections this download opens at once when the server serves ranges, from 1 to
    /// ``maximumConnections`` (`nil`: as the downloader's
    /// ``DownloaderConfiguration/Segmentation`` says).
    public var connections: Int?

    /// A short text of the user's own, shown beside the download (`haul ls`, the API, the page):
    /// at most ``maximumLabelLength`` Unicode scalars, with no control or invisible formatting character.
    public var label: String?

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
    /// The most Unicode scalars (JSON Schema's characters) a ``label`` may have.
    public static let maximumLabelLength = 200

    /// A request for `url` into `destination`; the rest has defaults (no extra headers, no overwriting,
    /// no checksum, no limit of its own, the downloader's connections).
    public init(
        url: String, destination: Destination, headers: [(name: String, value: String)] = [], overwrite: Bool = false,
        checksum: Checksum? = nil, bytesPerSecondLimit: Int64? = nil, connections: Int? = nil,
        cookies: CookieJar? = nil,
        mirrors: [String] = [], label: String? = nil
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
        self.label = label
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
        // Most URLs have no `@` at all: nothing to look for.
        guard url.utf8.contains(UInt8(ascii: "@")), let schemeEnd = url.range(of: "://") else { return (url, nil) }
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
            guard isToken(name) else {
                throw HaulError(
                    .invalidArgument,
                    "invalid header name \"\(header.name)\": letters, digits and !#$%&'*+-.^_`|~ only")
            }
            guard !header.value.utf8.contains(where: { $0 == 0x0A || $0 == 0x0D || $0 == 0 }) else {
                throw HaulError(.invalidArgument, "header \(header.name) contains a line break")
            }
            guard !reserved.contains(name) else {
                throw HaulError(.invalidArgument, "header \(header.name) is managed by Haul and cannot be set")
            }
        }
    }

    /// Whether `name` is a token (RFC 9110 §5.6.2), as a header name must be: letters, digits and
    /// ``!#$%&'*+-.^_`|~``.
    static func isToken(_ name: String) -> Bool {
        !name.isEmpty
            && name.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                    || Array("!#$%&'*+-.^_`|~".utf8).contains(byte)
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
        if let label {
            guard label.unicodeScalars.count <= Self.maximumLabelLength else {
                throw HaulError(.invalidArgument, "a label has at most \(Self.maximumLabelLength) characters")
            }
            let hidden: Set<Unicode.GeneralCategory> = [.control, .format, .lineSeparator, .paragraphSeparator]
            guard !label.unicodeScalars.contains(where: { hidden.contains($0.properties.generalCategory) }) else {
                throw HaulError(.invalidArgument, "a label cannot hold control or invisible formatting characters")
            }
        }
        return parsed
    }

    /// Where the file may come from, parsed: ``url``, then ``mirrors``; throws as ``check()`` does.
    package func sources() throws -> [DownloadURL] {
        let parsed = try DownloadURL(url)
        return [parsed] + (try checkMirrors(of: parsed))
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

/// A request as JSON: what the download manager stores, what the daemon's API takes and shows, and
/// what ``DaemonClient`` sends. Its secrets are left out here and nowhere else: secret headers
/// (see ``isSecret(_:)``), and so the credentials, are written only for an encoder whose `userInfo`
/// holds ``includesSecrets`` (a client sending to a daemon on the same machine); cookies never are.
///
/// ```json
/// {"url": "https://example.com/a.iso", "directory": "/data",
///  "headers": [{"name": "X-Trace", "value": "7"}], "checksum": "sha256=9f86…"}
/// ```
///
/// Fields at their defaults (no mirrors, no headers, no overwriting, no limit) are left out; a
/// missing or `null` field means its default. `destination` names the file and `directory` the
/// folder the server names it in; neither means the current directory (the daemon's first
/// download root). Values are decoded as given: ``check()`` says whether a download can use them.
extension DownloadRequest: Codable {
    /// The `userInfo` key that makes an encoder write secret headers too, marked `"secret": true`.
    public static let includesSecrets = CodingUserInfoKey(rawValue: "haul.includesSecrets")!
    /// The `userInfo` key that makes a decoder read a download's description, where `destination`
    /// beside `directory` is the file the server named in it (a request names one or the other).
    package static let describesDownload = CodingUserInfoKey(rawValue: "haul.describesDownload")!

    private enum CodingKeys: String, CodingKey {
        case url, mirrors, destination, directory, headers, overwrite, checksum, limitRate, connections, label
    }

    /// Each field's JSON Schema, as the daemon's API document shows it for a download to add and a
    /// download shown: the daemon puts them into the document it serves, so the document and the
    /// coding above cannot drift apart (a test encodes every field and finds each one here).
    package static let fieldSchemas: [(name: String, schema: String)] = [
        (
            "url",
            #"""
            {
              "type": "string",
              "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[!-\"$-.0->@-~][!-~]*$",
              "description": "An http or https URL."
            }
            """#
        ),
        (
            "destination",
            #"""
            {
              "type": ["string", "null"],
              "pattern": "^[^\\u0000]+$",
              "description": "The file to write; relative to the first download root. Not with directory."
            }
            """#
        ),
        (
            "directory",
            #"""
            {
              "type": ["string", "null"],
              "pattern": "^[^\\u0000]+$",
              "description": "The directory to write into, the file named by the server; relative to the first download root. Neither given: the first root."
            }
            """#
        ),
        (
            "headers",
            #"""
            {
              "type": ["array", "null"],
              "items": {
                "type": "object",
                "required": ["name", "value"],
                "properties": {
                  "name": {
                    "type": "string",
                    "pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"
                  },
                  "value": {
                    "type": "string",
                    "pattern": "^[^\\r\\n]*$"
                  },
                  "secret": {
                    "type": ["boolean", "null"],
                    "description": "Hold this header as secret: never stored, sent to the URL's origin only. Authorization, Proxy-Authorization, Cookie and names with auth, token, secret, password, session, credential or signature in them, or ending in key, are secret anyway."
                  }
                }
              },
              "description": "Request headers; secret ones are held in memory only and go to the URL's origin only."
            }
            """#
        ),
        (
            "mirrors",
            #"""
            {
              "type": ["array", "null"],
              "items": {
                "type": "string",
                "format": "uri"
              },
              "maxItems": 16,
              "description": "Other http or https URLs of the same file (at most 16). With a checksum, or when every server sends the same Repr-Digest, ranges come from all of them; otherwise they are used one after another, never mixed."
            }
            """#
        ),
        (
            "overwrite",
            #"""
            {
              "type": ["boolean", "null"],
              "description": "Replace an existing file once the download is complete."
            }
            """#
        ),
        (
            "checksum",
            #"""
            {
              "type": ["string", "null"],
              "pattern": "^([Mm][Dd]5[=:][0-9A-Fa-f]{32}|[Ss][Hh][Aa]([-_]?1)?[=:][0-9A-Fa-f]{40}|[Ss][Hh][Aa][-_]?256[=:][0-9A-Fa-f]{64}|[Ss][Hh][Aa][-_]?512[=:][0-9A-Fa-f]{128})$",
              "description": "ALGORITHM=HEX (md5, sha-1, sha-256, sha-512), e.g. sha256=9f86..."
            }
            """#
        ),
        (
            "limitRate",
            #"""
            {
              "type": ["integer", "null"],
              "format": "int64",
              "minimum": 1,
              "maximum": 9223372036854775807,
              "description": "This download's limit, in bytes per second."
            }
            """#
        ),
        (
            "connections",
            #"""
            {
              "type": ["integer", "null"],
              "minimum": 1,
              "maximum": 64,
              "description": "Connections to open at once when the server serves ranges; absent: the daemon's default."
            }
            """#
        ),
        (
            "label",
            #"""
            {
              "type": ["string", "null"],
              "maxLength": 200,
              "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u0600-\\u0605\\u061c\\u06dd\\u070f\\u0890\\u0891\\u08e2\\u180e\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u2064\\u2066-\\u206f\\ufeff\\ufff9-\\ufffb\\ud800-\\udfff]*$",
              "description": "A short text of the user's own, shown beside the download (haul ls, the page); at most 200 characters, no control or invisible formatting character."
            }
            """#
        ),
    ]

    /// A request header as JSON: `{"name": …, "value": …}`, with `"secret": true` for one to hold
    /// as secret (see ``isSecret(_:)``).
    package struct Header: Codable, Sendable {
        /// The header's name.
        package var name: String
        /// Its value.
        package var value: String
        /// Whether to hold it as secret; `nil`: as its name says (see ``looksSecret(_:)``).
        package var secret: Bool?

        /// A header as JSON names it.
        package init(name: String, value: String, secret: Bool? = nil) {
            self.name = name
            self.value = value
            self.secret = secret
        }
    }

    /// The request a JSON object describes; throws `DecodingError` for one that is not shaped as
    /// above (a checksum that does not parse, a destination and a directory both).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let file = try container.decodeIfPresent(String.self, forKey: .destination)
        let folder = try container.decodeIfPresent(String.self, forKey: .directory)
        // In a download's description (DownloadInfo as the daemon shows it) the file a directory's
        // download was given by the server stands beside the directory.
        let described = decoder.userInfo[Self.describesDownload] as? Bool == true
        if file != nil && folder != nil && !described {
            throw DecodingError.dataCorruptedError(
                forKey: .directory, in: container, debugDescription: "give destination or directory, not both")
        }
        var checksum: Checksum?
        if let text = try container.decodeIfPresent(String.self, forKey: .checksum) {
            do { checksum = try Checksum(parsing: text) } catch let error as HaulError {
                throw DecodingError.dataCorruptedError(
                    forKey: .checksum, in: container, debugDescription: error.message)
            }
        }
        let headers = try container.decodeIfPresent([Header].self, forKey: .headers) ?? []
        self.init(
            url: try container.decode(String.self, forKey: .url),
            destination: folder.map(Destination.directory) ?? file.map(Destination.file) ?? .directory("."),
            headers: headers.map { (name: $0.name, value: $0.value) },
            overwrite: try container.decodeIfPresent(Bool.self, forKey: .overwrite) ?? false, checksum: checksum,
            bytesPerSecondLimit: try container.decodeIfPresent(Int64.self, forKey: .limitRate),
            connections: try container.decodeIfPresent(Int.self, forKey: .connections),
            mirrors: try container.decodeIfPresent([String].self, forKey: .mirrors) ?? [],
            label: try container.decodeIfPresent(String.self, forKey: .label))
        secretHeaders = Set(headers.filter { $0.secret == true }.map(\.name))
    }

    /// Writes the request as JSON, its secret headers only for an encoder that asks for them.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(url, forKey: .url)
        switch destination {
        case .file(let path): try container.encode(path, forKey: .destination)
        case .directory(let path): try container.encode(path, forKey: .directory)
        }
        let secrets = encoder.userInfo[Self.includesSecrets] as? Bool == true
        let headers = self.headers.compactMap { header -> Header? in
            let secret = isSecret(header.name)
            if secret && !secrets { return nil }
            return Header(name: header.name, value: header.value, secret: secret ? true : nil)
        }
        if !headers.isEmpty { try container.encode(headers, forKey: .headers) }
        if !mirrors.isEmpty { try container.encode(mirrors, forKey: .mirrors) }
        if overwrite { try container.encode(true, forKey: .overwrite) }
        try container.encodeIfPresent(checksum?.description, forKey: .checksum)
        try container.encodeIfPresent(bytesPerSecondLimit, forKey: .limitRate)
        try container.encodeIfPresent(connections, forKey: .connections)
        try container.encodeIfPresent(label, forKey: .label)
    }
}

extension DownloadRequest: Equatable {
    /// Whether two requests ask for the same download in the same way: every field alike, headers
    /// in the same order, and the same cookie jar (or none).
    public static func == (left: DownloadRequest, right: DownloadRequest) -> Bool {
        left.url == right.url && left.mirrors == right.mirrors && left.destination == right.destination
            && left.headers.elementsEqual(right.headers, by: { $0.name == $1.name && $0.value == $1.value })
            && left.secretHeaders == right.secretHeaders && left.overwrite == right.overwrite
            && left.checksum == right.checksum && left.bytesPerSecondLimit == right.bytesPerSecondLimit
            && left.connections == right.connections && left.cookies === right.cookies && left.label == right.label
    }
}
