import Logging
import NIOCore

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
    /// What sends the requests: ``DownloaderConfiguration/transport``, or Haul's own client.
    let transport: any DownloadTransport
    /// Why the transport refused this configuration, if it did: every download fails with it.
    let refusal: HaulError?
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
    let finisher: FileFinisher
    /// Where downloads may write (``DownloaderConfiguration/downloadRoots``).
    let confinement: DownloadConfinement
    /// The origins whose files come small and whole in their first answer (see ``WholeAnswer``).
    let smallAnswers = SmallAnswerOrigins()
    /// What sends the requests of ``WholeAnswer``'s shortcut: kept-alive connections whose answers
    /// are read whole, under Haul's own client with no cap per host; else ``transport``.
    let wholeAnswerTransport: WholeAnswerTransport?

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
        finisher = FileFinisher(
            flushData: configuration.flushFinishedData ?? { try $0.syncDataNow() },
            fileSystemFlush: configuration.flushFinishedFileSystem
                ?? (configuration.flushFinishedData == nil ? .platform : nil))
        self.confinement = DownloadConfinement(roots: configuration.downloadRoots)
        hostCap = (configuration.maxConnectionsPerHost ?? configuration.sharedHostSlots?.limit).map {
            HostConnectionCap(limit: $0)
        }
        let transport =
            configuration.transport
            ?? ClientTransport(configuration: configuration, hostCap: hostCap, clock: self.clock)
        self.transport = transport
        // A cap per host counts the general client's connections, which this one's would pass.
        wholeAnswerTransport =
            configuration.transport == nil && configuration.maxConnectionsPerHost == nil
                && configuration.sharedHostSlots == nil
            ? WholeAnswerTransport(
                configuration: configuration, fallback: transport, bodyLimit: Int(WholeAnswer.limit(configuration)),
                clock: self.clock)
            : nil
        do {
            try transport.check(configuration)
            refusal = nil
        } catch {
            refusal = HaulError.wrapping(error)
        }
    }

    /// Closes the connections, and shuts the transport down (``DownloaderConfiguration/transport``,
    /// when one was given, too). Call it once no download is running any more.
    public func shutdown() async throws {
        try? await wholeAnswerTransport?.shutdown()
        try await transport.shutdown()
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
        try await download(request, observing: observe, finishing: FinishingHooks())
    }

    /// ``download(_:observing:)``, telling `finishing` when the complete file is handed over to be
    /// made durable and right before it is given its final name (see ``FinishingHooks``).
    package func download(
        _ request: DownloadRequest, observing observe: @escaping @Sendable (DownloadEvent) -> Void,
        finishing: FinishingHooks
    ) async throws -> DownloadResult {
        do {
            if let refusal { throw refusal }
            let url = try request.check()
            let result = try await TransferDriver.run(
                downloader: self, request: request, url: url, observe: observe, finishing: finishing)
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
