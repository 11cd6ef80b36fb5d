import NIOCore
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The shortcut a fresh download takes when its first answer is likely the whole file, and small:
/// the common download of a long list of small files.
///
/// The shortcut sends the request the transfer machine would send first, through the same fetcher
/// (headers, credentials, cookies, redirects, the cap per host), over the kept-alive connections
/// of ``WholeAnswerTransport`` where the downloader has it. A request those connections do not take
/// (through a proxy, say) is sent again through the general client from the first URL: a chain of
/// redirects of which a later one is not taken is followed twice. An answer the machine would accept
/// whole from byte 0, of a known length no larger than ``limit(_:)``, with no content coding and no
/// digest to check, is read into memory, written to the partial file in one write, and handed to the
/// finisher like any other finished file: its data made durable, the caller's record written, the
/// file renamed. Nothing is reported complete earlier than on the machine's path.
///
/// Any other answer, a failure or a body that takes longer than the stall timeout is declined before
/// a file is chosen, and the download takes the machine's path from its first request. A declined
/// answer costs a request, so the shortcut is tried only on an origin whose last download was such
/// an answer (``SmallAnswerOrigins``): a list of small files from one server pays for none, and a
/// large file after small ones for one.
enum WholeAnswer {
    /// How a shortcut ended.
    enum Outcome: Sendable {
        /// The file is complete under its final name.
        case finished(DownloadResult)
        /// Nothing was written: the download goes the machine's way, from what is stored as `found`
        /// says (the name the answer gave may hold a download of this URL begun meanwhile, which the
        /// machine resumes, as it does when its own first answer names it).
        case declined(FoundDownload)
    }

    /// The largest answer taken whole: a write block, at most 1 MiB (the machine's path holds as
    /// much of a body in memory before it writes).
    static func limit(_ configuration: DownloaderConfiguration) -> Int64 {
        Int64(min(configuration.storage.blockSize, 1 << 20))
    }

    /// Whether `request` could take the shortcut with `found` stored: nothing stored, one source, no
    /// checksum to verify, no rate to keep to, and no fleet's lease. (Whether its origin's answers
    /// are small is for ``SmallAnswerOrigins`` to say.)
    static func fits(_ request: DownloadRequest, found: FoundDownload, configuration: DownloaderConfiguration) -> Bool {
        switch found {
        case .nothing, .unnamed: break
        case .stored, .complete, .untrusted: return false
        }
        // A fleet's worker (a write permit) is left the machine's path: there the file's name reaches
        // the queue with the first answer, in a group commit, so a worker that takes the download
        // over after a database outage knows the file; the shortcut learns it only at the end.
        return request.mirrors.isEmpty && request.checksum == nil && request.bytesPerSecondLimit == nil
            && request.rateLimiter?.bytesPerSecond == nil && configuration.sharedRateLimiter?.bytesPerSecond == nil
            && configuration.writePermit == nil
    }

    /// Whether the machine's first answer, which began as `start` and ended as `result`, was one
    /// the shortcut takes: from byte 0, of a length told first, small, with no digest to check.
    static func wouldFit(_ start: DownloadStart?, _ result: DownloadResult, configuration: DownloaderConfiguration)
        -> Bool
    {
        guard let start, start.resumedFrom == 0, start.totalBytes == result.bytes, start.validator.digests.isEmpty
        else { return false }
        return result.restarts == 0 && result.bytesFetched == result.bytes && result.bytes <= limit(configuration)
    }

    /// The longest body written on the downloading task's own thread; a longer one is written on an
    /// I/O thread.
    static let inlineWriteLimit = 64 * 1024

    /// The first request the transfer machine sends for a download with nothing stored.
    static func firstAsk(_ request: DownloadRequest, configuration: DownloaderConfiguration) -> RangeAsk {
        .fresh(probesRanges: TransferMachine.Settings(configuration, request: request).connections > 1)
    }

    /// Tries the shortcut for `request` from `url`, whose files are open in `files` with `found`
    /// (nothing) stored. Throws when the file cannot be written or finished (the caller releases
    /// `files`), and when the calling task is cancelled.
    static func run(
        _ request: DownloadRequest, from url: DownloadURL, found: FoundDownload, files: TransferFiles,
        downloader: Downloader, observe: @Sendable (DownloadEvent) -> Void,
        finishing: FinishingHooks
    ) async throws -> Outcome {
        let configuration = downloader.configuration
        let clock = downloader.clock
        let since = clock.now
        // The body is let go once it is written: a file waiting for the finisher holds no buffer
        // (the buffer a connection read the answer into, which may be larger).
        let written: Written
        switch try await fetchAndWrite(request, from: url, found: found, files: files, downloader: downloader) {
        case .declined(let chosen): return .declined(chosen)
        case .written(let answer): written = answer
        }
        guard let paths = files.paths else { throw HaulError(.fileSystem, "no destination was chosen") }
        let total = written.total
        observe(
            .started(
                DownloadStart(
                    destination: paths.destination, url: written.finalURL, totalBytes: total, resumedFrom: 0,
                    resumable: written.facts.resumable(trustingUnvalidated: configuration.trustUnvalidatedResume),
                    validator: written.facts.validator)))
        let seconds = (clock.now - since).seconds
        observe(
            .progress(
                DownloadProgress(
                    bytes: total, totalBytes: total, bytesPerSecond: seconds > 0 ? Double(total) / seconds : 0,
                    secondsRemaining: 0, connections: 1)))
        let destination = try await files.finish(totalBytes: total, manifest: nil, finishing: finishing)
        let result = DownloadResult(
            destination: destination, url: url.string, bytes: total, bytesFetched: total, resumedFrom: 0,
            restarts: 0, validator: written.facts.validator)
        downloader.smallAnswers.noteFinished()
        return .finished(result)
    }

    /// What is known of an answer whose body was written whole to the partial file.
    private struct Written: Sendable {
        let facts: ResponseFacts
        let total: Int64
        let finalURL: String
    }

    /// How ``fetchAndWrite(_:from:found:files:downloader:)`` ended.
    private enum Fetched: Sendable {
        case written(Written)
        case declined(FoundDownload)
    }

    /// Asks for `request`'s first answer and, when the shortcut takes it, chooses the file, prepares
    /// it and writes the body to it in one write; else declines, with what is stored under the name
    /// the answer gave. Throws as ``run(_:from:found:files:downloader:observe:finishing:)`` does.
    private static func fetchAndWrite(
        _ request: DownloadRequest, from url: DownloadURL, found: FoundDownload, files: TransferFiles,
        downloader: Downloader
    ) async throws -> Fetched {
        let configuration = downloader.configuration
        let answer: Answer?
        do {
            // The shortcut's own connections give up on a stalled answer themselves.
            let whole = downloader.wholeAnswerTransport
            answer = try await ask(
                request, from: url, through: whole ?? downloader.transport, downloader: downloader,
                watched: whole == nil)
        } catch is WholeAnswerTransport.NotTaken {
            answer = try await ask(
                request, from: url, through: downloader.transport, downloader: downloader, watched: true)
        }
        // A pause while the body came: no new request after it.
        if Task.isCancelled { throw cancelled }
        guard let answer else {
            downloader.smallAnswers.note(url.origin, small: false)
            return .declined(found)
        }
        let chosen = try files.chooseDestination(contentDisposition: answer.contentDisposition)
        guard case .nothing = chosen else { return .declined(chosen) }
        guard let file = files.file else { throw HaulError(.fileSystem, "no destination was chosen") }
        let facts = answer.facts
        let total = Int64(answer.body.readableBytes)
        // As the machine prepares a fresh file: the room it needs (beside the margin kept free), and
        // no manifest for a file that arrives in one block.
        let manifest = Manifest(
            originalURL: url.string, finalURL: answer.finalURL, validator: facts.validator, totalLength: total,
            acceptsRanges: facts.acceptsRanges, contentEncoding: nil, bootID: BootIdentity.current,
            now: Int64(Date().timeIntervalSince1970), pieceSize: configuration.storage.pieceSize)
        try await files.prepare(
            FilePreparation(
                manifest: manifest, startsOver: true, storesLayout: false, neededBytes: total, reservation: nil))
        let body = answer.body
        if body.readableBytes <= inlineWriteLimit {
            // Into the page cache, as quick as the trip to an I/O thread and back it spares.
            try body.withUnsafeReadableBytes { try file.writeNow($0, at: 0) }
        } else {
            try await downloader.io.run { try body.withUnsafeReadableBytes { try file.writeNow($0, at: 0) } }
        }
        return .written(Written(facts: facts, total: total, finalURL: answer.finalURL))
    }

    /// The answer to the first request for `request` from `url` sent through `transport`, when the
    /// shortcut takes it (see ``read(_:from:ask:limit:)``); `nil` when it does not, or the request
    /// fails, or (when `watched`) its answer has not come whole within the stall timeout. Throws
    /// when the calling task is cancelled, and ``WholeAnswerTransport/NotTaken`` when `transport`
    /// does not take the request.
    private static func ask(
        _ request: DownloadRequest, from url: DownloadURL, through transport: any DownloadTransport,
        downloader: Downloader, watched: Bool
    ) async throws -> Answer? {
        let configuration = downloader.configuration
        let fetcher = HTTPFetcher(
            sources: [url], request: request, transport: transport, hostCap: downloader.hostCap,
            configuration: configuration, logger: downloader.logger)
        let ask = firstAsk(request, configuration: configuration)
        let limit = limit(configuration)
        do {
            guard watched else {
                return try await fetcher.fetch(ask, connection: 0) { response, finalURL in
                    await read(response, from: finalURL, ask: ask, limit: limit)
                }
            }
            let watch = Watch()
            return try await watch.within(configuration.timeouts.stall, on: downloader.clock) {
                try await fetcher.fetch(ask, connection: 0, waiting: { watch.noteWaiting($0) }) { response, finalURL in
                    await read(response, from: finalURL, ask: ask, limit: limit)
                }
            }
        } catch {
            if let failure = error as? FetchFailure, failure.error is WholeAnswerTransport.NotTaken {
                throw failure.error
            }
            if case .cancelled = fetcher.failure(error) { throw cancelled }
            return nil
        }
    }

    /// What a paused shortcut ends with, as a paused download does.
    private static var cancelled: HaulError {
        HaulError(.cancelled, "download cancelled", underlying: CancellationError())
    }

    /// An answer taken whole.
    private struct Answer: Sendable {
        let facts: ResponseFacts
        let body: ByteBuffer
        let finalURL: String
        let contentDisposition: String?
    }

    /// `response`'s body, when the machine would accept it whole from byte 0 and it is at most
    /// `limit` bytes long, with no coding and no digest; `nil` otherwise (its body drained a little,
    /// so that a short one leaves the connection open) or when the body ends early or fails.
    private static func read(_ response: TransportResponse, from finalURL: DownloadURL, ask: RangeAsk, limit: Int64)
        async -> Answer?
    {
        let verdict = ResponseClassifier.classify(
            status: response.status, headers: response.fields, ask: ask, now: Int64(Date().timeIntervalSince1970))
        guard case .accept(let facts) = verdict, facts.bodyStart == 0, facts.writeStart == 0,
            let total = facts.totalLength, total <= limit, facts.contentEncoding == nil,
            facts.contentDigests.isEmpty, facts.validator.digests.isEmpty
        else {
            await response.body.discard(upTo: 64 * 1024)
            return nil
        }
        var body = ByteBuffer()
        do {
            for try await chunk in response.body {
                guard body.readableBytes + chunk.readableBytes <= total else { return nil }
                if body.readableBytes == 0 && chunk.readableBytes == total {
                    // The whole body in one piece (as the shortcut's own connections hand it over).
                    body = chunk
                } else {
                    body.reserveCapacity(Int(total))
                    body.writeImmutableBuffer(chunk)
                }
            }
        } catch {
            return nil
        }
        guard body.readableBytes == total else { return nil }
        return Answer(
            facts: facts, body: body, finalURL: finalURL.string,
            contentDisposition: response.fields.first(name: "content-disposition"))
    }

    /// Gives up on an answer that has not come whole a stall timeout after its request was sent. The
    /// time a request waits for a connection under the cap per host does not count (such a wait is no
    /// stall, as on the machine's path): while it waits, and for a timeout after it got one, the watch
    /// waits on. A small body still coming after that goes the machine's way, which tells a slow
    /// answer from a stalled one.
    final class Watch: Sendable {
        private let moves = Atomic<Int>(0)
        private let waiting = Atomic<Bool>(false)

        /// The request waits for a connection (`true`), or got one (`false`).
        func noteWaiting(_ waits: Bool) {
            waiting.store(waits, ordering: .relaxed)
            moves.add(1, ordering: .relaxed)
        }

        /// What `body` returns, unless `timeout` passes on `clock` with the request neither waiting
        /// nor admitted meanwhile: then `nil`, `body` cancelled.
        func within<Value: Sendable>(
            _ timeout: Duration, on clock: TransferClock, _ body: @escaping @Sendable () async throws -> Value?
        ) async throws -> Value? {
            try await withThrowingTaskGroup(of: Value?.self) { group in
                group.addTask { try await body() }
                group.addTask {
                    var seen = self.moves.load(ordering: .relaxed)
                    while true {
                        try await clock.sleep(for: timeout)
                        let now = self.moves.load(ordering: .relaxed)
                        if now == seen && !self.waiting.load(ordering: .relaxed) { return nil }
                        seen = now
                    }
                }
                defer { group.cancelAll() }
                return try await group.next() ?? nil
            }
        }
    }
}

/// The origins whose last download the shortcut of ``WholeAnswer`` fitted: their next fresh
/// downloads try it. An origin is noted by a download that took the machine's path and turned out
/// one small whole answer, and forgotten when a shortcut is declined.
final class SmallAnswerOrigins: Sendable {
    private let origins = Mutex<Set<String>>([])
    private let finished = Atomic<Int>(0)
    /// The most origins remembered; more start the memory over.
    static let capacity = 4096

    /// How many downloads the shortcut finished.
    var finishedCount: Int { finished.load(ordering: .relaxed) }

    /// Counts a download the shortcut finished.
    func noteFinished() { finished.add(1, ordering: .relaxed) }

    /// Whether `origin`'s last download was one small whole answer.
    func contains(_ origin: String) -> Bool { origins.withLock { $0.contains(origin) } }

    /// Notes how `origin`'s last download went.
    func note(_ origin: String, small: Bool) {
        origins.withLock { origins in
            guard small else {
                origins.remove(origin)
                return
            }
            if origins.count >= Self.capacity { origins.removeAll() }
            origins.insert(origin)
        }
    }
}
