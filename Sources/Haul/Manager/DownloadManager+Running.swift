import HeapModule
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The events of every running download on their way to the manager, in order. One task takes
/// them all to the manager in one trip whenever the mailbox goes from empty to not empty.
final class EventMailbox: Sendable {
    private struct State {
        var events: [(DownloadID, DownloadEvent)] = []
        var doorbell: AsyncStream<Void>.Continuation?
    }

    private let state = Mutex(State())

    /// The rings of the doorbell from now on, for one run of the manager.
    func rings() -> AsyncStream<Void> {
        let (rings, doorbell) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        state.withLock { $0.doorbell = doorbell }
        return rings
    }

    func post(_ event: DownloadEvent, of id: DownloadID) {
        let doorbell = state.withLock { state in
            state.events.append((id, event))
            return state.events.count == 1 ? state.doorbell : nil
        }
        doorbell?.yield()
    }

    func take() -> [(DownloadID, DownloadEvent)] {
        state.withLock { state in
            defer { state.events = [] }; return state.events
        }
    }
}

extension DownloadManager {
    /// Starts queued downloads, at most ``Configuration/maxConcurrentDownloads`` transferring at once
    /// (see ``Configuration/maxConcurrentDownloads`` for those being finished), until the
    /// calling task is cancelled. Cancellation stops every running download with a durable checkpoint;
    /// they are queued again, so the next manager on this state continues them. Returns once they have stopped.
    /// Returns at once while the queue already runs or a ``stop()`` is under way, and after ``close()``.
    public func run() async {
        await run(stoppingWhenIdle: false, owned: false)
    }

    /// Like ``run()``, but returns as soon as no download of this manager is running, queued or
    /// waiting for disk space.
    public func runUntilIdle() async {
        await run(stoppingWhenIdle: true, owned: false)
    }

    /// Runs the queue until it is idle (when `stoppingWhenIdle`), cancelled, stopped or closed;
    /// `owned`: the run of the task ``start()`` made. Returns at once when the lifecycle does not
    /// let this run begin (see ``Lifecycle/beginRun(stopsWhenIdle:owned:)``).
    func run(stoppingWhenIdle: Bool, owned: Bool) async {
        guard let starts = lifecycle.beginRun(stopsWhenIdle: stoppingWhenIdle, owned: owned) else { return }
        schedule()
        let rings = mailbox.rings()
        // A discarding group: a download's task is freed as soon as it ends, where a plain group keeps
        // every finished child until it is awaited (about 7 KiB a download, for the whole run).
        // A fleet's worker hears what the others change, for its event streams.
        let notices = claim.lease == nil ? nil : store.notices()
        await withDiscardingTaskGroup { group in
            group.addTask { await self.tick() }
            group.addTask {
                for await _ in rings { await self.handleEvents() }
            }
            if let notices {
                group.addTask {
                    for await notice in notices { await self.othersChanged(notice) }
                }
            }
            for await id in starts {
                group.addTask { await self.execute(id) }
            }
            // Idle, or cancelled: nothing more starts (a download that ends now must not hand its
            // slot to one that would never run), the ticker ends, and on cancellation so do the
            // downloads.
            self.lifecycle.endRun()
            group.cancelAll()
        }
        persistProgress()
    }

    /// Starts waiting downloads while there are free slots; ends an idle `runUntilIdle`.
    func schedule() {
        guard let run = lifecycle.run else { return }
        // Outside the start windows, or while a caller holds starts, nothing starts.
        while transferring < configuration.maxConcurrentDownloads, finishing.count < finishingLimit,
            rulesNow.startsDownloads, startsHeld == 0
        {
            if waiting.isEmpty && moreWaiting { refillWindow() }
            guard let next = waiting.popMax() else { break }
            guard var entry = entries[next.id], entry.state == .queued, entry.record.owner == claim.name,
                entry.record.priority == next.priority, jobs[next.id] == nil
            else { continue }
            jobs[next.id] = Job()
            entry.move(to: .running)
            // Written with the next group commit: the download is this manager's already (its owner
            // is stored), so a process that dies before the commit leaves it queued under a dead
            // owner, which the next manager takes back.
            writeSoon(entry.record)
            entries[entry.id] = entry
            publish(.stateChanged, entry)
            run.starter.yield(entry.id)
        }
        if run.stopsWhenIdle && isIdle { run.starter.finish() }
        trim()
    }

    /// Reads the next queued downloads of this manager from the store into ``waiting``, once
    /// those before them have started.
    func refillWindow() {
        writeWaiting()
        if claim.lease != nil {
            claimFromQueue()
            return
        }
        let held = Set(entries.keys)
        guard
            let (window, more) = try? Self.loadWindow(
                store: store, owner: claim.name, confinement: confinement, skipping: held)
        else { return }
        moreWaiting = more
        for entry in window {
            entries[entry.id] = entry
            waiting.insert(WaitingDownload(priority: entry.record.priority, id: entry.id))
        }
        // Held already: in line only when queued here and not started.
        for id in held {
            guard let entry = entries[id], entry.state == .queued, entry.record.owner == claim.name, jobs[id] == nil
            else { continue }
            waiting.insert(WaitingDownload(priority: entry.record.priority, id: id))
        }
    }

    /// A fleet's worker claims as many queued downloads nobody owns as it has free slots, best
    /// first, and puts them in line; none while its lease may have run out. A claim that finds
    /// fewer says the queue has no more, until the next tick or a download queued here.
    func claimFromQueue() {
        guard let lease = claim.lease, lease.isHeld, !leaseLost else {
            moreWaiting = false
            return
        }
        let wanted = max(1, configuration.maxConcurrentDownloads - transferring)
        guard let claimed = try? store.claimQueued(for: claim.name, limit: wanted, now: Self.now) else {
            moreWaiting = false
            return
        }
        moreWaiting = claimed.count == wanted
        var folders = OpenFolders(confinement: confinement)
        var changed: [StoredDownload] = []
        for original in claimed {
            var record = original
            // Headers given in this process (secrets the store never has) stay with the download.
            if let known = entries[record.downloadID] { record.keepSecrets(of: known.record) }
            // What a worker that died left behind: its bytes from the manifest on the shared root.
            Self.refreshFromDisk(&record, folders: &folders)
            if record.state == .completed { record.owner = nil }
            if record != original {
                record.updatedAt = Self.now
                changed.append(record)
            }
            let entry = Entry(record: record)
            entries[entry.id] = entry
            if record.state == .queued { waiting.insert(WaitingDownload(priority: record.priority, id: entry.id)) }
        }
        guard !changed.isEmpty, (try? write(changed)) != nil else { return }
        // A dead worker's download whose file it had finished: completed here, and told so (its
        // worker died before it could).
        for record in changed where record.state == .completed {
            if let entry = entries[record.downloadID] { publish(.stateChanged, entry) }
        }
    }

    /// A fleet's worker, every tick: renews its lease, takes over from workers whose lease ran
    /// out, and looks for queued downloads again. One that lost its lease stops every download
    /// without writing anything of them, forgets what it held, and joins the queue again.
    func keepLease() async {
        guard let lease = claim.lease else { return }
        if !lease.renew() { leaseLost = true }
        if leaseLost {
            // Nothing starts while the downloads stop (an ended one schedules the next).
            waiting = Heap()
            for id in Array(jobs.keys) { await stop(id, .leaseLost) }
            entries = [:]
            unwritten = WriteBehind()
            interrupted = []
            announcing = []
            heldCompletions = [:]
            // The database still cannot be reached: the next tick tries again.
            guard (try? lease.rejoin()) != nil else { return }
            leaseLost = false
        }
        _ = try? lease.takeOverExpired()
        // The fleet's rate: set through this worker for all, or as another worker set it, and
        // shared by the workers that run downloads (as before while the database cannot tell).
        if let written = fleetRateToWrite, (try? lease.setTotalRate(written)) != nil { fleetRateToWrite = nil }
        var limit = configuration.bytesPerSecondLimit
        if fleetRateToWrite == nil, let fleets = try? lease.totalRate(), let set = fleets { limit = set }
        if let sharing = try? lease.downloadingWorkers() { fleetShare = max(1, sharing) }
        applyBytesPerSecondLimit(limit)
        moreWaiting = true
        schedule()
    }

    /// Lets go of the downloads held in memory that nothing needs there any more (ended, or read
    /// by a caller), once there are many: their records are in the store.
    func trim() {
        guard entries.count > 2 * Self.windowSize + jobs.count else { return }
        writeWaiting()
        let lined = Set(waiting.unordered.map(\.id))
        for (id, entry) in entries where jobs[id] == nil && !unwritten.holds(id) && !lined.contains(id) {
            let mine = entry.record.owner == claim.name
            // Resumed here once the disk has room.
            if mine && entry.state == .paused { continue }
            // Queued here but out of line: the store has it, for the next refill.
            if mine && entry.state == .queued { moreWaiting = true }
            entries[id] = nil
        }
    }

    /// Whether nothing of this manager runs, waits, or waits for disk space.
    var isIdle: Bool {
        // Every download queued here is in `waiting` until it starts, so the scan for downloads
        // waiting for disk space only runs once the queue is empty.
        jobs.isEmpty && waiting.isEmpty && !moreWaiting
            && !entries.values.contains { entry in
                entry.record.owner == claim.name && (entry.state == .queued || entry.state == .paused)
            }
    }

    /// Runs one download to its end. Its events go through the shared mailbox; a stop request
    /// cancels its task.
    private func execute(_ id: DownloadID) async {
        guard let entry = entries[id], jobs[id] != nil else { return }
        var request = request(for: entry)
        let limiter = RateLimiter(bytesPerSecond: request.bytesPerSecondLimit, clock: clock)
        request.rateLimiter = limiter
        jobs[id]?.rateLimiter = limiter
        let downloader = self.downloader
        let mailbox = self.mailbox
        let clock = self.clock
        let lease = claim.lease
        let hooks = FinishingHooks(
            handedOver: { await self.handedOver(id) },
            beforeRename: { await self.recordBeforeFinishing(id, destination: $0) })
        let task = Task.detached {
            try await Self.download(
                request, of: id, by: downloader, lease: lease, clock: clock, mailbox: mailbox, finishing: hooks)
        }
        jobs[id]?.task = task
        // Asked to stop before it started.
        if jobs[id]?.reason != nil { task.cancel() }
        let result = await withTaskCancellationHandler {
            await task.result
        } onCancel: {
            task.cancel()
        }
        let outcome = result.mapError { error in
            HaulError.wrapping(error)
        }
        // Every event of this download is handled before its end is.
        handleEvents()
        ended(id, outcome)
    }

    /// The download's file is complete and being made durable: its transfer no longer counts against
    /// ``Configuration/maxConcurrentDownloads``, so the next download starts beside the flush and the
    /// rename. Files finishing together share them (see ``FileFinisher``).
    private func handedOver(_ id: DownloadID) {
        guard jobs[id] != nil else { return }
        // Its last bytes are told before the next download starts.
        handleEvents()
        finishing.insert(id)
        schedule()
    }

    /// Writes the download's start and file name (`destination`), if still waiting for a group
    /// commit, before its file takes its final name: a process killed after the rename then leaves
    /// a record that says the file is this download's (see ``refreshFromDisk(_:confinement:)``), not
    /// a stranger's. The name comes with the hook, not only from the `started` event: a download
    /// that finds its file complete in a partial file another process left finishes without one.
    /// Downloads finishing together share the transaction.
    private func recordBeforeFinishing(_ id: DownloadID, destination: String) {
        handleEvents()
        if var entry = entries[id], entry.record.destination != destination {
            entry.record.destination = destination
            entries[id] = entry
            writeSoon(entry.record)
        }
        if unwritten.holds(id) { try? write([]) }
    }

    /// Takes every event waiting in the mailbox to the downloads they belong to.
    private func handleEvents() {
        for (id, event) in mailbox.take() { handle(event, of: id) }
    }

    /// The request for the next attempt: the latest URL, the file once its name is known, and the
    /// headers given in this process (else the stored ones, which hold no secrets).
    private func request(for entry: Entry) -> DownloadRequest {
        var request = entry.record.definition
        if let destination = entry.record.destination { request.destination = .file(destination) }
        if let netrc = configuration.netrc,
            !request.headers.contains(where: { $0.name.lowercased() == "authorization" }),
            let host = (try? DownloadURL(request.url))?.url.host,
            let credentials = netrc.credentials(for: host, orDefault: false)
        {
            request.credentials = credentials
        }
        return request
    }

    /// Updates what is known of a running download from one of its events.
    private func handle(_ event: DownloadEvent, of id: DownloadID) {
        guard var entry = entries[id] else { return }
        switch event {
        case .started(let start):
            entry.record.destination = start.destination
            entry.record.totalBytes = start.totalBytes
            entry.record.bytes = start.resumedFrom
            entry.resumable = start.resumable
            // With the next group commit, or before the file takes its final name.
            writeSoon(entry.record)
        case .progress(let progress):
            entry.record.bytes = progress.bytes
            entry.record.totalBytes = progress.totalBytes ?? entry.record.totalBytes
            entry.bytesPerSecond = progress.bytesPerSecond
            entry.secondsRemaining = progress.secondsRemaining
            entry.openConnections = progress.connections
        case .restarted:
            entry.record.bytes = 0
        case .completed where claim.lease != nil:
            // Told with the download's completion, once its record is written.
            entries[id] = entry
            heldCompletions[id] = event
            return
        case .retrying, .mirror, .completed, .failed:
            break
        }
        entries[id] = entry
        publish(.transfer(event), entry)
    }

    /// How often a fleet's worker tries again to open a download's file that another process
    /// holds.
    static let heldFileRetryInterval = Duration.seconds(1)

    /// Runs download `id`, its events posted to `mailbox`. A fleet's worker (`lease`) that finds
    /// the file held by another process waits for it, trying again every
    /// ``heldFileRetryInterval`` for up to a lease while its own lease holds: the download may have
    /// been taken over from a worker whose lease ran out, which writes nothing more but may hold
    /// the file until its manager notices. A refusal tried again is told to nobody.
    private static func download(
        _ request: DownloadRequest, of id: DownloadID, by downloader: Downloader, lease: (any QueueLease)?,
        clock: TransferClock, mailbox: EventMailbox, finishing: FinishingHooks
    ) async throws -> DownloadResult {
        let since = clock.now
        let patience = lease.map { Duration.milliseconds(Int64($0.duration * 1000)) }
        while true {
            let waits = lease?.isHeld == true && patience.map { clock.now - since < $0 } == true
            do {
                return try await downloader.download(
                    request,
                    observing: { event in
                        if waits, case .failed(let error) = event, DestinationLock.isHeldElsewhere(error) { return }
                        mailbox.post(event, of: id)
                    }, finishing: finishing)
            } catch let error as HaulError where waits && DestinationLock.isHeldElsewhere(error) {
                downloader.logger.notice("download \(id): \(error.message); trying again in a second")
            }
            do {
                try await clock.sleep(for: heldFileRetryInterval)
            } catch {
                // Stopped while it waited: told as a stop during a transfer is.
                let stopped = HaulError(.cancelled, "download cancelled", underlying: error)
                mailbox.post(.failed(stopped), of: id)
                throw stopped
            }
        }
    }

    /// Records how a download ended and starts the next one.
    private func ended(_ id: DownloadID, _ outcome: Result<DownloadResult, HaulError>) {
        let job = jobs.removeValue(forKey: id)
        finishing.remove(id)
        defer {
            for waiter in job?.waiters ?? [] { waiter.resume() }
            schedule()
        }
        // The download may run elsewhere now: nothing of it is written, and the record is read
        // again when needed.
        if case .leaseLost = job?.reason {
            entries[id] = nil
            return
        }
        // Stopped by its write permit: this worker's lease may have run out before its tick saw
        // it. Nothing is written; the next tick joins the queue again.
        if let lease = claim.lease, case .failure(let error) = outcome, error.code == .locked,
            leaseLost || !lease.isHeld
        {
            leaseLost = true
            entries[id] = nil
            return
        }
        guard var entry = entries[id] else { return }
        entry.bytesPerSecond = nil
        entry.secondsRemaining = nil
        entry.openConnections = nil
        entry.record.bytesPerSecond = nil
        if case .remove(let deletingFiles) = job?.reason {
            do {
                try deleteFiles(of: entry.record, finished: deletingFiles)
                try deleteRecord(entry)
            } catch {
                entry.move(to: .paused, error: error as? HaulError)
                entry.record.owner = nil
                try? save(&entry)
            }
            return
        }
        switch outcome {
        case .success(let result):
            entry.move(to: .completed)
            entry.record.destination = result.destination
            entry.record.bytes = result.bytes
            entry.record.totalBytes = result.bytes
            entry.record.owner = nil
        case .failure(let error) where error.code == .cancelled || job?.reason != nil:
            switch job?.reason {
            case .pause:
                entry.move(to: .paused)
                entry.record.owner = nil
            case .cancel:
                try? deleteFiles(of: entry.record, finished: false)
                entry.move(to: .cancelled)
                entry.record.owner = nil
            case .outsideStartWindow:
                markQueued(&entry)
                try? save(&entry, soon: true)
                line(entry)
                return
            case .remove, .leaseLost, nil:
                // The manager is stopping: the download waits for the next one (or the next start).
                entry.move(to: .queued)
                entry.record.owner = nil
                interrupted.insert(id)
            }
        case .failure(let error) where error.code == .diskFull && entry.resumable == false:
            // Nothing written can be kept (no ranges, or nothing to check a resume against): waiting
            // for room would only fetch it all again, so it fails now and its bytes go.
            try? deleteFiles(of: entry.record, finished: false)
            let reason =
                "\(error.message); the server's file cannot be resumed, so what was written is dropped: "
                + "retry once there is room"
            entry.move(to: .failed, error: HaulError(.diskFull, reason, underlying: error.underlying))
            entry.record.owner = nil
        case .failure(let error) where error.code == .diskFull:
            // Kept by this manager, which resumes it once there is room again.
            entry.move(to: .paused, error: error)
        case .failure(let error):
            entry.move(to: .failed, error: error)
            entry.record.owner = nil
        }
        // Written with the next transaction, which the next download's start usually is.
        guard entry.state == .completed, claim.lease != nil else {
            heldCompletions[id] = nil
            if entry.state != .completed { Self.refreshFromDisk(&entry.record, confinement: confinement) }
            try? save(&entry, soon: true)
            return
        }
        // A fleet's worker tells it once the queue has it: nothing is reported complete that the
        // database has not recorded (one out of reach keeps it waiting, written and told at the
        // next write that works). The next download may start meanwhile, so its start can be told
        // first. On one machine the completion is told at once: should the process die before
        // the write, the next one finds the finished file where the record says.
        entry.record.updatedAt = Self.now
        entries[id] = entry
        announcing.insert(id)
        writeSoon(entry.record)
    }

    /// Asks a running download to stop and waits until it has.
    func stop(_ id: DownloadID, _ reason: StopReason) async {
        guard jobs[id] != nil else { return }
        // A pause, cancel or removal asked for takes the place of a stop the queue started itself.
        switch jobs[id]?.reason {
        case nil, .outsideStartWindow?: jobs[id]?.reason = reason
        default: break
        }
        jobs[id]?.task?.cancel()
        await withCheckedContinuation { continuation in
            if jobs[id] == nil {
                continuation.resume()
            } else {
                jobs[id]?.waiters.append(continuation)
            }
        }
    }

    /// Every `stateUpdateInterval`: stores the progress of running downloads; every
    /// `spaceCheckInterval`: resumes downloads paused by a full disk when there is room again.
    private func tick() async {
        while !Task.isCancelled {
            do {
                try await clock.sleep(for: configuration.stateUpdateInterval)
            } catch {
                return
            }
            persistProgress()
            await lookAtRules()
            await keepLease()
            await applyRequests()
            if clock.now - lastSpaceCheck >= configuration.spaceCheckInterval {
                lastSpaceCheck = clock.now
                resumeWhereSpaceAllows()
            }
        }
    }

    /// Writes the bytes and speed of every running download in one transaction, for queries from
    /// other processes and for a process that dies.
    func persistProgress() {
        let records = jobs.keys.compactMap { id -> StoredDownload? in
            guard var record = entries[id]?.record else { return nil }
            record.bytesPerSecond = entries[id]?.bytesPerSecond
            record.updatedAt = Self.now
            return record
        }
        guard !records.isEmpty || !unwritten.isEmpty else { return }
        try? write(records)
    }

    private func resumeWhereSpaceAllows() {
        let waitingForSpace = entries.values.filter {
            $0.state == .paused && $0.record.owner == claim.name && $0.record.storedError?.code == .diskFull
        }
        for entry in waitingForSpace {
            let directory = entry.record.destination.map { DownloadPaths.split($0).directory }
            guard let free = POSIX.freeSpace(directory ?? entry.record.directory ?? "/") else { continue }
            let remaining = entry.record.totalBytes.map { max(0, $0 - entry.record.bytes) } ?? 0
            guard free >= remaining + configuration.freeSpaceMargin else { continue }
            var queued = entry
            markQueued(&queued)
            guard (try? write([queued.record])) != nil else { continue }
            enter(queued)
        }
    }
}
