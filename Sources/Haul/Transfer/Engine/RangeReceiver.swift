import NIOCore
import Synchronization

/// Where the range a connection writes ends now. The transfer machine moves it (a take-over cuts a
/// range short); the connection reads it for every chunk.
final class StreamLimit: Sendable {
    private let value: Atomic<Int64>

    init(_ end: Int64) { value = Atomic(end) }

    var current: Int64 { value.load(ordering: .acquiring) }

    func set(_ end: Int64) { value.store(end, ordering: .releasing) }
}

/// Counts bytes as they come over the network.
final class ByteCounter: Sendable {
    private let value = Atomic<Int64>(0)

    var total: Int64 { value.load(ordering: .relaxed) }

    func add(_ count: Int) { value.add(Int64(count), ordering: .relaxed) }
}

/// Writes one answer's body into the partial file: the one write pipeline of every connection.
///
/// Network buffers are gathered into large page-aligned blocks; one block is written on the I/O
/// threads while the next one fills, so disk and network overlap while at most two blocks are held.
/// With direct I/O a block's full pages go straight to the disk and its last partial page waits for
/// the next block. The connection stops where its range ends now (``StreamLimit``); when its answer
/// goes on past that end, it asks whether to continue into the next range. Whatever happens, every
/// byte received is written and reported before ``receive(_:plan:)`` returns.
struct RangeReceiver: Sendable {
    let request: RequestTag
    let file: PartialFile
    let blockSize: Int
    let flushInterval: Duration
    let pieceSize: Int64
    let clock: TransferClock
    let rateLimiters: [RateLimiter]
    let prefix: PrefixHash?
    let limit: StreamLimit
    let fetched: ByteCounter
    /// Reports a write to the transfer machine.
    let post: @Sendable (TransferEvent) -> Void
    /// Asks the transfer machine what to do at the end of the range, at this offset.
    let proceed: @Sendable (Int64) async -> Continuation?
    /// Turns a failure of the answer's body into what it means for the transfer.
    let failure: @Sendable (any Error) -> TransferFailure

    /// One block on its way to the disk, and what the write left behind.
    private struct Receipt: Sendable {
        let segment: Int
        let end: Int64
        let pieces: PieceHasher
        let completed: [Int: String]
        let block: WriteBlock
        let error: (any Error)?
    }

    /// Writes the body as `plan` says; returns how the request ended.
    func receive(_ body: TransportBody, plan: ReceivePlan) async -> ConnectionEnd {
        var overlap: [UInt8] = []
        if plan.writeStart > plan.bodyStart {
            let count = Int(plan.writeStart - plan.bodyStart)
            do {
                overlap = try await file.read(count: count, at: plan.bodyStart)
            } catch {
                return .failed(failure(error))
            }
            // The file is shorter than its manifest says: its bytes cannot be compared.
            guard overlap.count == count else { return .failed(.overlapMismatch) }
        }
        var state = State(receiver: self, plan: plan)
        var outcome: TransferFailure?
        var stoppedEarly = false
        do {
            receiving: for try await chunk in body {
                var chunk = chunk
                fetched.add(chunk.readableBytes)
                state.bodyHasher?.update(chunk)
                if state.position < plan.writeStart {
                    // Bytes before the resume point are fetched again to compare them with the disk.
                    let count = min(Int(plan.writeStart - state.position), chunk.readableBytes)
                    let from = Int(state.position - plan.bodyStart)
                    guard chunk.readableBytesView.prefix(count).elementsEqual(overlap[from..<from + count]) else {
                        outcome = .overlapMismatch
                        break receiving
                    }
                    chunk.moveReaderIndex(forwardBy: count)
                    state.position += Int64(count)
                }
                state.skip(in: &chunk)
                while chunk.readableBytes > 0 {
                    let end = limit.current
                    if state.position >= end {
                        guard await state.flush(final: true) else { break receiving }
                        guard plan.answerEnd.map({ state.position < $0 }) ?? true else {
                            outcome = .retryable(
                                HaulError(
                                    .protocolViolation,
                                    "the server sent more than the announced \(plan.answerEnd ?? 0) bytes"),
                                retryAfter: nil)
                            break receiving
                        }
                        guard let next = await proceed(state.position) else {
                            stoppedEarly = true
                            break receiving
                        }
                        state.continueInto(next)
                        state.skip(in: &chunk)
                        continue
                    }
                    let count = min(Int(end - state.position), chunk.readableBytes, pace)
                    if count == chunk.readableBytes {
                        state.block.append(chunk)
                    } else if let slice = chunk.getSlice(at: chunk.readerIndex, length: count) {
                        state.block.append(slice)
                    }
                    chunk.moveReaderIndex(forwardBy: count)
                    state.position += Int64(count)
                    try await holdBack(count)
                    let reachedEnd = state.position >= end
                    if state.block.count >= blockSize || reachedEnd || clock.now - state.lastWrite >= flushInterval {
                        guard await state.flush(final: reachedEnd) else { break receiving }
                    }
                }
            }
        } catch {
            outcome = failure(error)
        }
        // Bytes that arrived are valid: write them, then report how the request ended (bytes that
        // failed the comparison with the disk are the only ones not kept).
        _ = await state.flush(final: true)
        if let error = state.writeError { return .failed(failure(error)) }
        if let outcome { return .failed(outcome) }
        if !stoppedEarly, let hasher = state.bodyHasher,
            let mismatch = ChecksumMismatch.first(expected: plan.contentDigests, computed: hasher.finalize())
        {
            return .failed(.bodyDigestMismatch(mismatch.description, from: plan.writeStart))
        }
        return .finished(at: state.position)
    }

    /// The most bytes passed on at once: the limiters' pace (see ``RateLimiter/pace``).
    private var pace: Int {
        var pace = Int.max
        for limiter in rateLimiters { pace = min(pace, limiter.pace ?? Int.max) }
        return pace
    }

    /// Waits as long as the rate limits require for `count` more bytes. A long wait is announced to
    /// the transfer machine first: a connection held back by a limit is not a stalled one.
    private func holdBack(_ count: Int) async throws {
        for limiter in rateLimiters where limiter.bytesPerSecond != nil {
            let now = clock.now
            let wait = limiter.debit(count, at: now)
            guard wait > .zero else { continue }
            if wait >= .milliseconds(500) { post(.throttled(request, until: now + wait)) }
            try await clock.sleep(for: wait)
        }
    }

    /// The connection's progress through its answer, and the blocks on their way to the disk.
    private struct State {
        let receiver: RangeReceiver
        var segment: Int
        /// The file offset of the next body byte.
        var position: Int64
        /// Body bytes before this offset are already stored: they are passed over.
        var writeFrom: Int64
        var block: WriteBlock
        var spare: WriteBlock?
        var pieces: PieceHasher
        var lastWrite: Moment
        var inFlight: Task<Receipt, Never>?
        var writeError: (any Error)?
        var bodyHasher: StreamingHasher?
        /// Where the answer ends, when its length is known.
        let answerEnd: Int64?

        init(receiver: RangeReceiver, plan: ReceivePlan) {
            self.receiver = receiver
            answerEnd = plan.answerEnd
            segment = plan.segment
            position = plan.bodyStart
            writeFrom = plan.writeStart
            // A small answer gets a block of its own size: no large allocation per small file.
            let rest = plan.answerEnd.map { max(0, $0 - plan.writeStart) } ?? Int64(receiver.blockSize)
            block = WriteBlock(capacity: Int(min(Int64(receiver.blockSize), rest)), start: plan.writeStart)
            pieces = PieceHasher(
                pieceSize: receiver.pieceSize,
                startingAtPiece: Int((plan.writeStart + receiver.pieceSize - 1) / receiver.pieceSize))
            lastWrite = receiver.clock.now
            bodyHasher =
                plan.contentDigests.isEmpty
                ? nil : StreamingHasher(algorithms: Set(plan.contentDigests.map(\.algorithm)))
        }

        /// The size of a new block that keeps `tail` bytes of the last one: a block's worth, or what is
        /// left of the answer when less (a small file's last write allocates no full block). A block
        /// grows when a connection goes on into another range.
        func nextCapacity(keeping tail: Int) -> Int {
            let left = answerEnd.map { max(0, $0 - position) } ?? Int64(receiver.blockSize)
            return Int(min(Int64(receiver.blockSize), Int64(tail + WriteBlock.pageSize) + left))
        }

        /// Passes over the body bytes before ``writeFrom``.
        mutating func skip(in chunk: inout ByteBuffer) {
            guard position < writeFrom else { return }
            let count = min(Int(writeFrom - position), chunk.readableBytes)
            chunk.moveReaderIndex(forwardBy: count)
            position += Int64(count)
        }

        /// Goes on into another range (the block is empty: it was just written out); its limit is
        /// set by whoever answered.
        mutating func continueInto(_ next: Continuation) {
            segment = next.segment
            writeFrom = max(next.skipTo, position)
            block.reset(start: writeFrom)
            pieces = PieceHasher(
                pieceSize: receiver.pieceSize,
                startingAtPiece: Int((writeFrom + receiver.pieceSize - 1) / receiver.pieceSize))
        }

        /// Hands the block's writable bytes to a write (all of them when `final`, and then waits for
        /// it); returns false once a write has failed.
        mutating func flush(final: Bool) async -> Bool {
            let file = receiver.file
            let writable = block.writableCount(final: final || !file.usesDirectWrites)
            if writable > 0 {
                guard await collect() else { return false }
                let data = block
                block = spare ?? WriteBlock(capacity: nextCapacity(keeping: data.count - writable), start: 0)
                spare = nil
                data.moveTail(after: writable, into: block)
                let pieces = self.pieces
                let segment = self.segment
                let prefix = receiver.prefix
                let pieceSize = receiver.pieceSize
                let request = receiver.request
                let post = receiver.post
                inFlight = Task {
                    let receipt = await Self.write(
                        data, segment: segment, to: file, pieces: pieces, pieceSize: pieceSize, prefix: prefix)
                    // Reported as soon as it is on disk, not when the next block goes out: a connection
                    // that stalls has its last bytes counted.
                    if receipt.error == nil {
                        post(.wrote(request, segment: segment, upTo: receipt.end, pieces: receipt.completed))
                    }
                    return receipt
                }
                lastWrite = receiver.clock.now
            }
            return final ? await collect() : writeError == nil
        }

        /// Waits for the write in flight and reports it; returns false once a write has failed.
        mutating func collect() async -> Bool {
            guard let task = inFlight else { return writeError == nil }
            inFlight = nil
            let receipt = await task.value
            if let error = receipt.error {
                writeError = writeError ?? error
                return false
            }
            pieces = receipt.pieces
            spare = receipt.block
            return writeError == nil
        }

        /// Writes one block and hashes it: the pieces it completes, and the file's checksum when the
        /// block continues the hashed prefix. Blocks of one connection are written one after the other,
        /// so its piece hasher sees its bytes in order.
        private static func write(
            _ block: WriteBlock, segment: Int, to file: PartialFile, pieces: PieceHasher, pieceSize: Int64,
            prefix: PrefixHash?
        ) async -> Receipt {
            do {
                try await file.write(block)
            } catch {
                return Receipt(
                    segment: segment, end: block.start, pieces: pieces, completed: [:], block: block, error: error)
            }
            prefix?.advance(over: block.bytes, at: block.start)
            var pieces = pieces
            var completed: [Int: String] = [:]
            let skip = Int(pieces.offset - block.start)
            if skip >= 0, skip < block.count {
                let first = Int(pieces.offset / pieceSize)
                for (offset, hash) in pieces.update(UnsafeRawBufferPointer(rebasing: block.bytes[skip...])).enumerated()
                {
                    completed[first + offset] = hash
                }
            }
            return Receipt(
                segment: segment, end: block.end, pieces: pieces, completed: completed, block: block, error: nil)
        }
    }
}
