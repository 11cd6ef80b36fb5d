import Logging
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Runs one download: carries out the ``TransferMachine``'s actions and feeds it what happens. All
/// decisions are the machine's; this shell only sends requests, writes bodies (``RangeReceiver``),
/// touches files (``TransferFiles``) and keeps time.
///
/// Events reach the machine one at a time through one stream: connections report their answers,
/// writes and ends; a timer task wakes the machine at its next deadline; cancelling the calling task
/// pauses the download.
final class TransferDriver {
    /// What the driver's event stream carries.
    private enum Event: Sendable {
        case machine(TransferEvent)
        /// A request's answer arrived; it waits for the verdict.
        case answer(RequestTag, ResponseHead, Reply<Verdict>)
        /// A request reached the end of its range; it waits to hear whether to go on.
        case limit(RequestTag, at: Int64, Reply<Continuation?>)
        /// The timer with this number went off.
        case timer(UInt64)
    }

    /// What a connection does with its answer.
    enum Verdict: Sendable {
        case receive(ReceivePlan, RangeReceiver)
        case drop
    }

    private var machine: TransferMachine
    private let files: TransferFiles
    private let fetcher: HTTPFetcher
    private let clock: TransferClock
    private let observe: @Sendable (DownloadEvent) -> Void
    /// Told as the file is finished (see ``Downloader/download(_:observing:finishing:)``).
    private let finishing: FinishingHooks
    private let logger: Logger
    private let rateLimiters: [RateLimiter]
    private let events: AsyncStream<Event>
    private let post: AsyncStream<Event>.Continuation
    private let fetched = ByteCounter()
    /// The task of every request that has not ended yet (a dropped answer may still drain while its
    /// connection's next request runs): each is awaited before the download ends.
    private var tasks: [RequestTag: Task<Void, Never>] = [:]
    private var limits: [Int: StreamLimit] = [:]
    private var heads: [Int: ResponseHead] = [:]
    /// The request whose answer each connection is waiting on a verdict for.
    private var answering: [Int: RequestTag] = [:]
    private var verdicts: [Int: Reply<Verdict>] = [:]
    private var continuations: [Int: Reply<Continuation?>] = [:]
    private var timer: (deadline: Moment, number: UInt64, task: Task<Void, Never>)?
    /// When the machine next needs a timer event, as its last step said.
    private var deadline: Moment?
    /// How the download ended, once the machine said so.
    private var outcome: TransferOutcome?
    private var timersSet: UInt64 = 0
    private var checkpointTask: Task<Void, Never>?

    private init(
        downloader: Downloader, request: DownloadRequest, url: DownloadURL, files: TransferFiles,
        observe: @escaping @Sendable (DownloadEvent) -> Void, finishing: FinishingHooks,
        events: AsyncStream<Event>, post: AsyncStream<Event>.Continuation
    ) {
        let configuration = downloader.configuration
        // The request was checked before the download started: its mirrors parse.
        let sources = (try? request.sources()) ?? [url]
        self.machine = TransferMachine(
            settings: TransferMachine.Settings(configuration, request: request), sources: sources.map(\.string),
            bootID: BootIdentity.current, now: downloader.clock.now)
        self.files = files
        self.fetcher = HTTPFetcher(
            sources: sources, request: request, transport: downloader.transport, hostCap: downloader.hostCap,
            configuration: configuration, logger: downloader.logger)
        self.clock = downloader.clock
        self.observe = observe
        self.finishing = finishing
        self.logger = downloader.logger
        self.rateLimiters = [
            request.rateLimiter
                ?? request.bytesPerSecondLimit.map { RateLimiter(bytesPerSecond: $0, clock: downloader.clock) },
            configuration.sharedRateLimiter,
        ].compactMap { $0 }
        self.events = events
        self.post = post
    }

    /// Runs a download until it is complete, fails, or the calling task is cancelled (a pause: the
    /// data and its manifest stay). A fresh download from an origin whose files come small and whole
    /// first tries ``WholeAnswer``.
    static func run(
        downloader: Downloader, request: DownloadRequest, url: DownloadURL,
        observe: @escaping @Sendable (DownloadEvent) -> Void, finishing: FinishingHooks
    ) async throws -> DownloadResult {
        let files = TransferFiles(downloader: downloader, request: request, url: url)
        var found: FoundDownload
        do {
            found = try files.open()
        } catch {
            files.release()
            throw HaulError.wrapping(error)
        }
        let configuration = downloader.configuration
        let fits = WholeAnswer.fits(request, found: found, configuration: configuration)
        if fits, downloader.smallAnswers.contains(url.origin) {
            do {
                switch try await WholeAnswer.run(
                    request, from: url, found: found, files: files, downloader: downloader, observe: observe,
                    finishing: finishing)
                {
                case .finished(let result): return result
                case .declined(let stored): found = stored
                }
            } catch {
                files.release()
                throw HaulError.wrapping(error)
            }
        }
        // The first answer's facts, for whether the origin's next downloads try the shortcut.
        let started = Mutex<DownloadStart?>(nil)
        var observing = observe
        if fits {
            observing = { event in
                if case .started(let start) = event { started.withLock { $0 = $0 ?? start } }
                observe(event)
            }
        }
        let start = found
        let (events, post) = AsyncStream<Event>.makeStream()
        // The download runs in a task of its own: a cancelled task's stream iteration would end at
        // once, where a pause must first stop the connections and store a checkpoint.
        let download = Task { () -> Result<DownloadResult, HaulError> in
            do {
                let driver = TransferDriver(
                    downloader: downloader, request: request, url: url, files: files, observe: observing,
                    finishing: finishing, events: events, post: post)
                return .success(try await driver.run(start))
            } catch {
                files.release()
                return .failure(HaulError.wrapping(error))
            }
        }
        let outcome = await withTaskCancellationHandler {
            await download.value
        } onCancel: {
            post.yield(.machine(.cancel))
        }
        let result = try outcome.get()
        // One small answer the shortcut would have taken: the origin's next downloads try it.
        if fits, WholeAnswer.wouldFit(started.withLock { $0 }, result, configuration: configuration) {
            downloader.smallAnswers.note(url.origin, small: true)
        }
        return result
    }

    private func run(_ found: FoundDownload) async throws -> DownloadResult {
        await loop(found)
        switch outcome {
        case nil:
            throw HaulError(.fileSystem, "the download stopped without an outcome")
        case .completed(let summary):
            return DownloadResult(
                destination: files.paths?.destination ?? "", url: fetcher.url.string, bytes: summary.totalBytes,
                bytesFetched: fetched.total, resumedFrom: summary.resumedFrom, restarts: summary.restarts,
                validator: summary.validator)
        case .paused:
            let detail = files.paths.map { ": the partial file \($0.partial) is kept" } ?? ""
            throw HaulError(.cancelled, "download cancelled\(detail)", underlying: CancellationError())
        case .failed(let error):
            throw error
        }
    }

    private func loop(_ found: FoundDownload) async {
        await perform(.start(found))
        if outcome == nil {
            rearmTimer()
            for await event in events {
                switch event {
                case .machine(let event):
                    // A request's end is the last thing its task posts.
                    if case .ended(let request, _) = event { tasks[request] = nil }
                    await perform(event)
                case .timer(let number):
                    // The timer that went off is spent; one cancelled a moment too late leaves the
                    // current one in place.
                    if timer?.number == number { timer = nil }
                    await perform(.timer)
                case .answer(let request, let head, let reply):
                    heads[request.connection] = head
                    answering[request.connection] = request
                    verdicts[request.connection] = reply
                    await perform(.head(request, head))
                case .limit(let request, let offset, let reply):
                    continuations[request.connection] = reply
                    await perform(.reachedLimit(request, at: offset))
                }
                if outcome != nil { break }
                rearmTimer()
            }
        }
        timer?.task.cancel()
        for task in tasks.values { task.cancel() }
        for task in tasks.values { await task.value }
        await checkpointTask?.value
        post.finish()
    }

    /// Gives the machine an event, then carries out what it asks, feeding back the results of what
    /// the shell does at once (checks, file changes, verification).
    private func perform(_ event: TransferEvent) async {
        var pending = step(event)[...]
        while let action = pending.popFirst() {
            do {
                if let result = try await execute(action) {
                    pending = step(result)[...] + pending
                }
            } catch {
                // What was planned after the failed step no longer holds; requests it would have sent
                // never started. An end the machine reached still does: it takes no more events.
                for case .send(let request, _) in pending {
                    post.yield(.machine(.ended(request, .dropped)))
                }
                let ends = pending.filter { if case .end = $0 { true } else { false } }
                pending = step(.failed(HaulError.wrapping(error)))[...] + ends
            }
        }
    }

    /// Gives the machine one event; returns its actions and keeps its next deadline.
    private func step(_ event: TransferEvent) -> [TransferAction] {
        let taken = machine.handle(event, now: clock.now)
        deadline = taken.deadline
        return taken.actions
    }

    /// Carries out one action; returns the event it results in when the shell completes it at once.
    private func execute(_ action: TransferAction) async throws -> TransferEvent? {
        switch action {
        case .prepareFile, .checkpoint, .lastCheckpoint, .cut, .discard, .finish:
            try checkWritePermit()
        default:
            break
        }
        switch action {
        case .checkStoredData(let manifest):
            return .storedDataChecked(try await files.checkStoredData(manifest))
        case .chooseDestination(let connection):
            let disposition = heads[connection]?.headers.first(name: "content-disposition")
            return .destinationChosen(try files.chooseDestination(contentDisposition: disposition))
        case .prepareFile(let preparation):
            await checkpointTask?.value
            try await files.prepare(preparation)
        case .checkpoint(let checkpoint):
            let checkpointer = try files.checkpointer()
            files.noteManifestStored()
            checkpointTask = Self.store(checkpoint, with: checkpointer, reportingTo: post)
        case .lastCheckpoint(let checkpoint):
            let checkpointer = try files.checkpointer()
            files.noteManifestStored()
            await checkpointTask?.value
            return .checkpointed(pieces: try await checkpointer.store(checkpoint))
        case .cut(let offset):
            await checkpointTask?.value
            try await files.cut(to: offset)
        case .forgetHashes(let offset):
            files.forgetHashes(from: offset)
        case .discard:
            await checkpointTask?.value
            try await files.discard()
            return .discarded
        case .verify(let total, let validator):
            return .verified(try await files.verify(totalBytes: total, validator: validator))
        case .finish(let total, let manifest):
            await checkpointTask?.value
            // Handed over to the finisher (the caller's next download may start), then, right before
            // the rename, the caller's record, in one transaction with the files finishing beside this
            // one. The write permit is asked after it, closest to the rename.
            _ = try await files.finish(totalBytes: total, manifest: manifest, finishing: finishing)
            return .finished
        case .send(let request, let ask):
            start(ask, as: request)
        case .receive(let connection, let plan):
            guard let reply = verdicts.removeValue(forKey: connection), let request = answering[connection] else {
                return nil
            }
            do {
                reply.resolve(.receive(plan, try receiver(for: request, plan: plan)))
            } catch {
                reply.resolve(.drop)
                throw error
            }
        case .drop(let connection):
            verdicts.removeValue(forKey: connection)?.resolve(.drop)
        case .abandon(let connection):
            for (request, task) in tasks where request.connection == connection { task.cancel() }
            verdicts.removeValue(forKey: connection)?.resolve(.drop)
            continuations.removeValue(forKey: connection)?.resolve(nil)
        case .setLimit(let connection, let end):
            limits[connection]?.set(end)
        case .proceed(let connection, let next):
            // The new limit is set here, in order with the machine's later cuts of that range: set by
            // the connection once it resumes, it could undo a cut made in between.
            if let next { limits[connection]?.set(next.limit) }
            continuations.removeValue(forKey: connection)?.resolve(next)
        case .started(let facts):
            observe(
                .started(
                    DownloadStart(
                        destination: files.paths?.destination ?? "", url: facts.url, totalBytes: facts.totalBytes,
                        resumedFrom: facts.resumedFrom, resumable: facts.resumable, validator: facts.validator)))
        case .report(let event):
            observe(event)
        case .log(let message):
            logger.debug("\(message)", metadata: ["url": "\(fetcher.url.string)"])
        case .end(let outcome):
            self.outcome = outcome
        }
        return nil
    }

    /// Throws ``HaulError/Code/locked`` when the downloader may not write any more (see
    /// ``DownloaderConfiguration/writePermit``).
    private func checkWritePermit() throws {
        guard let permit = files.configuration.writePermit, !permit() else { return }
        throw DownloaderConfiguration.writeRefused
    }

    /// Starts connection `connection`'s request: the answer's head goes to the machine, and the body
    /// is written or dropped as it says.
    private func start(_ ask: RangeAsk, as request: RequestTag) {
        let post = self.post
        let fetcher = self.fetcher
        let connection = request.connection
        tasks[request] = Task {
            let end: ConnectionEnd
            do {
                end = try await fetcher.fetch(
                    ask, connection: connection, source: request.source,
                    waiting: { post.yield(.machine($0 ? .queued(request) : .admitted(request))) },
                    active: { post.yield(.machine(.active(request))) }
                ) { response, finalURL in
                    let reply = Reply<Verdict>()
                    let head = ResponseHead(
                        status: response.status, headers: response.fields, finalURL: finalURL.string,
                        date: Int64(Date().timeIntervalSince1970))
                    post.yield(.answer(request, head, reply))
                    switch await reply.wait() {
                    case .drop:
                        await response.body.discard(upTo: 64 * 1024)
                        return .dropped
                    case .receive(let plan, let receiver):
                        return await receiver.receive(response.body, plan: plan)
                    }
                }
            } catch {
                end = .failed(fetcher.failure(error))
            }
            post.yield(.machine(.ended(request, end)))
        }
    }

    /// Stores a checkpoint beside the transfer and reports when it is done.
    private static func store(
        _ checkpoint: Checkpoint, with checkpointer: Checkpointer, reportingTo post: AsyncStream<Event>.Continuation
    ) -> Task<Void, Never> {
        Task {
            do {
                let pieces = try await checkpointer.store(checkpoint)
                post.yield(.machine(.checkpointed(pieces: pieces)))
            } catch {
                post.yield(.machine(.failed(HaulError.wrapping(error))))
            }
        }
    }

    /// The pipeline that writes connection `connection`'s answer as `plan` says, stopping at its
    /// limit (which moves with ``TransferAction/setLimit(connection:_:)``).
    private func receiver(for request: RequestTag, plan: ReceivePlan) throws -> RangeReceiver {
        guard let file = files.file else { throw HaulError(.fileSystem, "no destination was chosen") }
        let limit = StreamLimit(plan.limit)
        limits[request.connection] = limit
        let storage = files.configuration.storage
        let post = self.post
        let fetcher = self.fetcher
        return RangeReceiver(
            // Bytes are written at least as often as progress is reported, which counts written bytes.
            request: request, file: file, blockSize: storage.blockSize,
            flushInterval: min(storage.flushInterval, files.configuration.progressInterval),
            pieceSize: plan.pieceSize, clock: clock, rateLimiters: rateLimiters,
            prefix: files.prefix, limit: limit, fetched: fetched,
            post: { post.yield(.machine($0)) },
            proceed: { offset in
                let reply = Reply<Continuation?>()
                post.yield(.limit(request, at: offset, reply))
                return await reply.wait()
            },
            failure: { fetcher.failure($0) })
    }

    /// Wakes the machine at its next deadline. A timer set for an earlier moment is kept: most events
    /// only push the deadline later (a stall deadline moves with every write), and a wake-up before
    /// anything is due costs the machine nothing, where a new timer per event would cost a task each.
    private func rearmTimer() {
        guard let deadline else {
            timer?.task.cancel()
            timer = nil
            return
        }
        if let timer, timer.deadline <= deadline { return }
        timer?.task.cancel()
        let clock = self.clock
        let post = self.post
        timersSet += 1
        let number = timersSet
        timer = (
            deadline, number,
            Task {
                // Whatever ends the sleep but a cancellation wakes the machine: a clock that throws
                // or wakes early must not leave the download without a timer.
                try? await clock.sleep(until: deadline)
                guard !Task.isCancelled else { return }
                post.yield(.timer(number))
            }
        )
    }
}

/// A value one task waits for and another provides, once.
final class Reply<Value: Sendable>: Sendable {
    private struct State {
        var value: Value?
        var resolved = false
        var waiter: CheckedContinuation<Value, Never>?
    }

    private let state = Mutex(State())

    func wait() async -> Value {
        await withCheckedContinuation { continuation in
            let value = state.withLock { state -> Value? in
                if state.resolved { return state.value }
                state.waiter = continuation
                return nil
            }
            if let value { continuation.resume(returning: value) }
        }
    }

    /// Provides the value; later calls do nothing.
    func resolve(_ value: Value) {
        let waiter = state.withLock { state -> CheckedContinuation<Value, Never>? in
            guard !state.resolved else { return nil }
            state.resolved = true
            state.value = value
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: value)
    }
}
