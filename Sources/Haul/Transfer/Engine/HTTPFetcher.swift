import Logging
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
    /// What sends the requests.
    let transport: any DownloadTransport
    /// The cap on connections to one host, if any: every request enters it before it is sent.
    let hostCap: HostConnectionCap?
    let configuration: DownloaderConfiguration
    let logger: Logger

    /// Names the download for its transport: its URL and destination (``TransportRequest/download``).
    let download: String

    /// A fetcher of `request` from `sources` (its URL, then its mirrors: see
    /// ``DownloadRequest/sources()``).
    init(
        sources: [DownloadURL], request: DownloadRequest, transport: any DownloadTransport,
        hostCap: HostConnectionCap?,
        configuration: DownloaderConfiguration, logger: Logger
    ) {
        precondition(!sources.isEmpty, "a download has a URL")
        self.url = sources[0]
        self.sources = sources
        self.request = request
        self.download =
            switch request.destination {
            case .file(let path): "\(request.url) file:\(path)"
            case .directory(let path): "\(request.url) directory:\(path)"
            }
        self.transport = transport
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
        active: (@Sendable () -> Void)? = nil, _ consume: (TransportResponse, DownloadURL) async -> Result
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
            var outgoing = HTTPHeaders(headers)
            // Cookies expire at calendar dates: they are compared with the calendar, not the transfer's clock.
            let now = request.cookies == nil ? 0 : Int64(Date().timeIntervalSince1970)
            if let jar = request.cookies, let cookies = jar.header(for: current.url, now: now) {
                // One Cookie header: the jar's cookies join any the caller gave for this origin.
                let given = outgoing.first(name: "cookie")
                outgoing.replaceOrAdd(name: "Cookie", value: given.map { $0 + "; " + cookies } ?? cookies)
            }
            let from = current
            let hop: Hop<Result> = try await exchange(
                outgoing, to: current, connection: connection, waiting: waiting, active: active
            ) {
                response in
                request.cookies?.store(setCookie: response.fields["set-cookie"], from: from.url, now: now)
                guard [301, 302, 303, 307, 308].contains(response.status),
                    let location = response.fields.first(name: "location")
                else { return .answer(await consume(response, from)) }
                await response.body.discard(upTo: 64 * 1024)
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

    /// Sends one request with `headers` through the transport, as connection `connection` (under
    /// a cap, the connection its pass names). `handle` reads the answer; the request holds its place
    /// under the cap until then.
    private func exchange<Result>(
        _ headers: HTTPHeaders, to url: DownloadURL, connection: Int, waiting: (Bool) -> Void,
        active: (@Sendable () -> Void)?, _ handle: (TransportResponse) async -> Result
    ) async throws -> Result {
        var sent: TransportRequest?
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
            let outgoing = TransportRequest(
                url: url.url, fields: headers, connection: pass?.lane ?? connection,
                networkAccess: configuration.networkAccess, download: download, activity: active)
            sent = outgoing
            return try await transport.send(outgoing) { response in
                if let entered = pass { pass = hostCap?.answered(entered, multiplexed: response.httpVersion >= 2) }
                return await handle(response)
            }
        } catch {
            throw FetchFailure(error: error, url: url, request: sent)
        }
    }

    /// What a failure of a request or of its body means for the transfer.
    func failure(_ error: any Error) -> TransferFailure {
        if error is CancellationError || Task.isCancelled { return .cancelled }
        var request = TransportRequest(url: url.url, fields: HTTPHeaders(), connection: 0, activity: nil)
        var cause = error
        if let failure = error as? FetchFailure {
            request =
                failure.request
                ?? TransportRequest(url: failure.url.url, fields: HTTPHeaders(), connection: 0, activity: nil)
            cause = failure.error
            if cause is CancellationError { return .cancelled }
        }
        // Haul's own refusals (a redirect loop, a file error) are final whichever transport ran; a
        // network failure or a timeout is the transport's to judge.
        if let error = cause as? HaulError, !TransportFailure.retriedCodes.contains(error.code) {
            return .fatal(error)
        }
        switch transport.failure(of: cause, sending: request) {
        case .retryable(let error): return .retryable(error, retryAfter: nil)
        case .refused(let error): return .refused(error)
        case .fatal(let error): return .fatal(error)
        case .cancelled: return .cancelled
        }
    }
}

/// A request that failed in its transport, with the URL it was sent to and the request itself once
/// it was made.
struct FetchFailure: Error {
    let error: any Error
    let url: DownloadURL
    var request: TransportRequest? = nil
}
