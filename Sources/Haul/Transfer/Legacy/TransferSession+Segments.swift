import AsyncHTTPClient
import NIOCore
import NIOHTTP1
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A segment's answer showed the remote file is not the one being downloaded (or ranges do not work
/// after all): every connection stops and the download starts over.
struct SegmentRestart: Error {
    let reason: RestartReason
}

/// Fetching one file over several connections, each writing its ranges with positional writes.
extension TransferSession {
    /// Whether the answer allows fetching the rest in ranges over several connections.
    func canSegment(_ plan: StreamPlan) -> Bool {
        let segmentation = configuration.segmentation
        guard segmentation.connections > 1, plan.isPartialResponse, let total = plan.totalLength,
            plan.validator.ifRangeValue != nil, plan.contentEncoding == nil, plan.writeStart == plan.bodyStart,
            plan.contentDigests.isEmpty
        else { return false }
        return total - plan.writeStart >= 2 * segmentation.minimumSplit
    }

    /// Continues the `206` just received as the first of several connections.
    mutating func receiveSegmented(
        _ body: HTTPClientResponse.Body, plan: StreamPlan, total: Int64, file: PartialFile
    ) async throws -> DownloadResult? {
        let durable = min(manifest?.segments.first?.durable ?? 0, plan.writeStart)
        let table = SegmentTable(
            [SegmentTable.Segment(start: 0, end: total, written: plan.writeStart, durable: durable, owner: nil)],
            minimumSplit: configuration.segmentation.minimumSplit,
            stallTakeover: configuration.segmentation.stallTakeover)
        table.split(into: configuration.segmentation.connections)
        guard let first = table.claim(worker: 0) else { return try await finish(totalBytes: total) }
        // Every connection gets its range before any byte is written out of order, and the manifest
        // records those ranges first: a manifest of one range means "the file's size is what is
        // kept", which is only true for a file written in order.
        var assignments: [Int: (HTTPClientResponse.Body?, SegmentTable.Assignment)] = [0: (body, first)]
        for worker in 1..<max(1, configuration.segmentation.connections) {
            guard let assignment = table.claim(worker: worker) else { break }
            assignments[worker] = (nil, assignment)
        }
        manifest?.segments = table.segments.map(\.manifestSegment)
        try await storeManifest(durable: false)
        return try await runSegments(table, assignments: assignments, total: total, file: file)
    }

    /// Continues a download whose manifest has several segments, each from its trusted offset.
    mutating func resumeSegments(_ stored: Manifest, file: PartialFile) async throws -> DownloadResult? {
        guard let total = stored.totalLength, stored.contentEncoding == nil, stored.validator.ifRangeValue != nil,
            let paths
        else {
            try await startOver(.untrustedPartial("a manifest of several segments without a strong validator"))
            return nil
        }
        let size = try file.size()
        var segments = stored.segments.map { segment in
            let trusted = stored.trustedLength(of: segment, currentBootID: BootIdentity.current, partialSize: size)
            return SegmentTable.Segment(segment, trusted: trusted, total: total)
        }
        try await verifyRecordedPieces(&segments, file: file)
        let table = SegmentTable(
            segments, minimumSplit: configuration.segmentation.minimumSplit,
            stallTakeover: configuration.segmentation.stallTakeover)
        manifest?.segments = table.segments.map(\.manifestSegment)
        if resumedFrom == nil { resumedFrom = table.written }
        observe(
            .started(
                DownloadStart(
                    destination: paths.destination, url: stored.finalURL, totalBytes: total,
                    resumedFrom: table.written, resumable: true, validator: stored.validator)))
        if table.isComplete { return try await finish(totalBytes: total) }
        return try await runSegments(table, assignments: [:], total: total, file: file)
    }

    /// Runs the connections until every segment is written, checkpointing and reporting progress on
    /// the way. Returns `nil` when the download has to start over.
    mutating func runSegments(
        _ table: SegmentTable, assignments: [Int: (HTTPClientResponse.Body?, SegmentTable.Assignment)],
        total: Int64, file: PartialFile
    ) async throws -> DownloadResult? {
        guard let stored = manifest, let ifRange = stored.validator.ifRangeValue else {
            throw HaulError(.fileSystem, "no manifest for a segmented download")
        }
        let context = SegmentContext(
            table: table, file: file, url: url, request: request, client: downloader.client,
            configuration: configuration, paths: paths, total: total, validator: stored.validator, ifRange: ifRange,
            pieceSize: stored.pieceSize, rateLimiters: rateLimiters, observe: observe)
        let storage = configuration.storage
        if let minimum = storage.directWriteMinimum, total - table.written >= minimum { file.enableDirectWrites() }
        try await reserveSpace(total: total, from: 0, ranges: stored.segments.count, file: file)
        var meter = ProgressMeter(
            startingAt: table.written, totalBytes: total, interval: configuration.progressInterval)
        var lastDurable = clock.now
        var outcome: (any Error)?
        let connections = max(1, configuration.segmentation.connections)

        await withTaskGroup(of: Void.self) { group in
            for worker in 0..<connections {
                let assigned = assignments[worker]
                group.addTask { await Self.runConnection(worker, context: context, first: assigned) }
            }
            while true {
                do {
                    try await Task.sleep(for: .milliseconds(50))
                } catch {
                    outcome = Self.cancelled(paths)
                    break
                }
                if let failure = table.failure {
                    outcome = failure
                    break
                }
                if table.isComplete { break }
                let now = clock.now
                if let progress = meter.record(table.written, at: now) { observe(.progress(progress)) }
                if now - lastCheckpoint >= storage.checkpointInterval {
                    let durable = now - lastDurable >= storage.durableCheckpointInterval
                    if durable { lastDurable = now }
                    do {
                        try await checkpointSegments(context, durable: durable)
                    } catch {
                        outcome = error
                        break
                    }
                }
            }
            group.cancelAll()
            await group.waitForAll()
        }
        bytesFetched += context.fetched.load(ordering: .relaxed)

        if let outcome {
            if let restart = outcome as? SegmentRestart {
                try await startOver(restart.reason)
                return nil
            }
            let cancelled = (outcome as? HaulError)?.code == .cancelled
            try? await checkpointSegments(context, durable: cancelled)
            throw outcome
        }
        if let progress = meter.record(table.written, at: clock.now, force: true) { observe(.progress(progress)) }
        manifest?.segments = table.segments.map(\.manifestSegment)
        return try await finish(totalBytes: total)
    }

    /// Stores every segment's progress and the piece hashes recorded since the last checkpoint; a
    /// durable checkpoint flushes the data first and records as durable what was written before the flush.
    mutating func checkpointSegments(_ context: SegmentContext, durable: Bool) async throws {
        let table = context.table
        if durable {
            let captured = table.segments
            try await context.file.syncData()
            table.markDurable(captured)
        }
        let segments = table.segments
        manifest?.segments = segments.map(\.manifestSegment)
        try await recordPieces(context, covering: segments)
        try await storeManifest(durable: durable)
    }

    /// Adds the pieces the connections hashed to the manifest, and hashes from the file the pieces
    /// that are written but that no connection saw whole (those that straddle the start of a range).
    mutating func recordPieces(_ context: SegmentContext, covering segments: [SegmentTable.Segment]) async throws {
        guard var manifest else { return }
        let pieceSize = manifest.pieceSize
        func record(_ index: Int, _ hash: String) {
            if manifest.pieces.count <= index {
                manifest.pieces += Array(repeating: nil, count: index + 1 - manifest.pieces.count)
            }
            manifest.pieces[index] = hash
        }
        for (index, hash) in context.takePieces() { record(index, hash) }
        for range in Manifest.joined(segments.map { $0.start..<$0.start + $0.written }) {
            let first = Int((range.lowerBound + pieceSize - 1) / pieceSize)
            let end = Int(range.upperBound / pieceSize)
            for index in first..<max(first, end) where index >= manifest.pieces.count || manifest.pieces[index] == nil {
                if let hash = try await context.file.pieceHash(index, pieceSize: pieceSize) { record(index, hash) }
            }
        }
        self.manifest = manifest
    }

    /// One connection: takes ranges from the table until none is left, retrying its own failures.
    static func runConnection(
        _ worker: Int, context: SegmentContext, first: (HTTPClientResponse.Body?, SegmentTable.Assignment)?
    ) async {
        var failures = 0
        var pending = first
        let table = context.table
        table.join()
        while !Task.isCancelled, table.failure == nil, !table.isComplete {
            guard let claimed = pending?.1 ?? table.claim(worker: worker) else {
                // Nothing to take now; a range may become worth taking over later.
                do {
                    try await Task.sleep(for: .milliseconds(200))
                } catch {
                    return
                }
                continue
            }
            let body = pending.flatMap { $0.0 }
            pending = nil
            // A range not yet asked for is asked for as it stands now (another connection may have
            // taken over its tail since it was claimed); one that is all taken over is done.
            guard let assignment = body == nil ? table.current(claimed) : claimed else { continue }
            let before = table.segments[assignment.index].written
            do {
                if let body {
                    try await context.receive(body, assignment: assignment)
                } else {
                    try await context.receive(context.openRange(assignment), assignment: assignment)
                }
                failures = 0
            } catch let failure as RetryableFailure {
                table.release(assignment.index, worker: worker)
                if table.segments[assignment.index].written > before { failures = 0 }
                failures += 1
                let retry = context.configuration.retry
                guard failures <= retry.maximumRetries else {
                    // The others take over its range; the download fails only with its last connection.
                    if table.retire(worker) { return }
                    table.fail(
                        HaulError(
                            failure.error.code,
                            "\(failure.error.message) (gave up after \(retry.maximumRetries) retries)",
                            status: failure.error.status, underlying: failure.error.underlying))
                    return
                }
                let delay = failure.retryAfter ?? retry.delay(afterFailures: failures)
                context.observe(.retrying(attempt: failures, delay: delay, error: failure.error))
                do {
                    try await Task.sleep(for: delay)
                } catch {
                    return
                }
            } catch {
                table.release(assignment.index, worker: worker)
                if !Task.isCancelled { table.fail(error) }
                return
            }
        }
    }
}

/// What every connection of a segmented download shares.
final class SegmentContext: Sendable {
    let table: SegmentTable
    let file: PartialFile
    let url: DownloadURL
    let request: DownloadRequest
    let client: HTTPClient
    let configuration: DownloaderConfiguration
    let paths: DownloadPaths?
    let total: Int64
    let validator: ResourceValidator
    let ifRange: String
    let pieceSize: Int64
    let rateLimiters: [RateLimiter]
    let observe: @Sendable (DownloadEvent) -> Void
    let fetched = Atomic<Int64>(0)
    /// Hashes of the pieces connections wrote whole, by index, until the next checkpoint takes them.
    private let pieces = Mutex<[Int: String]>([:])

    init(
        table: SegmentTable, file: PartialFile, url: DownloadURL, request: DownloadRequest, client: HTTPClient,
        configuration: DownloaderConfiguration, paths: DownloadPaths?, total: Int64, validator: ResourceValidator,
        ifRange: String, pieceSize: Int64, rateLimiters: [RateLimiter],
        observe: @escaping @Sendable (DownloadEvent) -> Void
    ) {
        self.table = table
        self.file = file
        self.url = url
        self.request = request
        self.client = client
        self.configuration = configuration
        self.paths = paths
        self.total = total
        self.validator = validator
        self.ifRange = ifRange
        self.pieceSize = pieceSize
        self.rateLimiters = rateLimiters
        self.observe = observe
    }

    func takePieces() -> [Int: String] {
        pieces.withLock { pieces in
            defer { pieces = [:] }
            return pieces
        }
    }

    /// Asks for one range and checks the answer: exactly that range of the same file, or nothing.
    func openRange(_ assignment: SegmentTable.Assignment) async throws -> HTTPClientResponse.Body {
        let (response, _) = try await TransferSession.fetch(
            headers: [("Range", "bytes=\(assignment.from)-\(assignment.to - 1)"), ("If-Range", ifRange)], url: url,
            request: request, client: client, configuration: configuration, paths: paths)
        let status = Int(response.status.code)
        let action = SegmentResponse.classify(
            status: status, headers: response.headers, from: assignment.from, to: assignment.to, total: total,
            validator: validator, now: Int64(Date().timeIntervalSince1970))
        switch action {
        case .accept:
            return response.body
        case .restart(let reason):
            throw SegmentRestart(reason: reason)
        case .retry(let retryAfter):
            let phrase = HTTPResponseStatus(statusCode: status).reasonPhrase
            throw RetryableFailure(
                error: HaulError(.httpStatus, "the server answered \(status) \(phrase)", status: status),
                retryAfter: retryAfter.map { .seconds($0) })
        case .fail(let code, let message):
            throw HaulError(code, message, status: status)
        }
    }

    /// Writes a range's body at its offsets, stopping where the segment ends now (another connection
    /// may have taken over its tail).
    func receive(_ body: HTTPClientResponse.Body, assignment: SegmentTable.Assignment) async throws {
        let storage = configuration.storage
        let blockSize = min(storage.blockSize, 256 << 10)
        // Two blocks take turns: a write hands the partial page at its end to the other one, which
        // fills next (direct I/O writes whole pages only).
        var block = WriteBlock(capacity: blockSize, start: assignment.from)
        var next = WriteBlock(capacity: blockSize, start: assignment.from)
        var lastWrite = ContinuousClock.now
        var complete = false
        // Hashes the pieces this connection writes whole, from the first piece that starts in its range.
        var hasher = PieceHasher(
            pieceSize: pieceSize, startingAtPiece: Int((assignment.from + pieceSize - 1) / pieceSize))

        func flush(final: Bool) async throws {
            let writable = block.writableCount(final: final || !file.usesDirectWrites)
            guard writable > 0 else { return }
            block.moveTail(after: writable, into: next)
            try await file.write(block)
            let skip = Int(hasher.offset - block.start)
            if skip < block.count {
                let firstIndex = Int(hasher.offset / pieceSize)
                let completed = hasher.update(UnsafeRawBufferPointer(rebasing: block.bytes[skip...]))
                if !completed.isEmpty {
                    pieces.withLock { pieces in
                        for (offset, hash) in completed.enumerated() { pieces[firstIndex + offset] = hash }
                    }
                }
            }
            swap(&block, &next)
            lastWrite = .now
            complete = table.advance(assignment.index, to: block.start)
        }

        do {
            for try await chunk in body {
                fetched.add(Int64(chunk.readableBytes), ordering: .relaxed)
                // One look at the table per chunk: the end only ever moves closer, and writing a little
                // past a freshly cut end is harmless (same version; `advance` clamps).
                let end = table.end(of: assignment.index)
                let room = end - block.end
                if room <= 0 { break }
                var chunk = chunk
                if Int64(chunk.readableBytes) > room {
                    chunk = chunk.getSlice(at: chunk.readerIndex, length: Int(room)) ?? chunk
                }
                block.append(chunk)
                for limiter in rateLimiters { try await limiter.take(chunk.readableBytes) }
                let reachedEnd = block.end >= end
                if block.count >= blockSize || reachedEnd || ContinuousClock.now - lastWrite >= storage.flushInterval {
                    try await flush(final: reachedEnd)
                    if complete { break }
                }
            }
        } catch {
            // Bytes that arrived are valid: keep them, then report the failure.
            try await flush(final: true)
            throw TransferSession.transportFailure(error, url: url, configuration: configuration, paths: paths)
        }
        try await flush(final: true)
        if !complete && block.end < table.end(of: assignment.index) {
            throw RetryableFailure(
                error: HaulError(
                    .network,
                    "a connection ended at byte \(block.end) of a range that runs to \(table.end(of: assignment.index))"
                ))
        }
    }
}

/// Whether the answer to a range request is exactly that range of the same file.
enum SegmentResponse: Equatable {
    case accept
    case restart(RestartReason)
    case retry(retryAfter: Int64?)
    case fail(HaulError.Code, String)

    static func classify(
        status: Int, headers: HTTPHeaders, from: Int64, to: Int64, total: Int64, validator stored: ResourceValidator,
        now: Int64
    ) -> SegmentResponse {
        let validator = ResourceValidator(headers: headers)
        switch status {
        case 206:
            if let type = headers.first(name: "content-type"), type.lowercased().hasPrefix("multipart/byteranges") {
                return .restart(.multipartResponse)
            }
            if let coding = LegacyResponseClassifier.contentCoding(headers) { return .restart(.contentEncoded(coding)) }
            let header = headers.first(name: "content-range") ?? "missing"
            guard let range = ContentRange(header), range.first == from, range.last == to - 1 else {
                return .restart(.invalidContentRange("asked for bytes \(from)-\(to - 1), got Content-Range \(header)"))
            }
            guard range.completeLength == total else {
                return .restart(
                    .remoteChanged("length \(total) became \(range.completeLength.map(String.init) ?? "unknown")"))
            }
            if let length = headers.first(name: "content-length").flatMap({ Int64(decimalDigits: $0) }),
                length != to - from
            {
                return .restart(.invalidContentRange("Content-Length \(length) does not match Content-Range \(header)"))
            }
            let onlyMissing = validator.entityTag == nil && validator.lastModified == nil
            if let contradiction = stored.contradiction(with: validator), !onlyMissing {
                return .restart(.remoteChanged(contradiction))
            }
            return .accept
        case 200:
            // If-Range failed, or the server ignores ranges for this request.
            return .restart(stored.contradiction(with: validator).map(RestartReason.remoteChanged) ?? .rangeIgnored)
        case 416:
            return .restart(.rangeNotSatisfiable("416 to bytes \(from)-\(to - 1) of \(total)"))
        case 408, 429, 500, 502, 503, 504, 507...599:
            return .retry(retryAfter: headers.first(name: "retry-after").flatMap { RetryAfter.delay($0, now: now) })
        default:
            return .fail(
                .httpStatus, "the server answered \(status) \(HTTPResponseStatus(statusCode: status).reasonPhrase)")
        }
    }
}
