import AsyncHTTPClient
import NIOCore
import NIOHTTP1

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A failure worth another attempt: the next one resumes from the last stored byte.
struct RetryableFailure: Error {
    let error: HaulError
    /// The delay the server asked for with `Retry-After`.
    var retryAfter: Duration?
}

/// The bytes before the resume point did not match the disk: the remote file changed.
struct OverlapMismatch: Error {}

/// One call of ``Downloader/download(_:observing:)``: owns the lock, the partial file and the
/// manifest of one destination, and runs attempts until the file is complete or a failure is final.
struct TransferSession {
    let downloader: Downloader
    let request: DownloadRequest
    let url: DownloadURL
    let observe: @Sendable (DownloadEvent) -> Void
    var configuration: DownloaderConfiguration { downloader.configuration }
    let clock = TransferClock.continuous

    var paths: DownloadPaths?
    var lock: DestinationLock?
    var file: PartialFile?
    var manifest: Manifest?
    /// A reason to discard the partial data, found while opening it.
    var pendingRestart: RestartReason?
    /// Set when an earlier session renamed the complete file but died before removing its manifest.
    var completedEarlier: Int64?
    /// Set while a fresh download's manifest has not been stored yet.
    var manifestUnwritten = false
    /// Set when the server refused `bytes=0-` (an empty file answers 416): ask without a range.
    var rangeProbeRefused = false
    var restarts = 0
    var bytesFetched: Int64 = 0
    var resumedFrom: Int64?
    var lastCheckpoint: Moment
    /// The hash of the partial file's first `offset` bytes, kept between attempts of this call so a
    /// retry does not read the prefix again.
    var prefixHash: (offset: Int64, hasher: StreamingHasher)?
    /// The limits this download's bytes are paced by: its own and the shared one.
    let rateLimiters: [RateLimiter]

    init(
        downloader: Downloader, request: DownloadRequest, url: DownloadURL,
        observe: @escaping @Sendable (DownloadEvent) -> Void
    )
        throws
    {
        self.downloader = downloader
        self.request = request
        self.url = url
        self.observe = observe
        self.lastCheckpoint = clock.now
        self.rateLimiters =
            [
                request.bytesPerSecondLimit.map { RateLimiter(bytesPerSecond: $0) },
                downloader.configuration.sharedRateLimiter,
            ]
            .compactMap { $0 }
        try Self.checkHeaders(request.headers)
        switch request.destination {
        case .file(let path):
            let paths = DownloadPaths(destination: path)
            guard POSIX.isDirectory(paths.directory) else {
                throw HaulError(.fileSystem, "directory \(paths.directory) does not exist")
            }
            guard !POSIX.isDirectory(path) else { throw HaulError(.fileSystem, "\(path) is a directory") }
            try open(paths)
        case .directory(let directory):
            try Self.createDirectory(directory)
            if let found = downloader.partials.find(url.string, in: directory) { try open(found) }
        }
    }

    // MARK: Attempts

    mutating func run() async throws -> DownloadResult {
        var failures = 0
        while true {
            let storedBefore = storedBytes
            do {
                if let result = try await attempt() { return result }
            } catch let failure as RetryableFailure {
                if storedBytes > storedBefore { failures = 0 }
                failures += 1
                let retry = configuration.retry
                guard failures <= retry.maximumRetries else {
                    throw HaulError(
                        failure.error.code, "\(failure.error.message) (gave up after \(retry.maximumRetries) retries)",
                        status: failure.error.status, underlying: failure.error.underlying
                    )
                }
                let delay = try backoff(failures: failures, retryAfter: failure.retryAfter, error: failure.error)
                observe(.retrying(attempt: failures, delay: delay, error: failure.error))
                do {
                    try await Task.sleep(for: delay)
                } catch {
                    throw Self.cancelled(paths)
                }
            }
        }
    }

    /// One request and, when the answer allows, one body. Returns `nil` when the download starts over.
    mutating func attempt() async throws -> DownloadResult? {
        if Task.isCancelled { throw Self.cancelled(paths) }
        if let total = completedEarlier { return try await finish(totalBytes: total) }
        if let reason = pendingRestart {
            pendingRestart = nil
            try await startOver(reason)
        }
        var plan = ResumePlan.fresh
        if let file, let stored = manifest, stored.segments.count > 1 {
            return try await resumeSegments(stored, file: file)
        }
        if let file, let stored = manifest {
            var trusted = stored.trustedPrefix(currentBootID: BootIdentity.current, partialSize: try file.size())
            trusted = try await verifyRecordedPieces(trusted: trusted, file: file)
            try await discardUntrustedTail(beyond: trusted, file: file)
            if let total = stored.totalLength, trusted == total {
                // Every byte is already on disk: the previous session ended just before the rename.
                resumedFrom = total
                return try await finish(totalBytes: total)
            }
            switch ResumePlan.resuming(
                manifest ?? stored, trusted: trusted, trustUnvalidated: configuration.trustUnvalidatedResume,
                overlapCheckBytes: configuration.overlapCheckBytes
            ) {
            case .success(let resumePlan): plan = resumePlan
            case .failure(let box): try await startOver(box.reason)
            }
        }

        let (response, finalURL) = try await fetch(plan: plan)
        if response.status.code == 416 && plan.stored == nil && probesRanges {
            _ = try? await response.body.collect(upTo: 64 * 1024)
            rangeProbeRefused = true
            return nil
        }
        let action = LegacyResponseClassifier.classify(
            status: Int(response.status.code), headers: response.headers, plan: plan,
            now: Int64(Date().timeIntervalSince1970)
        )
        switch action {
        case .stream(let streamPlan):
            if paths == nil {
                try adoptDestination(response: response)
                if manifest != nil || completedEarlier != nil {
                    // The name the server gave holds a download of this URL that started after the
                    // directory was listed: resume it rather than write over it. Dropping the
                    // response closes its connection.
                    return nil
                }
            }
            return try await receive(response.body, plan: streamPlan, finalURL: finalURL)
        case .alreadyComplete:
            return try await finish(totalBytes: plan.resumeOffset)
        case .restart(let reason):
            try await startOver(reason)
            return nil
        case .retry(let status, let retryAfter):
            let phrase = HTTPResponseStatus(statusCode: status).reasonPhrase
            throw RetryableFailure(
                error: HaulError(.httpStatus, "the server answered \(status) \(phrase)", status: status),
                retryAfter: retryAfter.map { .seconds($0) }
            )
        case .fail(let code, let message, let status):
            throw HaulError(code, message, status: status)
        }
    }

    func backoff(failures: Int, retryAfter: Duration?, error: HaulError) throws -> Duration {
        let retry = configuration.retry
        if let retryAfter {
            guard retryAfter <= retry.maximumRetryAfter else {
                throw HaulError(
                    error.code,
                    "\(error.message) and asked to retry after \(Int(retryAfter.seconds)) s, longer than allowed",
                    status: error.status
                )
            }
            return retryAfter
        }
        return retry.delay(afterFailures: failures)
    }

    // MARK: Requests

    /// Sends the request, following redirects by hand so credentials never leave their origin.
    func fetch(plan: ResumePlan) async throws -> (HTTPClientResponse, DownloadURL) {
        var headers = plan.headers
        // With several connections, a fresh download asks for a range: a 206 shows ranges work.
        if plan.stored == nil && probesRanges { headers.append(("Range", "bytes=0-")) }
        return try await Self.fetch(
            headers: headers, url: url, request: request, client: downloader.client, configuration: configuration,
            paths: paths)
    }

    /// Whether a fresh request asks for `bytes=0-` to find out if the file can be fetched in ranges.
    var probesRanges: Bool { configuration.segmentation.connections > 1 && !rangeProbeRefused }

    /// Sends a request for `url` with the request's headers plus `extra`, following redirects.
    static func fetch(
        headers extra: [(String, String)], url: DownloadURL, request: DownloadRequest, client: HTTPClient,
        configuration: DownloaderConfiguration, paths: DownloadPaths?
    ) async throws -> (HTTPClientResponse, DownloadURL) {
        var current = url
        var headers = request.headers.map { ($0.name, $0.value) }
        if !headers.contains(where: { $0.0.lowercased() == "user-agent" }) {
            headers.append(("User-Agent", configuration.userAgent))
        }
        headers.append(("Accept-Encoding", "identity"))
        headers += extra
        var visited: Set<String> = [current.string]
        let redirects = configuration.redirects
        for _ in 0...redirects.maximum {
            var outgoing = HTTPClientRequest(url: current.string)
            outgoing.method = .GET
            for (name, value) in headers { outgoing.headers.add(name: name, value: value) }
            let response: HTTPClientResponse
            do {
                response = try await client.execute(outgoing, deadline: .distantFuture)
            } catch {
                throw Self.transportFailure(error, url: current, configuration: configuration, paths: paths)
            }
            guard [301, 302, 303, 307, 308].contains(response.status.code),
                let location = response.headers.first(name: "location")
            else { return (response, current) }
            _ = try? await response.body.collect(upTo: 64 * 1024)

            let next: DownloadURL
            (next, headers) = try RedirectPolicy.follow(
                location: location, from: current, headers: headers, allowHTTPSToHTTP: redirects.allowHTTPSToHTTP
            )
            guard visited.insert(next.string).inserted else {
                throw HaulError(.redirectRefused, "redirect loop at \(next.string)")
            }
            current = next
        }
        throw HaulError(.redirectRefused, "more than \(redirects.maximum) redirects from \(url.string)")
    }

    static func transportFailure(
        _ error: any Error, url: DownloadURL, configuration: DownloaderConfiguration, paths: DownloadPaths?
    ) -> any Error {
        if error is CancellationError || Task.isCancelled { return cancelled(paths) }
        if let error = error as? HaulError { return error }
        let host = url.url.host ?? url.string
        if let clientError = error as? HTTPClientError {
            switch clientError {
            case .readTimeout:
                let seconds = Int(configuration.timeouts.stall.seconds)
                return RetryableFailure(
                    error: HaulError(.timedOut, "no data from \(host) for \(seconds) s", underlying: error))
            case .connectTimeout:
                return RetryableFailure(
                    error: HaulError(.timedOut, "connecting to \(host) timed out", underlying: error))
            case .cancelled:
                return cancelled(paths)
            case .invalidURL, .emptyHost, .emptyScheme:
                return HaulError(.invalidURL, "not a valid URL: \(url.string)", underlying: error)
            case .remoteConnectionClosed:
                return RetryableFailure(error: HaulError(.network, "\(host) closed the connection", underlying: error))
            default:
                return RetryableFailure(
                    error: HaulError(.network, "transfer from \(host) failed: \(clientError)", underlying: error))
            }
        }
        let typeName = String(reflecting: type(of: error))
        if typeName.contains("NIOSSL") || typeName.contains("TLS") {
            return HaulError(.tls, TransportErrorDescription.describeTLS(error, host: host), underlying: error)
        }
        let message = TransportErrorDescription.describe(error, url: url)
        return RetryableFailure(error: HaulError(.network, message, underlying: error))
    }

    static func cancelled(_ paths: DownloadPaths?) -> HaulError {
        let detail = paths.map { ": the partial file \($0.partial) is kept" } ?? ""
        return HaulError(.cancelled, "download cancelled\(detail)", underlying: CancellationError())
    }

    static func checkHeaders(_ headers: [(name: String, value: String)]) throws {
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
}
