import AsyncHTTPClient
import Logging
import NIOCore
import NIOHTTP1

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Sends the requests of one download, following redirects by hand so credentials never leave their
/// origin, and tells what a transport failure means for the transfer.
struct HTTPFetcher: Sendable {
    let url: DownloadURL
    /// The request's URL, then its mirrors: the sources a request may go to.
    let sources: [DownloadURL]
    let request: DownloadRequest
    let clients: ProxiedLanes
    /// The cap on connections to one host, if any: every request enters it before it is sent.
    let hostCap: HostConnectionCap?
    let configuration: DownloaderConfiguration
    let logger: Logger

    /// A fetcher of `request` from `sources` (its URL, then its mirrors: see
    /// ``DownloadRequest/sources()``).
    init(
        sources: [DownloadURL], request: DownloadRequest, clients: ProxiedLanes, hostCap: HostConnectionCap?,
        configuration: DownloaderConfiguration, logger: Logger
    ) {
        precondition(!sources.isEmpty, "a download has a URL")
        self.url = sources[0]
        self.sources = sources
        self.request = request
        self.clients = clients
        self.hostCap = hostCap
        self.configuration = configuration
        self.logger = logger
    }

    /// Sends `ask` on connection `connection` to source `source` (0: the request's URL, then its
    /// mirrors) and gives `consume` the final (non-redirect) answer and its URL; returns what
    /// `consume` returns. Credentials the caller gave go to the request URL's origin only: a mirror
    /// elsewhere gets none. `waiting` hears `true` when a request waits for a connection to its host
    /// (``DownloaderConfiguration/maxConnectionsPerHost``), `false` when it got one.
    func fetch<Result>(
        _ ask: RangeAsk, connection: Int, source: Int = 0, waiting: (Bool) -> Void = { _ in },
        _ consume: (HTTPClientResponse, DownloadURL) async -> Result
    ) async throws -> Result {
        var current = sources.indices.contains(source) ? sources[source] : url
        var headers = RedirectPolicy.headers(
            request.headers.map { ($0.name, $0.value) }, from: url, to: current, isSecret: request.isSecret)
        if !headers.contains(where: { $0.0.lowercased() == "user-agent" }) {
            headers.append(("User-Agent", configuration.userAgent))
        }
        headers.append(("Accept-Encoding", "identity"))
        headers += ask.headers
        var visited: Set<String> = [current.string]
        let redirects = configuration.redirects
        for _ in 0...redirects.maximum {
            var outgoing = HTTPClientRequest(url: current.string)
            outgoing.method = .GET
            for (name, value) in headers { outgoing.headers.add(name: name, value: value) }
            // Cookies expire at calendar dates: they are compared with the calendar, not the transfer's clock.
            let now = request.cookies == nil ? 0 : Int64(Date().timeIntervalSince1970)
            if let jar = request.cookies, let cookies = jar.header(for: current.url, now: now) {
                // One Cookie header: the jar's cookies join any the caller gave for this origin.
                let given = outgoing.headers.first(name: "cookie")
                outgoing.headers.replaceOrAdd(name: "Cookie", value: given.map { $0 + "; " + cookies } ?? cookies)
            }
            let from = current
            let hop: Hop<Result> = try await exchange(outgoing, to: current, connection: connection, waiting: waiting) {
                response in
                request.cookies?.store(setCookie: response.headers["set-cookie"], from: from.url, now: now)
                guard [301, 302, 303, 307, 308].contains(response.status.code),
                    let location = response.headers.first(name: "location")
                else { return .answer(await consume(response, from)) }
                _ = try? await response.body.collect(upTo: 64 * 1024)
                return .redirect(location)
            }
            switch hop {
            case .answer(let result):
                return result
            case .redirect(let location):
                let next: DownloadURL
                (next, headers) = try RedirectPolicy.follow(
                    location: location, from: current, headers: headers, allowHTTPSToHTTP: redirects.allowHTTPSToHTTP,
                    isSecret: request.isSecret)
                guard visited.insert(next.string).inserted else {
                    throw HaulError(.redirectRefused, "redirect loop at \(next.string)")
                }
                logger.debug("redirected", metadata: ["from": "\(current.string)", "to": "\(next.string)"])
                current = next
            }
        }
        throw HaulError(.redirectRefused, "more than \(redirects.maximum) redirects from \(url.string)")
    }

    /// What one request of a chain of redirects came to.
    private enum Hop<Result> {
        case answer(Result)
        case redirect(String)
    }

    /// Sends one request the way its URL's scheme and host say (a redirect may leave a proxy): a
    /// plain-http one through an HTTP proxy is forwarded, every other one goes through the HTTP
    /// client of connection `connection` for that way out (under a cap, the client its pass
    /// names). `handle` reads the answer; the request holds its place under the cap until then.
    private func exchange<Result>(
        _ outgoing: HTTPClientRequest, to url: DownloadURL, connection: Int, waiting: (Bool) -> Void,
        _ handle: (HTTPClientResponse) async -> Result
    ) async throws -> Result {
        let proxy = configuration.proxy.proxy(for: url.url)
        do {
            var pass: HostConnectionCap.Pass?
            if let hostCap {
                var waited = false
                pass = try await hostCap.enter(
                    host: url.origin, connection: connection,
                    mayMultiplex: url.isHTTPS && configuration.tls.allowHTTP2
                ) {
                    waited = true
                    waiting(true)
                }
                if waited { waiting(false) }
            }
            defer { if let pass { hostCap?.leave(pass) } }
            // A place among every worker's, when the cap is a fleet's.
            var place: Int?
            if let shared = configuration.sharedHostSlots {
                var waited = false
                place = try await shared.take(url.origin) {
                    waited = true
                    waiting(true)
                }
                if waited { waiting(false) }
            }
            defer { if let place { configuration.sharedHostSlots?.give(url.origin, place) } }
            if let proxy, proxy.kind == .http, !url.isHTTPS {
                return try await ProxyForwarding.execute(
                    outgoing, url: url, through: proxy, connectTimeout: configuration.timeouts.connect, handle)
            }
            let client = try await clients.lanes(to: url.url, through: proxy).client(for: pass?.lane ?? connection)
            let response = try await client.execute(outgoing, deadline: .distantFuture)
            if let entered = pass { pass = hostCap?.answered(entered, multiplexed: response.version.major >= 2) }
            return await handle(response)
        } catch let error as HaulError {
            throw error
        } catch {
            throw FetchFailure(error: error, url: url)
        }
    }

    /// What a failure of a request or of its body means for the transfer.
    func failure(_ error: any Error) -> TransferFailure {
        if error is CancellationError || Task.isCancelled { return .cancelled }
        if let error = error as? HaulError { return .fatal(error) }
        var url = self.url
        var cause = error
        if let failure = error as? FetchFailure {
            url = failure.url
            cause = failure.error
            if cause is CancellationError { return .cancelled }
        }
        let host = url.url.host ?? url.string
        if let unresolved = cause as? HostResolution.Failure {
            return .retryable(HaulError(.network, unresolved.message, underlying: cause), retryAfter: nil)
        }
        if let clientError = cause as? HTTPClientError {
            switch clientError {
            case .readTimeout:
                let seconds = Int(configuration.timeouts.stall.seconds)
                return .retryable(
                    HaulError(.timedOut, "no data from \(host) for \(seconds) s", underlying: cause), retryAfter: nil)
            case .connectTimeout:
                return .retryable(
                    HaulError(.timedOut, "connecting to \(host) timed out", underlying: cause), retryAfter: nil)
            case .cancelled:
                return .cancelled
            case .invalidURL, .emptyHost, .emptyScheme:
                return .fatal(HaulError(.invalidURL, "not a valid URL: \(url.string)", underlying: cause))
            case .proxyAuthenticationRequired:
                let proxy = configuration.proxy.proxy(for: url.url).map { " \($0)" } ?? ""
                return .fatal(
                    HaulError(
                        .httpStatus, "the proxy\(proxy) asks for credentials (407): give them in its URL", status: 407,
                        underlying: cause))
            case .invalidProxyResponse:
                let proxy = configuration.proxy.proxy(for: url.url).map { " \($0)" } ?? ""
                return .retryable(
                    HaulError(.network, "the proxy\(proxy) could not reach \(host)", underlying: cause), retryAfter: nil
                )
            case .remoteConnectionClosed:
                return .retryable(
                    HaulError(.network, "\(host) closed the connection", underlying: cause), retryAfter: nil)
            default:
                return .retryable(
                    HaulError(.network, "transfer from \(host) failed: \(clientError)", underlying: cause),
                    retryAfter: nil)
            }
        }
        let typeName = String(reflecting: type(of: cause))
        if typeName.contains("NIOSSL") || typeName.contains("TLS") {
            return .fatal(HaulError(.tls, TransportErrorDescription.describeTLS(cause, host: host), underlying: cause))
        }
        let message = TransportErrorDescription.describe(cause, url: url)
        let error = HaulError(.network, message, underlying: cause)
        return TransportErrorDescription.isRefusal(cause) ? .refused(error) : .retryable(error, retryAfter: nil)
    }
}

/// A request that failed in the HTTP client, with the URL it was sent to.
struct FetchFailure: Error {
    let error: any Error
    let url: DownloadURL
}
