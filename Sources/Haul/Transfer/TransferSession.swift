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
private struct OverlapMismatch: Error {}

/// One call of ``Downloader/download(_:observing:)``: owns the lock, the partial file and the
/// manifest of one destination, and runs attempts until the file is complete or a failure is final.
struct TransferSession {
    private let downloader: Downloader
    private let request: DownloadRequest
    private let url: DownloadURL
    private let observe: @Sendable (DownloadEvent) -> Void
    private var configuration: DownloaderConfiguration { downloader.configuration }
    private let clock = ContinuousClock()

    private var paths: DownloadPaths?
    private var lock: DestinationLock?
    private var file: PartialFile?
    private var manifest: Manifest?
    /// A reason to discard the partial data, found while opening it.
    private var pendingRestart: RestartReason?
    /// Set when an earlier session renamed the complete file but died before removing its manifest.
    private var completedEarlier: Int64?
    private var restarts = 0
    private var bytesFetched: Int64 = 0
    private var resumedFrom: Int64?
    private var lastCheckpoint: ContinuousClock.Instant

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
            if let found = Self.findPartial(in: directory, for: url) { try open(found) }
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
    private mutating func attempt() async throws -> DownloadResult? {
        if Task.isCancelled { throw Self.cancelled(paths) }
        if let total = completedEarlier { return try await finish(totalBytes: total) }
        if let reason = pendingRestart {
            pendingRestart = nil
            try await startOver(reason)
        }
        var plan = ResumePlan.fresh
        if let manifest, let file {
            let trusted = manifest.trustedPrefix(currentBootID: BootIdentity.current, partialSize: try file.size())
            if let total = manifest.totalLength, trusted == total {
                // Every byte is already on disk: the previous session ended just before the rename.
                resumedFrom = total
                return try await finish(totalBytes: total)
            }
            switch ResumePlan.resuming(
                manifest, trusted: trusted, trustUnvalidated: configuration.trustUnvalidatedResume,
                overlapCheckBytes: configuration.overlapCheckBytes
            ) {
            case .success(let resumePlan): plan = resumePlan
            case .failure(let box): try await startOver(box.reason)
            }
        }

        let (response, finalURL) = try await fetch(plan: plan)
        let action = ResponseClassifier.classify(
            status: Int(response.status.code), headers: response.headers, plan: plan,
            now: Int64(Date().timeIntervalSince1970)
        )
        switch action {
        case .stream(let streamPlan):
            if paths == nil { try adoptDestination(response: response) }
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

    private func backoff(failures: Int, retryAfter: Duration?, error: HaulError) throws -> Duration {
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
        var delay = retry.initialDelay * (1 << min(failures - 1, 20))
        if delay > retry.maximumDelay { delay = retry.maximumDelay }
        if retry.jitter { delay = delay / 2 + delay / 2 * Double.random(in: 0...1) }
        return delay
    }

    // MARK: Requests

    /// Sends the request, following redirects by hand so credentials never leave their origin.
    private func fetch(plan: ResumePlan) async throws -> (HTTPClientResponse, DownloadURL) {
        var current = url
        var headers = request.headers.map { ($0.name, $0.value) }
        if !headers.contains(where: { $0.0.lowercased() == "user-agent" }) {
            headers.append(("User-Agent", configuration.userAgent))
        }
        headers.append(("Accept-Encoding", "identity"))
        headers += plan.headers
        var visited: Set<String> = [current.string]
        let redirects = configuration.redirects
        for _ in 0...redirects.maximum {
            var outgoing = HTTPClientRequest(url: current.string)
            outgoing.method = .GET
            for (name, value) in headers { outgoing.headers.add(name: name, value: value) }
            let response: HTTPClientResponse
            do {
                response = try await downloader.client.execute(outgoing, deadline: .distantFuture)
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
            return HaulError(.tls, "TLS with \(host) failed: \(error)", underlying: error)
        }
        let message = TransportErrorDescription.describe(error, url: url)
        return RetryableFailure(error: HaulError(.network, message, underlying: error))
    }

    static func cancelled(_ paths: DownloadPaths?) -> HaulError {
        let detail = paths.map { ": the partial file \($0.partial) is kept" } ?? ""
        return HaulError(.cancelled, "download cancelled\(detail)", underlying: CancellationError())
    }

    private static func checkHeaders(_ headers: [(name: String, value: String)]) throws {
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

    // MARK: Destination

    private mutating func open(_ paths: DownloadPaths) throws {
        let lock = try DestinationLock.acquire(paths)
        do {
            try inspect(paths)
        } catch {
            lock.removeFile()
            throw error
        }
        self.lock = lock
        self.paths = paths
        if completedEarlier == nil { self.file = try PartialFile(path: paths.partial, io: downloader.io) }
    }

    /// Reads what an earlier session left at `paths` and decides what of it can be used.
    private mutating func inspect(_ paths: DownloadPaths) throws {
        var loaded: Manifest?
        do {
            loaded = try ManifestStore.load(paths)
        } catch let error as HaulError where error.code == .manifestCorrupt {
            pendingRestart = .untrustedPartial(error.message)
        }
        let partialExists = POSIX.exists(paths.partial)
        if loaded == nil, POSIX.exists(paths.destination), !request.overwrite {
            throw HaulError(.destinationExists, "\(paths.destination) already exists; use --force to download it again")
        }
        if case .directory = request.destination, let loaded, loaded.originalURL != url.string {
            throw HaulError(
                .destinationExists,
                "\(paths.partial) belongs to a download of \(loaded.originalURL); to continue it from this URL, "
                    + "name it explicitly (-o \(paths.fileName)), or remove it"
            )
        }
        if let loaded, !partialExists {
            // A crash between the final rename and the manifest's removal leaves exactly this.
            if let total = loaded.totalLength, loaded.segments.first?.written == total,
                let status = POSIX.fileStatus(paths.destination), Int64(status.st_size) == total
            {
                completedEarlier = total
            } else {
                pendingRestart = .untrustedPartial("the manifest exists but \(paths.partial) is missing")
            }
        } else if loaded == nil, partialExists, pendingRestart == nil {
            pendingRestart = .untrustedPartial("\(paths.partial) has no manifest")
        }
        if pendingRestart == nil { self.manifest = loaded }
    }

    /// Removes what an unfinished call leaves behind that cannot help a later resume: the lock file
    /// always (the lock itself is released with it), the partial file when no manifest describes it.
    mutating func release() {
        guard let paths, let lock else { return }
        if !POSIX.exists(paths.manifest) { try? POSIX.unlink(paths.partial) }
        lock.removeFile()
        self.lock = nil
        self.file = nil
    }

    /// Names the file from the first response when the caller gave only a directory.
    private mutating func adoptDestination(response: HTTPClientResponse) throws {
        guard case .directory(let directory) = request.destination else { return }
        let suggested = response.headers.first(name: "content-disposition")
            .flatMap(ContentDisposition.filename)
            .flatMap(FileNaming.sanitize)
        let name = suggested ?? FileNaming.name(fromURLPath: url.url.path)
        try open(DownloadPaths(destination: Self.join(directory, name)))
    }

    static func findPartial(in directory: String, for url: DownloadURL) -> DownloadPaths? {
        var best: (paths: DownloadPaths, updated: Int64)?
        for name in POSIX.listDirectory(directory) where name.hasSuffix(DownloadPaths.manifestSuffix) {
            let destination = join(directory, String(name.dropLast(DownloadPaths.manifestSuffix.count)))
            let paths = DownloadPaths(destination: destination)
            guard let manifest = try? ManifestStore.load(paths), manifest.originalURL == url.string else { continue }
            if best == nil || manifest.updatedAt > best!.updated { best = (paths, manifest.updatedAt) }
        }
        return best?.paths
    }

    static func join(_ directory: String, _ name: String) -> String {
        directory.hasSuffix("/") ? directory + name : directory + "/" + name
    }

    static func createDirectory(_ directory: String) throws {
        guard !POSIX.isDirectory(directory) else { return }
        try POSIX.makeDirectories(directory)
    }

    // MARK: Partial data

    private var storedBytes: Int64 { manifest?.segments.first?.written ?? 0 }

    /// Discards the partial data and tells the observer why.
    private mutating func startOver(_ reason: RestartReason) async throws {
        restarts += 1
        guard restarts <= configuration.retry.maximumRestarts else {
            throw HaulError(.remoteChanged, "gave up after \(restarts - 1) restarts: \(reason)")
        }
        if let file { try await file.truncate(to: 0) }
        if let paths { try await downloader.io.run { try ManifestStore.remove(paths) } }
        manifest = nil
        resumedFrom = nil
        observe(.restarted(reason))
    }

    /// Records progress in the manifest. A durable checkpoint first flushes the data, so the manifest
    /// can call those bytes durable, and then flushes the manifest itself.
    private mutating func checkpoint(durable: Bool) async throws {
        guard manifest != nil, let file else { return }
        if durable {
            try await file.syncData()
            for index in manifest!.segments.indices {
                manifest!.segments[index].durable = manifest!.segments[index].written
            }
        }
        try await storeManifest(durable: durable)
    }

    private mutating func storeManifest(durable: Bool) async throws {
        guard var manifest, let paths else { return }
        manifest.bootID = BootIdentity.current
        manifest.updatedAt = Int64(Date().timeIntervalSince1970)
        let snapshot = manifest
        try await downloader.io.run { try ManifestStore.store(snapshot, at: paths, durable: durable) }
        self.manifest = manifest
        lastCheckpoint = clock.now
    }

    /// Moves the complete file into place: flush, rename, flush the directory, drop the manifest.
    private mutating func finish(totalBytes: Int64) async throws -> DownloadResult {
        guard let paths else { throw HaulError(.fileSystem, "no destination was chosen") }
        let validator = manifest?.validator ?? ResourceValidator()
        if let file, POSIX.exists(paths.partial) {
            try await file.syncData()
            try await downloader.io.run {
                try POSIX.rename(paths.partial, to: paths.destination)
                try POSIX.syncDirectory(paths.directory)
            }
        }
        try await downloader.io.run { try ManifestStore.remove(paths) }
        lock?.removeFile()
        lock = nil
        return DownloadResult(
            destination: paths.destination, url: url.string, bytes: totalBytes, bytesFetched: bytesFetched,
            resumedFrom: resumedFrom ?? 0, restarts: restarts, validator: validator
        )
    }

    // MARK: Receiving

    private mutating func receive(
        _ body: HTTPClientResponse.Body, plan: StreamPlan, finalURL: DownloadURL
    ) async throws -> DownloadResult? {
        guard let paths, let file else { throw HaulError(.fileSystem, "no destination was chosen") }
        if plan.startsOver {
            if let reason = plan.restartReason {
                restarts += 1
                guard restarts <= configuration.retry.maximumRestarts else {
                    throw HaulError(.remoteChanged, "gave up after \(restarts - 1) restarts: \(reason)")
                }
                observe(.restarted(reason))
            }
            // When old data or an old manifest is replaced, the new manifest is flushed before any new
            // byte is written: after a power loss the old manifest can then never describe new data.
            let partialSize = try file.size()
            let replacing = manifest != nil || POSIX.exists(paths.manifest) || partialSize > 0
            if partialSize > 0 { try await file.truncate(to: 0) }
            manifest = Manifest(
                originalURL: url.string, finalURL: finalURL.string, validator: plan.validator,
                totalLength: plan.totalLength, acceptsRanges: plan.acceptsRanges, contentEncoding: plan.contentEncoding,
                bootID: BootIdentity.current, now: Int64(Date().timeIntervalSince1970)
            )
            try await checkpoint(durable: replacing)
        } else {
            manifest?.finalURL = finalURL.string
        }

        if let total = plan.totalLength, let free = POSIX.freeSpace(paths.directory), total - plan.writeStart > free {
            throw HaulError(
                .insufficientSpace,
                "\(paths.directory) has \(ByteCount.format(free)) free, the download needs \(ByteCount.format(total - plan.writeStart)) more"
            )
        }

        var overlap: [UInt8] = []
        if plan.writeStart > plan.bodyStart {
            let count = Int(plan.writeStart - plan.bodyStart)
            overlap = try await file.read(count: count, at: plan.bodyStart)
            guard overlap.count == count else {
                try await startOver(.untrustedPartial("\(paths.partial) is shorter than its manifest says"))
                return nil
            }
        }

        if resumedFrom == nil { resumedFrom = plan.writeStart }
        let resumable =
            plan.acceptsRanges && plan.contentEncoding == nil
            && (!plan.validator.isEmpty || configuration.trustUnvalidatedResume)
        observe(
            .started(
                DownloadStart(
                    destination: paths.destination, url: finalURL.string, totalBytes: plan.totalLength,
                    resumedFrom: plan.writeStart, resumable: resumable, validator: plan.validator
                )
            )
        )

        let received: Int64
        do {
            received = try await pump(
                body, file: file, writeStart: plan.writeStart, overlap: overlap, total: plan.totalLength)
        } catch is OverlapMismatch {
            try await startOver(.remoteChanged("the bytes before the resume point differ from the partial file"))
            return nil
        }

        if let total = plan.totalLength, received < total {
            throw RetryableFailure(
                error: HaulError(
                    .network, "the connection ended after \(ByteCount.format(received)) of \(ByteCount.format(total))"
                )
            )
        }
        if plan.totalLength == nil { manifest?.totalLength = received }
        return try await finish(totalBytes: received)
    }

    private struct WriteReceipt: Sendable {
        let end: Int64
        let durable: Bool
    }

    /// Streams the body into the file: network buffers are gathered into large blocks, and one block
    /// is written on the thread pool while the next one fills, so disk and network overlap while at
    /// most two blocks are held in memory.
    ///
    /// Whatever happens, every byte received is written and checkpointed before this returns or throws.
    private mutating func pump(
        _ body: HTTPClientResponse.Body, file: PartialFile, writeStart: Int64, overlap: [UInt8], total: Int64?
    ) async throws -> Int64 {
        let storage = configuration.storage
        var meter = ProgressMeter(startingAt: writeStart, totalBytes: total, interval: configuration.progressInterval)
        let allocator = ByteBufferAllocator()
        var block = allocator.buffer(capacity: storage.blockSize)
        var blockStart = writeStart
        var received = writeStart
        var overlapChecked = 0
        var lastWrite = clock.now
        var lastDurable = clock.now
        var streamError: (any Error)?
        var writeError: (any Error)?

        await withThrowingTaskGroup(of: WriteReceipt.self) { group in
            var writeInFlight = false
            do {
                for try await chunk in body {
                    var chunk = chunk
                    bytesFetched += Int64(chunk.readableBytes)
                    if overlapChecked < overlap.count {
                        let count = min(overlap.count - overlapChecked, chunk.readableBytes)
                        let matches = chunk.readableBytesView.prefix(count)
                            .elementsEqual(overlap[overlapChecked..<overlapChecked + count])
                        guard matches else { throw OverlapMismatch() }
                        overlapChecked += count
                        chunk.moveReaderIndex(forwardBy: count)
                    }
                    if let total, received + Int64(chunk.readableBytes) > total {
                        throw RetryableFailure(
                            error: HaulError(
                                .protocolViolation, "the server sent more than the announced \(total) bytes")
                        )
                    }
                    received += Int64(chunk.readableBytes)
                    block.writeImmutableBuffer(chunk)
                    let now = clock.now
                    if let progress = meter.record(received, at: now) { observe(.progress(progress)) }
                    guard block.readableBytes >= storage.blockSize || now - lastWrite >= storage.flushInterval else {
                        continue
                    }

                    if writeInFlight, let receipt = try await group.next() {
                        try await recordWrite(receipt)
                    }
                    let durable = now - lastDurable >= storage.durableCheckpointInterval
                    if durable { lastDurable = now }
                    let data = block
                    let offset = blockStart
                    blockStart += Int64(data.readableBytes)
                    block = allocator.buffer(capacity: storage.blockSize)
                    group.addTask {
                        try await file.write(data, at: offset)
                        if durable { try await file.syncData() }
                        return WriteReceipt(end: offset + Int64(data.readableBytes), durable: durable)
                    }
                    writeInFlight = true
                    lastWrite = now
                }
            } catch {
                streamError = error
            }
            // Store what arrived even when the transfer failed: those bytes are valid.
            do {
                if writeInFlight, let receipt = try await group.next() { try await recordWrite(receipt) }
                if block.readableBytes > 0 && !(streamError is OverlapMismatch) {
                    try await file.write(block, at: blockStart)
                    try await recordWrite(WriteReceipt(end: blockStart + Int64(block.readableBytes), durable: false))
                }
            } catch {
                writeError = error
            }
        }

        if let writeError {
            try? await checkpoint(durable: false)
            throw writeError
        }
        if let streamError {
            if streamError is OverlapMismatch { throw streamError }
            let failure = Self.transportFailure(streamError, url: url, configuration: configuration, paths: paths)
            let isCancelled = (failure as? HaulError)?.code == .cancelled
            try await checkpoint(durable: isCancelled)
            throw failure
        }
        if let progress = meter.record(received, at: clock.now, force: true) { observe(.progress(progress)) }
        try await checkpoint(durable: false)
        return received
    }

    /// Notes a finished write in the manifest, and stores the manifest when a checkpoint is due.
    private mutating func recordWrite(_ receipt: WriteReceipt) async throws {
        guard manifest != nil else { return }
        manifest!.segments[0].written = receipt.end
        if receipt.durable {
            // The write task already flushed the data up to `end`.
            manifest!.segments[0].durable = receipt.end
            try await storeManifest(durable: true)
        } else if clock.now - lastCheckpoint >= configuration.storage.checkpointInterval {
            try await storeManifest(durable: false)
        }
    }
}
