import AsyncHTTPClient
import NIOCore
import NIOSSL

/// Haul's own transport: AsyncHTTPClient on SwiftNIO, one client per connection of a download for
/// each way out (``ProxiedLanes``), plain-http requests through an HTTP proxy forwarded the way curl
/// forwards them (``ProxyForwarding``), and the TLS trust and timeouts of the downloader's
/// configuration.
final class ClientTransport: DownloadTransport {
    let configuration: DownloaderConfiguration
    let lanes: ProxiedLanes

    /// The transport of a downloader with `configuration`; `hostCap` is the downloader's cap on
    /// connections per host, which bounds the first client's pool.
    init(configuration: DownloaderConfiguration, hostCap: HostConnectionCap?, clock: TransferClock) {
        self.configuration = configuration
        // Stalls are detected by the transfer's own clock (`timeouts.stall`), not by the client.
        var clientConfiguration = HTTPClient.Configuration(
            redirectConfiguration: .disallow,
            timeout: .init(connect: TimeAmount(configuration.timeouts.connect), read: nil),
            decompression: .disabled
        )
        clientConfiguration.httpVersion = configuration.tls.allowHTTP2 ? .automatic : .http1Only
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.additionalTrustRoots = configuration.tls.trustedCertificateFiles.map { .file($0) }
        // Haul closes a connection when it has what it asked for from an open-ended or cut-short range
        // (it checks lengths itself, so a truncation is never taken for the end). Waiting there for the
        // server's close_notify would read, and discard, the rest of the response for up to 5 s.
        tls.shutdownTimeout = .zero
        clientConfiguration.tlsConfiguration = tls
        // Haul retries with its own backoff and reports each attempt; a refused connection should reach it at once.
        clientConfiguration.connectionPool.retryConnectionEstablishment = false
        // Connection k of every download goes through client k: a limit the caller gives is shared out
        // over the clients (each needs about as many connections to a host as downloads run at once).
        // Under a cap, HTTP/1.1 requests all go through the first client, whose pool the cap bounds.
        let lanes = max(1, configuration.segmentation.connections)
        // Places shared with other downloaders bound this one too: its HTTP/1.1 requests to a host
        // then share one pool, whose idle connections close before their places are given back.
        if let shared = configuration.sharedHostSlots {
            clientConfiguration.connectionPool.idleTimeout = TimeAmount(shared.idleTimeout)
        }
        clientConfiguration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit =
            hostCap?.limit ?? configuration.connectionsPerHost.map { max(1, ($0 + lanes - 1) / lanes) } ?? 8
        clientConfiguration.http2StreamChannelDebugInitializer = { HTTP2BodyCoalescer.install(on: $0) }
        self.lanes = ProxiedLanes(
            count: configuration.segmentation.connections, configuration: clientConfiguration,
            addresses: AddressCache(clock: clock))
    }

    func send<Result>(
        _ request: TransportRequest, receive: (TransportResponse) async -> Result
    ) async throws -> Result {
        var outgoing = HTTPClientRequest(url: request.url.absoluteString)
        outgoing.method = .GET
        outgoing.headers = request.fields
        let proxy = configuration.proxy.proxy(for: request.url)
        if let proxy, proxy.kind == .http, request.url.scheme?.lowercased() != "https" {
            let url = try DownloadURL(request.url.absoluteString)
            return try await ProxyForwarding.execute(
                outgoing, url: url, through: proxy, connectTimeout: configuration.timeouts.connect
            ) { response in
                await receive(Self.response(response))
            }
        }
        let client = try await lanes.lanes(to: request.url, through: proxy).client(for: request.connection)
        let response = try await client.execute(outgoing, deadline: .distantFuture)
        return await receive(Self.response(response))
    }

    private static func response(_ response: HTTPClientResponse) -> TransportResponse {
        TransportResponse(
            status: Int(response.status.code), fields: response.headers, httpVersion: response.version.major,
            body: TransportBody(response.body))
    }

    func failure(of cause: any Error, sending request: TransportRequest) -> TransportFailure {
        let url = request.url
        let host = url.host ?? url.absoluteString
        if let error = cause as? HaulError { return TransportFailure(error) }
        if let unresolved = cause as? HostResolution.Failure {
            return .retryable(HaulError(.network, unresolved.message, underlying: cause))
        }
        if let clientError = cause as? HTTPClientError {
            switch clientError {
            case .readTimeout:
                let seconds = Int(configuration.timeouts.stall.seconds)
                return .retryable(HaulError(.timedOut, "no data from \(host) for \(seconds) s", underlying: cause))
            case .connectTimeout:
                return .retryable(HaulError(.timedOut, "connecting to \(host) timed out", underlying: cause))
            case .cancelled:
                return .cancelled
            case .invalidURL, .emptyHost, .emptyScheme:
                return .fatal(HaulError(.invalidURL, "not a valid URL: \(url.absoluteString)", underlying: cause))
            case .proxyAuthenticationRequired:
                let proxy = configuration.proxy.proxy(for: url).map { " \($0)" } ?? ""
                return .fatal(
                    HaulError(
                        .httpStatus, "the proxy\(proxy) asks for credentials (407): give them in its URL", status: 407,
                        underlying: cause))
            case .invalidProxyResponse:
                let proxy = configuration.proxy.proxy(for: url).map { " \($0)" } ?? ""
                return .retryable(HaulError(.network, "the proxy\(proxy) could not reach \(host)", underlying: cause))
            case .remoteConnectionClosed:
                return .retryable(HaulError(.network, "\(host) closed the connection", underlying: cause))
            default:
                return .retryable(
                    HaulError(.network, "transfer from \(host) failed: \(clientError)", underlying: cause))
            }
        }
        let typeName = String(reflecting: type(of: cause))
        if typeName.contains("NIOSSL") || typeName.contains("TLS") {
            return .fatal(HaulError(.tls, TransportErrorDescription.describeTLS(cause, host: host), underlying: cause))
        }
        let message =
            (try? DownloadURL(url.absoluteString)).map { TransportErrorDescription.describe(cause, url: $0) }
            ?? "transfer from \(host) failed: \(cause)"
        let error = HaulError(.network, message, underlying: cause)
        return TransportErrorDescription.isRefusal(cause) ? .refused(error) : .retryable(error)
    }

    func shutdown() async throws {
        try await lanes.shutdown()
    }
}
