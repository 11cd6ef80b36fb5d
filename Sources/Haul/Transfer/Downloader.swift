import AsyncHTTPClient
import Logging
import NIOCore
import NIOPosix
import NIOSSL

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Downloads files so that an interrupted download continues where it stopped and a file that
/// changed on the server is never spliced.
///
/// ```swift
/// let downloader = Downloader()
/// defer { try? await downloader.shutdown() }
/// let result = try await downloader.download(
///     DownloadRequest(url: "https://example.com/big.iso", destination: .directory("/tmp"))
/// ) { event in print(event) }
/// ```
///
/// Cancelling the calling task pauses the download: the partial file and its manifest stay on disk
/// and the next call with the same destination resumes it; the call then throws
/// ``HaulError/Code/cancelled``.
public final class Downloader: Sendable {
    /// How the downloader behaves.
    public let configuration: DownloaderConfiguration
    /// One HTTP client per connection of a download, for each way out (see ``ProxiedLanes``).
    let lanes: ProxiedLanes
    /// The cap on connections to one host, when there is one
    /// (``DownloaderConfiguration/maxConnectionsPerHost``).
    let hostCap: HostConnectionCap?
    let logger: Logger
    /// Where the rules about time (retry delays, stalls, take-overs, checkpoints, rates) read it.
    let clock: TransferClock
    let io: BlockingIO
    /// The unfinished downloads in the directories this downloader has saved into.
    let partials = PartialIndex()
    /// Makes finished files durable and renames them in batches, with the downloads finishing beside
    /// each other.
    let finisher = FileFinisher()
    /// Where downloads may write (``DownloaderConfiguration/downloadRoots``).
    let confinement: DownloadConfinement

    /// - Parameters:
    ///   - configuration: how downloads behave.
    ///   - logger: Haul logs nothing unless given a logger; retries, restarts, redirects, take-overs
    ///     and connections that retire are logged at debug level.
    ///   - clock: the clock the rules about time follow: retry delays, stall detection, take-overs,
    ///     checkpoint intervals, rate limits, progress reports. The continuous clock unless a test
    ///     gives its own.
    public init(
        configuration: DownloaderConfiguration = .init(), logger: Logger? = nil,
        clock: any Clock<Duration> = ContinuousClock()
    ) {
        self.configuration = configuration
        self.logger = logger ?? Logger(label: "haul", factory: { _ in SwiftLogNoOpLogHandler() })
        self.clock = TransferClock(clock)
        self.io = .shared
        self.confinement = DownloadConfinement(roots: configuration.downloadRoots)
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
        let shared = configuration.sharedHostSlots
        hostCap = (configuration.maxConnectionsPerHost ?? shared?.limit).map { HostConnectionCap(limit: $0) }
        if let shared { clientConfiguration.connectionPool.idleTimeout = TimeAmount(shared.idleTimeout) }
        clientConfiguration.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit =
            hostCap?.limit ?? configuration.connectionsPerHost.map { max(1, ($0 + lanes - 1) / lanes) } ?? 8
        clientConfiguration.http2StreamChannelDebugInitializer = { HTTP2BodyCoalescer.install(on: $0) }
        self.lanes = ProxiedLanes(
            count: configuration.segmentation.connections, configuration: clientConfiguration,
            addresses: AddressCache(clock: self.clock))
    }

    /// Closes the connections. Call it once no download is running any more.
    public func shutdown() async throws {
        try await lanes.shutdown()
    }

    /// Downloads `request.url`, resuming a partial download of the same destination when there is one.
    ///
    /// - Parameters:
    ///   - request: what to download and where.
    ///   - observe: receives the download's events, in order, on the downloading task.
    /// - Returns: the finished file.
    /// - Throws: ``HaulError``.
    @discardableResult
    public func download(
        _ request: DownloadRequest, observing observe: @escaping @Sendable (DownloadEvent) -> Void = { _ in }
    ) async throws -> DownloadResult {
        try await download(request, observing: observe, beforeFinishing: {})
    }

    /// ``download(_:observing:)``, calling `beforeFinishing` once every byte is written and checked,
    /// right before the file is given its final name (a queue records there that the file is its own).
    package func download(
        _ request: DownloadRequest, observing observe: @escaping @Sendable (DownloadEvent) -> Void,
        beforeFinishing: @escaping @Sendable () async -> Void
    ) async throws -> DownloadResult {
        do {
            let url = try request.check()
            let result = try await TransferDriver.run(
                downloader: self, request: request, url: url, observe: observe, beforeFinishing: beforeFinishing)
            observe(.completed(result))
            return result
        } catch let error as HaulError {
            observe(.failed(error))
            throw error
        } catch {
            let wrapped = HaulError(.fileSystem, "\(error)", underlying: error)
            observe(.failed(wrapped))
            throw wrapped
        }
    }
}

extension TimeAmount {
    init(_ duration: Duration) {
        let parts = duration.components
        self = .nanoseconds(parts.seconds * 1_000_000_000 + parts.attoseconds / 1_000_000_000)
    }
}

/// A URL Haul accepts: http or https with a host.
package struct DownloadURL: Sendable, Equatable {
    package let url: URL

    package init(_ text: String) throws {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased() else {
            throw HaulError(.invalidURL, "not a valid URL: \(text)")
        }
        guard scheme == "http" || scheme == "https" else {
            throw HaulError(
                .unsupportedScheme, "unsupported scheme \(scheme): only http and https are supported (\(text))")
        }
        guard let host = url.host, !host.isEmpty else { throw HaulError(.invalidURL, "URL has no host: \(text)") }
        self.url = url
    }

    init(resolving location: String, against base: URL) throws {
        guard let resolved = URL(string: location, relativeTo: base)?.absoluteURL else {
            throw HaulError(.protocolViolation, "the server redirected to an invalid location: \(location)")
        }
        try self.init(resolved.absoluteString)
    }

    package var string: String { url.absoluteString }
    package var isHTTPS: Bool { url.scheme?.lowercased() == "https" }

    /// Scheme, host and port: what decides whether credentials may follow a redirect.
    var origin: String {
        let scheme = url.scheme?.lowercased() ?? ""
        let port = url.port ?? (scheme == "https" ? 443 : 80)
        return "\(scheme)://\(url.host?.lowercased() ?? ""):\(port)"
    }
}

/// How the queue runs one download: a request in, its events out, then a result or a
/// ``HaulError``. ``Downloader`` (Haul's own HTTP engine) is the one transport today; this is where
/// one that hands transfers to the system (a background `URLSession` on iOS) would plug in.
package protocol DownloadTransport: Sendable {
    /// Runs `request` to its end, reporting its events in order; cancelling the calling task pauses it.
    /// `beforeFinishing` runs once every byte is written and checked, before the final name is given.
    func download(
        _ request: DownloadRequest, observing observe: @escaping @Sendable (DownloadEvent) -> Void,
        beforeFinishing: @escaping @Sendable () async -> Void
    ) async throws -> DownloadResult
    /// Closes what the transport holds open.
    func shutdown() async throws
}

extension Downloader: DownloadTransport {}
