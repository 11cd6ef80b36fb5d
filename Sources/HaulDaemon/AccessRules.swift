import HTTPTypes
import Haul
import Hummingbird
import NIOCore

/// The daemon's rules for every request, checked before any route runs:
///
/// 1. The `Host` must name the daemon: its listening address, `localhost`, a loopback address or a
///    name given with `--allow-host`. Anything else is a page of another site that resolved its
///    name to this machine (DNS rebinding): 421, and nothing is done.
/// 2. A request that changes something and carries an `Origin` must come from the daemon's own
///    page: a foreign origin (a form or script of another site) gets 403.
/// 3. Every route but the page's own files needs `Authorization: Bearer TOKEN`: 401 otherwise.
/// 4. A body announced larger than the cap gets 413 before it is read (bodies read later are cut
///    off at the same cap).
struct AccessRules<Context: RequestContext>: RouterMiddleware {
    let token: String
    /// Host names (lower case, without port) the daemon answers to.
    let allowedHosts: Set<String>
    let maxBodyBytes: Int
    /// Paths served without a token: the page's shell and its files, which hold no data.
    let publicPaths: Set<String>

    init(token: String, listeningHost: String, extraHosts: [String], maxBodyBytes: Int, publicPaths: Set<String>) {
        self.token = token
        var hosts: Set<String> = ["localhost", "127.0.0.1", "::1"]
        hosts.insert(Self.hostName(listeningHost))
        for host in extraHosts { hosts.insert(Self.hostName(host)) }
        // Listening on every address is not a name a browser would use for this machine.
        hosts.subtract(["0.0.0.0", "::"])
        self.allowedHosts = hosts
        self.maxBodyBytes = maxBodyBytes
        self.publicPaths = publicPaths
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response)
        async throws -> Response
    {
        guard let authority = request.head.authority, allowedHosts.contains(Self.hostName(authority)) else {
            throw APIError(
                .misdirectedRequest, "forbiddenHost",
                "this daemon answers to \(allowedHosts.sorted().joined(separator: ", ")) only (see --allow-host)")
        }
        if Self.changesState(request.method), let origin = request.headers[.origin], origin != "http://\(authority)" {
            throw APIError(.forbidden, "forbiddenOrigin", "requests from another site's pages are refused")
        }
        if !publicPaths.contains(request.uri.path) {
            guard let given = Self.bearerToken(request.headers[.authorization]), DaemonFiles.tokensMatch(given, token)
            else { throw APIError.unauthorized() }
        }
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > maxBodyBytes {
            throw APIError.bodyTooLarge(maxBodyBytes)
        }
        return try await next(request, context)
    }

    static func changesState(_ method: HTTPRequest.Method) -> Bool {
        method != .get && method != .head && method != .options
    }

    /// The token of `Authorization: Bearer TOKEN`.
    static func bearerToken(_ header: String?) -> Substring? {
        guard let header else { return nil }
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        return parts[1].drop { $0 == " " }
    }

    /// The host of a `Host` value or an address, lower case, without port or brackets.
    static func hostName(_ authority: String) -> String {
        var host = Substring(authority.lowercased())
        if host.hasPrefix("[") {
            host = host.dropFirst().prefix { $0 != "]" }
        } else if host.filter({ $0 == ":" }).count == 1 {
            host = host.prefix { $0 != ":" }
        }
        return String(host)
    }
}
