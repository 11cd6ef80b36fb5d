import AsyncHTTPClient
import NIOCore
import NIOHTTP1

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Streaming a response body into the partial file.
extension TransferSession {

    mutating func receive(
        _ body: HTTPClientResponse.Body, plan: StreamPlan, finalURL: DownloadURL
    ) async throws -> DownloadResult? {
        guard let paths, let file else { throw HaulError(.fileSystem, "no destination was chosen") }
        try checkFreeSpace(plan: plan, paths: paths, file: file)
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
                bootID: BootIdentity.current, now: Int64(Date().timeIntervalSince1970),
                pieceSize: configuration.storage.pieceSize
            )
            if let total = plan.totalLength, total <= Int64(configuration.storage.blockSize), !replacing {
                // A file that arrives in one block is finished as soon as it is written: it needs no
                // manifest unless it fails (a failure stores one), which spares a file creation, a
                // rename and a deletion per small file.
                manifestUnwritten = true
            } else {
                try await checkpoint(durable: replacing)
            }
        } else {
            manifest?.finalURL = finalURL.string
            manifest?.validator = plan.validator
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

        if canSegment(plan), let total = plan.totalLength {
            return try await receiveSegmented(body, plan: plan, total: total, file: file)
        }

        var hasher = try await hasherForPrefix(plan.writeStart, validator: plan.validator, file: file)
        let pieces = try await pieceHasher(at: plan.writeStart, file: file)
        let received: Int64
        do {
            received = try await pump(body, file: file, plan: plan, overlap: overlap, hasher: &hasher, pieces: pieces)
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
        return try await finish(totalBytes: received, hasher: hasher)
    }

    /// Refuses a download the volume cannot hold, before anything is written for it. Bytes a restart
    /// will truncate count as free.
    func checkFreeSpace(plan: StreamPlan, paths: DownloadPaths, file: PartialFile) throws {
        guard let total = plan.totalLength, var free = POSIX.freeSpace(paths.directory) else { return }
        if plan.startsOver { free += (try? file.size()) ?? 0 }
        let needed = total - plan.writeStart
        let margin = configuration.storage.freeSpaceMargin
        guard needed + margin > free else { return }
        let keeping = margin > 0 ? " and \(ByteCount.format(margin)) must stay free" : ""
        throw HaulError(
            .insufficientSpace,
            "\(paths.directory) has \(ByteCount.format(free)) free, the download needs \(ByteCount.format(needed)) more"
                + keeping
        )
    }

    /// Reserves the space the rest of the download needs, as ``DownloaderConfiguration/FileAllocation``
    /// says. With one range the file's length must stay that of its written bytes (a resume on the same
    /// boot keeps what the length says), so only `fallocate` applies there, keeping the length. With
    /// several, the manifest already records each range's own progress, so the length may grow.
    /// What fits in one block is written in one go anyway: reserving it first would only cost a trip
    /// to the thread pool per small file.
    func reserveSpace(total: Int64, from offset: Int64, ranges: Int, file: PartialFile) async throws {
        let allocation = configuration.storage.fileAllocation
        guard allocation != .none, total - offset > Int64(configuration.storage.blockSize) else { return }
        if allocation == .fallocate {
            if try await file.reserve(from: offset, upTo: total, keepingSize: ranges <= 1) { return }
            downloader.logger.notice(
                "the file system cannot reserve space for \(file.path); it grows as bytes arrive")
        }
        if ranges > 1 { try await file.extend(to: total) }
    }

    struct WriteReceipt: Sendable {
        let end: Int64
        let durable: Bool
        /// The file's hash up to `end`, when the download is being verified.
        let hasher: StreamingHasher?
        /// The piece hasher at `end`, and the pieces this write completed.
        let pieces: PieceHasher
        let completedPieces: [String]
        /// The block that was written, free to be filled again.
        let block: WriteBlock
    }

    /// Streams the body into the file: network buffers are gathered into large blocks, and one block
    /// is written on the thread pool while the next one fills, so disk and network overlap while at
    /// most two blocks are held in memory (they take turns). With direct I/O, a block's full pages go
    /// straight to the disk and its last partial page waits for the next block.
    ///
    /// Whatever happens, every byte received is written and checkpointed before this returns or throws.
    mutating func pump(
        _ body: HTTPClientResponse.Body, file: PartialFile, plan: StreamPlan, overlap: [UInt8],
        hasher: inout StreamingHasher?, pieces: PieceHasher
    ) async throws -> Int64 {
        var runningPieces = pieces
        let writeStart = plan.writeStart
        let total = plan.totalLength
        let hasherAtStart = hasher
        var runningHasher = hasher
        // `Content-Digest` and `Content-MD5` cover this response's body, overlap included.
        let contentDigests = plan.contentDigests
        var bodyHasher = StreamingHasher(algorithms: Set(contentDigests.map(\.algorithm)))
        let storage = configuration.storage
        var meter = ProgressMeter(startingAt: writeStart, totalBytes: total, interval: configuration.progressInterval)
        if let minimum = storage.directWriteMinimum, (total ?? Int64.max) - writeStart >= minimum {
            file.enableDirectWrites()
        }
        let whole = !file.usesDirectWrites
        if let total { try await reserveSpace(total: total, from: writeStart, ranges: 1, file: file) }
        // A small file gets a block of its own size: no large allocation per file.
        let firstBlock = total.map { Int(clamping: max(0, min(Int64(storage.blockSize), $0 - writeStart))) }
        var block = WriteBlock(capacity: firstBlock ?? storage.blockSize, start: writeStart)
        var spare: WriteBlock?
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
                    if !bodyHasher.isEmpty { bodyHasher.update(chunk) }
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
                    block.append(chunk)
                    for limiter in rateLimiters { try await limiter.take(chunk.readableBytes) }
                    let now = clock.now
                    if let progress = meter.record(received, at: now) { observe(.progress(progress)) }
                    guard block.count >= storage.blockSize || now - lastWrite >= storage.flushInterval else {
                        continue
                    }
                    let writable = block.writableCount(final: whole)
                    guard writable > 0 else { continue }

                    if writeInFlight, let receipt = try await group.next() {
                        runningHasher = receipt.hasher
                        runningPieces = receipt.pieces
                        spare = receipt.block
                        try await recordWrite(receipt)
                    }
                    let durable = now - lastDurable >= storage.durableCheckpointInterval
                    if durable { lastDurable = now }
                    let data = block
                    let blockHasher = runningHasher
                    let blockPieces = runningPieces
                    block = spare ?? WriteBlock(capacity: storage.blockSize, start: 0)
                    spare = nil
                    data.moveTail(after: writable, into: block)
                    // Hashing rides along with the write, in file order: blocks are written one after the other.
                    group.addTask {
                        try await Self.writeBlock(
                            data, to: file, durable: durable, hasher: blockHasher, pieces: blockPieces)
                    }
                    writeInFlight = true
                    lastWrite = now
                }
            } catch {
                streamError = error
            }
            // Store what arrived even when the transfer failed: those bytes are valid.
            do {
                if writeInFlight, let receipt = try await group.next() {
                    runningHasher = receipt.hasher
                    runningPieces = receipt.pieces
                    try await recordWrite(receipt)
                }
                if block.count > 0 && !(streamError is OverlapMismatch) {
                    let receipt = try await Self.writeBlock(
                        block, to: file, durable: false, hasher: runningHasher, pieces: runningPieces)
                    runningHasher = receipt.hasher
                    runningPieces = receipt.pieces
                    try await recordWrite(receipt)
                }
            } catch {
                writeError = error
            }
        }
        let written = manifest?.segments.first?.written ?? writeStart
        if let runningHasher, runningHasher.count == written { prefixHash = (written, runningHasher) }

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
        if let mismatch = Self.mismatch(expected: contentDigests, computed: bodyHasher.finalize()) {
            // The body is not what the server says it sent: drop what it added and fetch it again.
            try await cutPartial(to: writeStart, file: file, durable: false)
            prefixHash = hasherAtStart.map { (writeStart, $0) }
            throw RetryableFailure(
                error: HaulError(
                    .checksumMismatch, "the response body failed its Content-Digest (\(mismatch.description))"))
        }
        if let progress = meter.record(received, at: clock.now, force: true) { observe(.progress(progress)) }
        if !manifestUnwritten || plan.totalLength.map({ received < $0 }) ?? true {
            try await checkpoint(durable: false)
        }
        hasher = runningHasher
        return received
    }

    /// Writes one block (flushing it when `durable`) and advances the hashers past it. Blocks are
    /// written one after the other, so the hashers see the file in order.
    static func writeBlock(
        _ block: WriteBlock, to file: PartialFile, durable: Bool, hasher: StreamingHasher?, pieces: PieceHasher
    ) async throws -> WriteReceipt {
        try await file.write(block)
        if durable { try await file.syncData() }
        var hasher = hasher
        hasher?.update(block.bytes)
        var pieces = pieces
        let completed = pieces.update(block.bytes)
        return WriteReceipt(
            end: block.end, durable: durable, hasher: hasher, pieces: pieces, completedPieces: completed, block: block)
    }

    /// Notes a finished write in the manifest, and stores the manifest when a checkpoint is due.
    mutating func recordWrite(_ receipt: WriteReceipt) async throws {
        guard manifest != nil else { return }
        manifest!.segments[0].written = receipt.end
        manifest!.pieces += receipt.completedPieces.map(Optional.some)
        if receipt.durable {
            // The write task already flushed the data up to `end`.
            manifest!.segments[0].durable = receipt.end
            try await storeManifest(durable: true)
        } else if clock.now - lastCheckpoint >= configuration.storage.checkpointInterval {
            try await storeManifest(durable: false)
        }
    }
}
