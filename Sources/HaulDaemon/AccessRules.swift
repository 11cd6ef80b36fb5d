import HTTPTypes
import Haul
import Hummingbird
import NIOCore
import Synchronization

/// The daemon's rules for every request, checked before any route runs:
///
/// 1. The `Host` must name the daemon: its listening address, `localhost`, a loopback address or a
///    name given with `--allow-host`. Anything else is a page of another site that resolved its
///    name to this machine (DNS rebinding): 421, and nothing is done.
/// 2. A request that changes something and carries an `Origin` must come from the daemon's own
///    page, or from an origin given with `--allow-origin` (a browser extension of the user's): a
///    foreign origin (a form or script of another site) gets 403.
/// 3. Every route but the page's own files needs `Authorization: Bearer TOKEN`: 401 otherwise.
/// 4. A body announced larger than the cap gets 413 before it is read (bodies read later are cut
///    off at the same cap).
struct AccessRules: RouterMiddleware {
    typealias Context = DaemonRequestContext

    let token: String
    /// Host names (lower case, without port) the daemon answers to.
    let allowedHosts: Set<String>
    /// Origins (lower case) besides the daemon's own whose requests may change something.
    let allowedOrigins: Set<String>
    let maxBodyBytes: Int
    /// Paths served without a token: the page's shell and its files, which hold no data.
    let publicPaths: Set<String>

    init(
        token: String, listeningHost: String, extraHosts: [String], extraOrigins: [String] = [], maxBodyBytes: Int,
        publicPaths: Set<String>
    ) {
        self.token = token
        var hosts: Set<String> = ["localhost", "127.0.0.1", "::1"]
        hosts.insert(Self.hostName(listeningHost))
        for host in extraHosts { hosts.insert(Self.hostName(host)) }
        // Listening on every address is not a name a browser would use for this machine.
        hosts.subtract(["0.0.0.0", "::"])
        self.allowedHosts = hosts
        self.allowedOrigins = Set(extraOrigins.map { $0.lowercased() })
        self.maxBodyBytes = maxBodyBytes
        self.publicPaths = publicPaths
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response)
        async throws -> Response
    {
        if let refusal = refusal(of: request.head, changesState: Self.changesState(request.method)) { throw refusal }
        if !publicPaths.contains(request.uri.path) {
            guard let given = Self.bearerToken(request.headers[.authorization]), DaemonFiles.tokensMatch(given, token)
            else { throw APIError.unauthorized() }
        }
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > maxBodyBytes {
            throw APIError.bodyTooLarge(maxBodyBytes)
        }
        var context = context
        context.maxBodyBytes = maxBodyBytes
        return try await next(request, context)
    }

    /// Why rules 1 and 2 refuse a request, if they do: its `Host` does not name the daemon, or it
    /// `changesState` and comes from another site's page. (A WebSocket is opened by a `GET` but
    /// changes state through its messages.)
    func refusal(of head: HTTPRequest, changesState: Bool) -> APIError? {
        guard let authority = head.authority, allowedHosts.contains(Self.hostName(authority)) else {
            return APIError(
                .misdirectedRequest, "forbiddenHost",
                "this daemon answers to \(allowedHosts.sorted().joined(separator: ", ")) only (see --allow-host)")
        }
        if changesState, let origin = head.headerFields[.origin], origin != "http://\(authority)",
            !allowedOrigins.contains(origin.lowercased())
        {
            return APIError(.forbidden, "forbiddenOrigin", "requests from another site's pages are refused")
        }
        return nil
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

/// A cap on the request rate of clients that passed the access rules, all together: a token
/// bucket of `perSecond` requests a second holding at most twice that. Past it, 429 with
/// `Retry-After`, and nothing is done. (Only requests with the token count, so a foreign page
/// cannot use the cap to lock the daemon's own clients out.)
struct RequestRateCap<Context: RequestContext>: RouterMiddleware {
    let bucket: RequestBucket
    /// Paths served without a token (the page's files): any site may request those, so they must
    /// not spend the tokens of the daemon's clients.
    let exempt: Set<String>

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response)
        async throws -> Response
    {
        if !exempt.contains(request.uri.path), let wait = bucket.take() {
            throw APIError(
                .tooManyRequests, "tooManyRequests",
                "more than \(bucket.perSecond) requests a second: wait and try again",
                headers: [.retryAfter: String(max(1, Int(wait.rounded(.up))))])
        }
        return try await next(request, context)
    }
}

/// The token bucket of ``RequestRateCap``, shared by every copy of the middleware.
final class RequestBucket: Sendable {
    private struct State {
        var tokens: Double
        var updated: Moment
    }

    let perSecond: Int
    private let clock: TransferClock
    private let state: Mutex<State>

    init(perSecond: Int, clock: TransferClock) {
        self.perSecond = max(1, perSecond)
        self.clock = clock
        self.state = Mutex(State(tokens: Double(2 * self.perSecond), updated: clock.now))
    }

    /// Takes a request's token; returns the seconds to wait instead when there is none.
    func take() -> Double? {
        let now = clock.now
        let rate = Double(perSecond)
        return state.withLock { state -> Double? in
            let elapsed = now - state.updated
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            state.tokens = min(2 * rate, state.tokens + max(0, seconds) * rate)
            state.updated = max(now, state.updated)
            guard state.tokens >= 1 else { return (1 - state.tokens) / rate }
            state.tokens -= 1
            return nil
        }
    }
}
