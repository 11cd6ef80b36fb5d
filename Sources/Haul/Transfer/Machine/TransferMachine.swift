#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The state of one download, as a plain value: events in (``TransferEvent``), actions out
/// (``TransferAction``). It does no I/O and reads no clock; its I/O shell (``TransferDriver``)
/// carries out the actions and reports what happens.
///
/// One engine serves every download: a download is a set of ranges over one file (``RangeTable``),
/// and one connection is the case of one range. The first request streams the file from byte 0;
/// when the server shows it serves ranges of one validated version, more connections fetch other
/// ranges, each writing at its own offsets. Every answer is judged by one classifier, every failure
/// by one retry policy, and a connection that the server keeps refusing retires while the others
/// (the first request among them, which goes on past its own range when nobody delivers the next)
/// finish the file. When nothing works, the download fails with the error, its data kept.
struct TransferMachine: Sendable {
    /// The rules' parameters.
    let settings: Settings
    /// The URL the caller asked for.
    private let originalURL: String
    /// The kernel boot this process runs in (what decides whether written bytes are trusted).
    private let bootID: String?
    /// Where the download stands, with what holds only there.
    private(set) var phase: Phase = .created
    /// The download's record: validator, length, ranges, piece hashes.
    private var manifest: Manifest?
    /// The ranges and who fetches them, once the file is known.
    private(set) var table: RangeTable?
    /// The download's connections, by number, and what each does.
    private(set) var connections: [Connection]
    /// How many connections the download may use now.
    private(set) var ramp: ConnectionRamp
    /// Restarts from byte 0 in this call.
    private(set) var restarts = 0
    /// The bytes kept from earlier sessions, once known.
    private var resumedFrom: Int64?
    /// Whether any server has answered a request of this download (a refused connection then is a
    /// server gone for a moment, not an address where nothing listens).
    private var heardFromServer = false
    /// The URL the bytes come from, after redirects.
    private var finalURL: String
    /// Whether the destination is known (a directory download names it from the first answer).
    private var destinationKnown = false
    /// How a fresh request asks for the file, as the server's answers to `bytes=0-` showed.
    private var rangeProbe = RangeProbe.ask
    /// Whether the file may be fetched in ranges by several connections.
    private(set) var rangesAllowed = false
    /// Whether the server answered a request for a range with its bytes in this call: a range whose
    /// connection left can then be asked for where it stands.
    private var rangeServed = false
    /// How long the last answer took to arrive after its request: what asking again costs.
    private(set) var answerDelay = Duration.zero
    /// What progress reports say and when they are due, once the file's transfer started.
    private(set) var meter: ProgressMeter?
    /// When progress is stored, and the checkpoint being stored.
    private var checkpoints: CheckpointSchedule
    /// The randomness of retry delays.
    private var random: SplitMix64
    /// The serial number of the last request sent.
    private(set) var lastSerial = 0
    /// The URLs the file may come from: the request's own, then its mirrors.
    private(set) var sources: [Source]
    /// How the mirrors are used, once the origin's answer has shown it (`nil` before, and without mirrors).
    private(set) var mirrorUse: MirrorUse?
    /// The source the file comes from in order, and whose validator the manifest keeps.
    private(set) var origin = 0

    /// A download from `sources` (the request's URL, then its mirrors: see
    /// ``DownloadRequest/sources()``) that has not started, its clocks counting from `now`; `seed`
    /// makes its retry delays repeatable.
    init(
        settings: Settings, sources: [String], bootID: String?, now: Moment, seed: UInt64 = .random(in: 0...UInt64.max)
    ) {
        precondition(!sources.isEmpty, "a download has a URL")
        self.settings = settings
        self.originalURL = sources[0]
        self.sources = sources.map { Source(url: $0) }
        self.finalURL = sources[0]
        self.bootID = bootID
        self.connections = Array(repeating: Connection(), count: max(1, settings.connections))
        self.ramp = ConnectionRamp(
            maximum: settings.connections, adaptive: settings.adaptive, window: settings.rampWindow)
        self.checkpoints = CheckpointSchedule(
            interval: settings.checkpointInterval, durableInterval: settings.durableCheckpointInterval, now: now)
        self.random = SplitMix64(seed: seed)
    }

    /// Takes one event; returns what the shell must do, in order, and when the machine next needs a
    /// ``TransferEvent/timer`` event. The event that ends the download ends its actions with
    /// ``TransferAction/end(_:)``.
    mutating func handle(_ event: TransferEvent, now: Moment) -> TransferStep {
        let wasOver = phase.isTerminal
        var actions = take(event, now: now)
        if !wasOver, let outcome { actions.append(.end(outcome)) }
        return TransferStep(actions: actions, deadline: nextDeadline)
    }

    /// Takes one event; returns what the shell must do, in order.
    private mutating func take(_ event: TransferEvent, now: Moment) -> [TransferAction] {
        switch event {
        case .start(let found): return start(found, now: now)
        case .storedDataChecked(let data): return resume(data, now: now)
        case .destinationChosen(let found): return destinationChosen(found, now: now)
        case .queued(let request):
            queued(request)
            return []
        case .admitted(let request):
            admitted(request, now: now)
            return []
        case .head(let request, let head):
            heardFromServer = true
            guard isCurrent(request) else { return [.drop(connection: request.connection)] }
            return received(head, on: request.connection, now: now)
        case .wrote(let request, let segment, let upTo, let pieces):
            return wrote(request, segment: segment, upTo: upTo, pieces: pieces, now: now)
        case .throttled(let request, let until):
            throttled(request, until: until)
            return []
        case .active(let request):
            active(request, now: now)
            return []
        case .reachedLimit(let request, let offset):
            guard isCurrent(request) else { return [.proceed(connection: request.connection, nil)] }
            return reachedLimit(request.connection, at: offset, now: now)
        case .ended(let request, let end):
            guard isCurrent(request) else { return [] }
            return ended(request.connection, end, now: now)
        case .timer: return timer(now: now)
        case .cancel: return cancel(now: now)
        case .checkpointed(let pieces): return checkpointed(pieces, now: now)
        case .discarded: return discarded(now: now)
        case .verified(let verification): return verified(verification, now: now)
        case .finished:
            guard phase.kind == .finishing else { return [] }
            phase = .completed
            return []
        case .failed(let error): return fail(error, now: now)
        }
    }

    /// When the machine next needs a ``TransferEvent/timer`` event, if ever.
    var nextDeadline: Moment? {
        guard !phase.isTerminal else { return nil }
        var deadlines: [Moment] = []
        for connection in connections {
            switch connection.state {
            case .requesting(_, _, let since): deadlines.append(since + settings.stallTimeout)
            case .receiving(let receiving): deadlines.append(receiving.lastByte + settings.stallTimeout)
            case .waiting(let until): deadlines.append(until)
            case .idle, .queued, .stopping, .retired: break
            }
        }
        guard phase.kind == .transferring else { return deadlines.min() }
        if let due = checkpoints.nextDue { deadlines.append(due) }
        if let decision = ramp.nextDecision { deadlines.append(decision) }
        if let takeover = nextTakeover { deadlines.append(takeover) }
        return deadlines.min()
    }

    /// The outcome, once the download is over: success, the cancellation, or the error it failed with.
    private var outcome: TransferOutcome? {
        switch phase {
        case .completed:
            .completed(
                TransferSummary(
                    totalBytes: table?.totalLength ?? manifest?.totalLength ?? 0, resumedFrom: resumedFrom ?? 0,
                    restarts: restarts, validator: manifest?.validator ?? ResourceValidator()))
        case .failed(let error): .failed(error)
        case .paused: .paused
        default: nil
        }
    }

    // MARK: Starting and resuming

    /// Starts the download from what opening its destination found.
    private mutating func start(_ found: FoundDownload, now: Moment) -> [TransferAction] {
        guard phase.kind == .created else { return [] }
        switch found {
        case .nothing:
            destinationKnown = true
            return probe(now: now)
        case .unnamed:
            return probe(now: now)
        case .stored(let stored, let partialSize):
            destinationKnown = true
            return check(stored, partialSize: partialSize)
        case .complete(let total):
            destinationKnown = true
            resumedFrom = total
            table = RangeTable(
                totalLength: total, written: total, durable: total, minimumSplit: settings.minimumSplit, now: now)
            phase = .finishing
            return [.finish(totalBytes: total, manifest: manifest)]
        case .untrusted(let reason):
            destinationKnown = true
            return restart(reason, now: now)
        }
    }

    /// Asks the shell to check what of a stored download can be kept.
    private mutating func check(_ stored: Manifest, partialSize: Int64) -> [TransferAction] {
        var trusted = stored
        var unvouched: Int64 = 0
        for index in trusted.segments.indices {
            let segment = stored.segments[index]
            var kept =
                stored.segments.count == 1
                ? stored.trustedPrefix(currentBootID: bootID, partialSize: partialSize)
                : stored.trustedLength(of: segment, currentBootID: bootID, partialSize: partialSize)
            // A claim its piece hashes do not cover drops the rest of the segment, the bytes the page
            // cache kept past the last checkpoint included: none of them can be told apart.
            let hashed = stored.hashedEnd(of: segment) - segment.start
            if hashed < segment.written {
                unvouched += min(kept, segment.written) - min(kept, hashed)
                kept = min(kept, hashed)
            }
            trusted.segments[index].written = kept
            trusted.segments[index].durable = min(segment.durable, kept)
        }
        manifest = trusted
        finalURL = stored.finalURL
        resumeFrom(stored)
        phase = .resuming
        let note: [TransferAction] =
            unvouched > 0
            ? [.log("the manifest claims \(unvouched) bytes its piece hashes do not cover; they are fetched again")]
            : []
        return note + [.checkStoredData(trusted)]
    }

    /// Continues a stored download from the bytes that survived the check.
    private mutating func resume(_ data: StoredData, now: Moment) -> [TransferAction] {
        guard phase.kind == .resuming, var stored = manifest else { return [] }
        stored.segments = data.segments
        stored.pieces = data.pieces
        manifest = stored
        guard stored.segments.count > 1 else { return resumeInOrder(stored, now: now) }
        guard let total = stored.totalLength, stored.contentEncoding == nil, stored.validator.ifRangeValue != nil else {
            return restart(.untrustedPartial("a manifest of several segments without a strong validator"), now: now)
        }
        let table = RangeTable(
            manifest: stored.segments, totalLength: total, minimumSplit: settings.minimumSplit, now: now)
        resumedFrom = table.written
        rangesAllowed = true
        ramp = ConnectionRamp(maximum: settings.connections, adaptive: false)
        meter = ProgressMeter(startingAt: table.written, totalBytes: total, interval: settings.progressInterval)
        // How the mirrors are used holds for a file complete on disk too: its check may need them.
        var actions = decideMirrorUse(validator: stored.validator, rangesAllowed: true)
        if table.isComplete {
            self.table = table
            return actions + beginVerifying(now: now)
        }
        self.table = table
        phase = .transferring
        actions += [
            .prepareFile(
                FilePreparation(
                    manifest: stored, startsOver: false, storesLayout: false, neededBytes: total - table.written,
                    reservation: (total, 0, table.segments.count))),
            .started(
                StartFacts(
                    url: stored.finalURL, totalBytes: total, resumedFrom: table.written, resumable: true,
                    validator: stored.validator)),
        ]
        actions += startConnections(now: now)
        return actions
    }

    /// Continues a file stored in order from its start.
    private mutating func resumeInOrder(_ stored: Manifest, now: Moment) -> [TransferAction] {
        let trusted = stored.segments.first?.written ?? 0
        if let total = stored.totalLength, trusted == total {
            // Every byte is already on disk: the previous session ended just before the rename.
            resumedFrom = total
            table = RangeTable(
                totalLength: total, written: total, durable: stored.segments[0].durable,
                minimumSplit: settings.minimumSplit, now: now)
            return beginVerifying(now: now)
        }
        return probe(now: now)
    }

    /// Sends the first request of an attempt in order: the rest of the stored bytes, or the file.
    private mutating func probe(now: Moment) -> [TransferAction] {
        phase = .probing
        let ask: RangeAsk
        let stored = manifest
        let written =
            table?.isSingle == false ? nil : (table?.segments.first?.written ?? stored?.segments.first?.written)
        if let stored, let written, written > 0 {
            switch ResumePlan.resuming(
                stored, trusted: written, trustUnvalidated: settings.trustUnvalidatedResume,
                overlapCheckBytes: settings.overlapCheckBytes)
            {
            case .success(let plan):
                ask = .resume(
                    plan, expected: RangeAsk.Expected(validator: stored.validator, totalLength: stored.totalLength))
            case .failure(let box):
                return restart(box.reason, now: now)
            }
        } else {
            ask = .fresh(probesRanges: rangeProbe == .ask && settings.connections > 1)
        }
        let connection = connections.firstIndex { $0.state == .idle } ?? 0
        return [send(ask, on: connection, segment: nil, now: now)]
    }

    /// Sends `ask` on `connection` for range `segment`, as its next request, to `source` (the origin
    /// unless given).
    private mutating func send(_ ask: RangeAsk, on connection: Int, segment: Int?, source: Int? = nil, now: Moment)
        -> TransferAction
    {
        lastSerial += 1
        let source = source ?? origin
        connections[connection].serial = lastSerial
        connections[connection].source = source
        connections[connection].state = .requesting(ask, segment: segment, since: now)
        return .send(RequestTag(connection: connection, serial: lastSerial, source: source), ask)
    }

    // MARK: The first answer

    /// Handles the answer to the first request of an attempt.
    private mutating func firstAnswer(
        _ verdict: ResponseVerdict, ask: RangeAsk, head: ResponseHead, on connection: Int, now: Moment
    ) -> [TransferAction] {
        switch verdict {
        case .accept(let facts):
            guard destinationKnown else {
                phase = .choosingDestination(FirstAnswer(connection: connection, ask: ask, head: head, facts: facts))
                return [.chooseDestination(connection: connection)]
            }
            return beginTransfer(facts, ask: ask, head: head, on: connection, now: now)
        case .alreadyComplete:
            connections[connection].state = .idle
            resumedFrom = ask.writeStart
            table = RangeTable(
                totalLength: ask.expected?.totalLength, written: ask.writeStart,
                durable: table?.segments.first?.durable ?? 0, minimumSplit: settings.minimumSplit, now: now)
            return [.drop(connection: connection)] + beginVerifying(now: now)
        case .probeRefused:
            connections[connection].state = .idle
            rangeProbe = .refused
            return [.drop(connection: connection), .log("the server refused bytes=0-; asking without a range")]
                + probe(now: now)
        case .retry(let status, _) where ask.kind == .fresh(probesRanges: true):
            // A server that refuses the range, or asks to come back later for it, may still serve the
            // file to a plain request, as a download over one connection asks at once.
            connections[connection].state = .idle
            rangeProbe = .deferred
            return [
                .drop(connection: connection),
                .log("the server answered bytes=0- with \(status); asking without a range"),
            ]
                + probe(now: now)
        case .retry where rangeProbe == .deferred:
            // The plain request is told to wait too: the server is busy, not refusing ranges. Once the
            // wait is over the download asks for bytes=0- again, and can still use several connections.
            rangeProbe = .ask
            return refused(verdict, on: connection, now: now)
        case .restart, .retry, .fail:
            return refused(verdict, on: connection, now: now)
        }
    }

    /// The destination the first answer names is open: the answer is written, or a download found
    /// stored there resumes.
    private mutating func destinationChosen(_ found: FoundDownload, now: Moment) -> [TransferAction] {
        guard case .choosingDestination(let pending) = phase else { return [] }
        destinationKnown = true
        switch found {
        case .nothing, .unnamed, .untrusted:
            phase = .probing
            return beginTransfer(pending.facts, ask: pending.ask, head: pending.head, on: pending.connection, now: now)
        case .stored, .complete:
            // The name the server gave holds a download of this URL that started after the directory
            // was listed: resume it rather than write over it.
            connections[pending.connection].state = .idle
            phase = .created
            return [.drop(connection: pending.connection)] + start(found, now: now)
        }
    }

    /// Starts writing the first accepted answer, and the other connections when ranges are allowed.
    private mutating func beginTransfer(
        _ facts: ResponseFacts, ask: RangeAsk, head: ResponseHead, on connection: Int, now: Moment
    ) -> [TransferAction] {
        var actions: [TransferAction] = []
        finalURL = head.finalURL
        var record: Manifest
        if facts.startsOver {
            if let reason = facts.replaces {
                // The answer replaces the stored bytes: a restart without a discard.
                if let tooMany = countRestart(reason) {
                    connections[connection].state = .idle
                    return [.drop(connection: connection)] + fail(tooMany, now: now)
                }
                actions += [.log("starting over: \(reason)"), .report(.restarted(reason))]
            }
            record = Manifest(
                originalURL: originalURL, finalURL: head.finalURL, validator: facts.validator,
                totalLength: facts.totalLength, acceptsRanges: facts.acceptsRanges,
                contentEncoding: facts.contentEncoding, bootID: bootID, now: head.date, pieceSize: settings.pieceSize)
            record.source = origin == 0 ? nil : sources[origin].url
            resumedFrom = 0
        } else {
            record =
                manifest
                ?? Manifest(
                    originalURL: originalURL, finalURL: head.finalURL, validator: facts.validator,
                    totalLength: facts.totalLength, acceptsRanges: true, contentEncoding: nil, bootID: bootID,
                    now: head.date, pieceSize: settings.pieceSize)
            record.finalURL = head.finalURL
            record.validator = facts.validator
            if resumedFrom == nil { resumedFrom = facts.writeStart }
        }
        let total = record.totalLength ?? facts.totalLength
        let previousDurable = self.table?.segments.first?.durable ?? record.segments.first?.durable ?? 0
        let durable = min(previousDurable, facts.writeStart)
        var table = RangeTable(
            totalLength: total, written: facts.writeStart, durable: facts.startsOver ? 0 : durable,
            minimumSplit: settings.minimumSplit, now: now)
        rangesAllowed = allowsRanges(facts, total: total)
        ramp = ConnectionRamp(maximum: settings.connections, adaptive: settings.adaptive, window: settings.rampWindow)
        if !rangesAllowed { ramp.stop() }
        let split = rangesAllowed && !ramp.isRamping && table.split(into: settings.connections, now: now)
        _ = table.handOver(0, to: connection, now: now)
        record.segments = table.manifestSegments
        manifest = record
        self.table = table
        phase = .transferring
        checkpoints.forgetProgress()
        meter = ProgressMeter(startingAt: table.written, totalBytes: total, interval: settings.progressInterval)
        connections[connection].state = .receiving(
            .init(ask: ask, segment: 0, lastByte: now, checksBody: !facts.contentDigests.isEmpty))
        let resumable = facts.resumable(trustingUnvalidated: settings.trustUnvalidatedResume)
        actions += [
            .prepareFile(
                FilePreparation(
                    manifest: record, startsOver: facts.startsOver, storesLayout: split,
                    neededBytes: total.map { $0 - facts.writeStart },
                    reservation: total.map { ($0, facts.writeStart, table.segments.count) })),
            .started(
                StartFacts(
                    url: head.finalURL, totalBytes: total, resumedFrom: facts.writeStart, resumable: resumable,
                    validator: facts.validator)),
            .receive(
                connection: connection,
                ReceivePlan(
                    segment: 0, bodyStart: facts.bodyStart, writeStart: facts.writeStart,
                    limit: table.segments[0].end, answerEnd: ask.to ?? total, contentDigests: facts.contentDigests,
                    pieceSize: record.pieceSize)),
        ]
        if split { actions.append(.log("fetching \(table.segments.count) ranges over as many connections")) }
        actions += decideMirrorUse(validator: facts.validator, rangesAllowed: rangesAllowed)
        return actions + startConnections(now: now)
    }

    /// Whether the rest of the file may come over several connections: a `206` with the total
    /// length and a validator usable in `If-Range`, no coding, no per-body digest, and enough left.
    private func allowsRanges(_ facts: ResponseFacts, total: Int64?) -> Bool {
        guard settings.connections > 1, facts.isPartialResponse, let total, facts.validator.ifRangeValue != nil,
            facts.contentEncoding == nil, facts.writeStart == facts.bodyStart, facts.contentDigests.isEmpty
        else { return false }
        return total - facts.writeStart >= 2 * max(RangeTable.boundary, settings.minimumSplit)
    }

    // MARK: Ending

    /// Starts the download over from byte 0, once every connection has stopped: its partial data is
    /// discarded (``Phase/restarting(_:thenPause:)``), then it asks for the file again.
    private mutating func restart(_ reason: RestartReason, now: Moment) -> [TransferAction] {
        // A cancellation that came while the file was checked is carried out once the data is gone.
        let thenPause = if case .verifying(thenPause: true) = phase { true } else { false }
        return stop(then: .restart(reason, thenPause: thenPause), now: now)
    }

    /// Counts a restart from byte 0 against ``Settings/maximumRestarts``: the one place that does.
    /// Going on to the next mirror is not a restart of the same file from the same server, and does
    /// not count. Returns the error the download fails with once past the cap.
    private mutating func countRestart(_ reason: RestartReason) -> HaulError? {
        if case .mirrorFallback = reason { return nil }
        restarts += 1
        guard restarts > settings.maximumRestarts else { return nil }
        return HaulError(.remoteChanged, "gave up after \(restarts - 1) restarts: \(reason)")
    }

    /// Ends the download with `error`, once every connection has stopped and the progress is stored.
    private mutating func fail(_ error: HaulError, now: Moment) -> [TransferAction] {
        switch phase {
        case .paused, .failed, .completed:
            return []
        case .pausing, .restarting:
            // The last checkpoint of a pause, or the discard of a restart, failed: that is what the
            // caller hears about.
            phase = .failed(error)
            return []
        case .failing(let first):
            phase = .failed(first)
            return []
        case .stopping(then: .pause), .stopping(then: .fail):
            // Stopping for good: no other source is tried, and the first error stays.
            return stop(then: .fail(error), now: now)
        default:
            if let next = nextSource(for: error) { return switchSource(to: next, error, now: now) }
            return stop(then: .fail(error), now: now)
        }
    }

    /// The caller cancelled: the download pauses as soon as it can, its data kept.
    private mutating func cancel(now: Moment) -> [TransferAction] {
        switch phase {
        case .created:
            phase = .paused
            return []
        case .verifying:
            // The check cannot be stopped: the download pauses once it is over.
            phase = .verifying(thenPause: true)
            return []
        case .restarting(let reason, _):
            phase = .restarting(reason, thenPause: true)
            return []
        case .finishing, .pausing, .failing, .paused, .failed, .completed:
            return []
        case .choosingDestination(let pending):
            connections[pending.connection].state = .idle
            return [.drop(connection: pending.connection)] + stop(then: .pause, now: now)
        case .checkingMirrors(let checks):
            // What the mirrors wrote is forgotten (the checks are not waited for), then it pauses.
            return concludeMirrorChecks(checks, thenPause: true, now: now)
        case .resuming, .probing, .transferring, .stopping:
            return stop(then: .pause, now: now)
        }
    }

    /// Stops every connection, then goes on as `next` says. A pause wins over everything, a failure
    /// over a restart, a restart over completion.
    private mutating func stop(then next: AfterStop, now: Moment) -> [TransferAction] {
        if case .stopping(let current) = phase {
            if next.rank > current.rank { phase = .stopping(then: next) }
        } else {
            phase = .stopping(then: next)
        }
        let verifies = if case .verify = next { true } else { false }
        var actions: [TransferAction] = []
        for index in connections.indices {
            switch connections[index].state {
            case .receiving(let receiving) where receiving.checksBody && verifies:
                // Its body must still pass its digest: wait for its end.
                break
            default:
                actions += stopConnection(index, .shutdown)
            }
        }
        return actions + finishStopping(now: now)
    }

    /// Once no connection is busy, does what the stop was for.
    private mutating func finishStopping(now: Moment) -> [TransferAction] {
        guard case .stopping(let next) = phase, !connections.contains(where: \.isBusy) else { return [] }
        switch next {
        case .restart(let reason, let thenPause):
            // The one way into `restarting`.
            phase = .restarting(reason, thenPause: thenPause)
            return [.log("starting over: \(reason)"), .discard]
        case .verify:
            return beginVerifying(now: now)
        case .pause:
            // The last report tells what the checkpoint keeps, so a paused download shows it.
            return reportProgress(at: now, force: true)
                + storeLastCheckpoint(durable: true, then: .pausing, else: .paused)
        case .fail(let error):
            return reportProgress(at: now, force: true)
                + storeLastCheckpoint(durable: false, then: .failing(error), else: .failed(error))
        }
    }

    /// Stores the last checkpoint of a download that stops, entering `storing` until it is stored,
    /// or `done` at once when no byte was written.
    private mutating func storeLastCheckpoint(durable: Bool, then storing: Phase, else done: Phase) -> [TransferAction]
    {
        // With no byte written there is nothing to keep (a manifest already stored stays as it is).
        guard var record = manifest, let table, table.written > 0 else {
            phase = done
            return []
        }
        record.segments = table.manifestSegments
        phase = storing
        checkpoints.takeLast(table.segments, durable: durable)
        return [.lastCheckpoint(Checkpoint(manifest: record, durable: durable))]
    }

    /// The partial data is gone: the download starts over (or pauses, or fails past the cap).
    private mutating func discarded(now: Moment) -> [TransferAction] {
        guard case .restarting(let reason, let thenPause) = phase else { return [] }
        manifest = nil
        table = nil
        resumedFrom = nil
        meter = nil
        rangesAllowed = false
        checkpoints.forgetProgress()
        resetSources()
        if thenPause {
            phase = .paused
            return []
        }
        if let tooMany = countRestart(reason) { return fail(tooMany, now: now) }
        return [.report(.restarted(reason))] + probe(now: now)
    }

    /// Every byte is there: the complete file is checked.
    private mutating func beginVerifying(now: Moment) -> [TransferAction] {
        guard let table, let total = table.totalLength ?? manifest?.totalLength else {
            return fail(HaulError(.protocolViolation, "the file's length is not known"), now: now)
        }
        phase = .verifying(thenPause: false)
        return reportProgress(at: now, force: true) + [
            .verify(totalBytes: total, validator: manifest?.validator ?? ResourceValidator())
        ]
    }

    /// The complete file was checked: it is finished, or what failed the check is fetched again.
    private mutating func verified(_ verification: Verification, now: Moment) -> [TransferAction] {
        guard case .verifying(let thenPause) = phase, let total = table?.totalLength ?? manifest?.totalLength else {
            return []
        }
        switch verification {
        case .matches:
            if thenPause { return storeLastCheckpoint(durable: true, then: .pausing, else: .paused) }
            phase = .finishing
            return [.finish(totalBytes: total, manifest: manifest)]
        case .checksumMismatch(let error):
            if let check = checkMirrors(error.message, thenPause: thenPause, now: now) { return check }
            if let next = nextSourceAfterMismatch() {
                // Mirrors used in turn: the checksum shows this one served other bytes.
                return switchSource(to: next, error, now: now)
            }
            return storeLastCheckpoint(durable: false, then: .failing(error), else: .failed(error))
        case .digestMismatch(let detail):
            if let check = checkMirrors(detail, thenPause: thenPause, now: now) { return check }
            return restart(.digestMismatch(detail), now: now)
        }
    }

    /// A checkpoint was stored: what it captured is durable, and a stopping download is over.
    private mutating func checkpointed(_ pieces: [Int: String], now: Moment) -> [TransferAction] {
        if let captured = checkpoints.stored() { table?.markDurable(captured) }
        record(pieces)
        switch phase {
        case .pausing: phase = .paused
        case .failing(let error): phase = .failed(error)
        default: break
        }
        return []
    }

    /// Records piece hashes in the manifest.
    private mutating func record(_ pieces: [Int: String]) {
        guard !pieces.isEmpty, var record = manifest else { return }
        for (index, hash) in pieces {
            if record.pieces.count <= index {
                record.pieces += Array(repeating: nil, count: index + 1 - record.pieces.count)
            }
            record.pieces[index] = hash
        }
        manifest = record
    }

    // MARK: Answers

    /// A connection received the head of its answer: the answer is judged by what its request asked
    /// and what the download is doing.
    private mutating func received(_ head: ResponseHead, on connection: Int, now: Moment) -> [TransferAction] {
        guard connections.indices.contains(connection),
            case .requesting(let ask, let segment, let since) = connections[connection].state
        else { return [.drop(connection: connection)] }
        answerDelay = now - since
        let verdict = ResponseClassifier.classify(status: head.status, headers: head.headers, ask: ask, now: head.date)
        switch phase {
        case .probing:
            return firstAnswer(verdict, ask: ask, head: head, on: connection, now: now)
        case .checkingMirrors:
            return mirrorCheckAnswer(verdict, on: connection, now: now)
        case .transferring:
            guard let segment else {
                connections[connection].state = .idle
                return [.drop(connection: connection)] + resumeWork(now: now)
            }
            if let actions = mirrorAnswer(verdict, head: head, on: connection, now: now) {
                return actions + resumeWork(now: now)
            }
            return rangeAnswer(verdict, ask: ask, segment: segment, on: connection, now: now)
        default:
            connections[connection].state = .idle
            return [.drop(connection: connection)] + finishStopping(now: now)
        }
    }

    /// Handles the answer to a range request of a file fetched in ranges.
    private mutating func rangeAnswer(
        _ verdict: ResponseVerdict, ask: RangeAsk, segment: Int, on connection: Int, now: Moment
    ) -> [TransferAction] {
        switch verdict {
        case .accept(let facts):
            guard let table, table.owner(of: segment) == connection, !table.segments[segment].isComplete,
                table.segments[segment].position == ask.writeStart
            else {
                // Another connection took the range, or wrote into it, while the request was out: the
                // answer no longer fits, and the range goes back to whoever claims it next.
                table?.releaseAll(of: connection)
                connections[connection].state = .idle
                return [.drop(connection: connection)] + resumeWork(now: now)
            }
            rangeServed = true
            connections[connection].state = .receiving(
                .init(ask: ask, segment: segment, lastByte: now, checksBody: !facts.contentDigests.isEmpty))
            return [
                .receive(
                    connection: connection,
                    ReceivePlan(
                        segment: segment, bodyStart: facts.bodyStart, writeStart: facts.writeStart,
                        limit: table.segments[segment].end, answerEnd: ask.to ?? facts.totalLength,
                        contentDigests: facts.contentDigests, pieceSize: manifest?.pieceSize ?? settings.pieceSize))
            ]
        case .restart, .retry, .fail:
            return refused(verdict, on: connection, now: now)
        case .alreadyComplete, .probeRefused:
            // Never an answer to a range: the classifier restarts those.
            connections[connection].state = .idle
            return [.drop(connection: connection)]
                + restart(.rangeNotSatisfiable("416 to bytes \(ask.from)-"), now: now)
        }
    }

    /// Drops an answer that ends its request the same way whatever the request asked: the file
    /// changed (start over), the server asks to come back (retry), or a failure no retry mends.
    private mutating func refused(_ verdict: ResponseVerdict, on connection: Int, now: Moment) -> [TransferAction] {
        switch verdict {
        case .restart(let reason):
            connections[connection].state = .idle
            return [.drop(connection: connection)] + restart(reason, now: now)
        case .retry(let status, let retryAfter):
            return [.drop(connection: connection)]
                + failed(connection, Self.retryable(status: status, retryAfter: retryAfter), now: now)
        case .fail(let code, let message, let status):
            connections[connection].state = .idle
            return [.drop(connection: connection)] + fail(HaulError(code, message, status: status), now: now)
        case .accept, .alreadyComplete, .probeRefused:
            connections[connection].state = .idle
            return [.drop(connection: connection)]
        }
    }

    // MARK: Waiting for a connection

    /// A request waits for a connection to its host before it is sent: its stall clock stops.
    private mutating func queued(_ request: RequestTag) {
        guard isCurrent(request), case .requesting(let ask, let segment, _) = connections[request.connection].state
        else { return }
        connections[request.connection].state = .queued(ask, segment: segment)
    }

    /// A request that waited for a connection is sent: its stall clock starts now, and its range is
    /// not taken over for having made no progress while it waited.
    private mutating func admitted(_ request: RequestTag, now: Moment) {
        guard isCurrent(request), case .queued(let ask, let segment) = connections[request.connection].state else {
            return
        }
        connections[request.connection].state = .requesting(ask, segment: segment, since: now)
        if let segment { table?.hold(segment, until: now) }
    }

    // MARK: Progress

    /// A rate limit holds the request's bytes back until `until`: neither its stall clock nor a
    /// take-over of its range runs before then.
    private mutating func throttled(_ request: RequestTag, until: Moment) {
        guard isCurrent(request), case .receiving(var receiving) = connections[request.connection].state else {
            return
        }
        receiving.lastByte = max(receiving.lastByte, until)
        connections[request.connection].state = .receiving(receiving)
        table?.hold(receiving.segment, until: until)
    }

    /// The transport heard from the server for `request` while its bytes are out of sight: its stall
    /// clock starts again, and its range is not taken over for the silence until now.
    private mutating func active(_ request: RequestTag, now: Moment) {
        guard isCurrent(request) else { return }
        switch connections[request.connection].state {
        case .requesting(let ask, let segment, _):
            connections[request.connection].state = .requesting(ask, segment: segment, since: now)
            if let segment { table?.hold(segment, until: now) }
        case .receiving(var receiving):
            receiving.lastByte = max(receiving.lastByte, now)
            connections[request.connection].state = .receiving(receiving)
            table?.hold(receiving.segment, until: now)
        default:
            break
        }
    }

    /// A connection wrote bytes of a range: progress, the end of the file, checkpoints and the ramp
    /// follow.
    private mutating func wrote(_ request: RequestTag, segment: Int, upTo: Int64, pieces: [Int: String], now: Moment)
        -> [TransferAction]
    {
        // Bytes written are bytes stored, even when they come from a request that is no longer current.
        guard var table, table.segments.indices.contains(segment) else { return [] }
        let from = table.segments[segment].position
        noteWritten(by: request.source, from: from, upTo: min(upTo, table.segments[segment].end))
        table.advance(segment, to: upTo, now: now)
        self.table = table
        record(pieces)
        checkpoints.noteProgress()
        if isCurrent(request), case .receiving(var receiving) = connections[request.connection].state {
            receiving.lastByte = max(receiving.lastByte, now)
            receiving.progressed = true
            connections[request.connection].state = .receiving(receiving)
        }
        guard phase.kind == .transferring else { return [] }
        var actions = reportProgress(at: now)
        if table.isComplete { return actions + stop(then: .verify, now: now) }
        ramp.begin(at: now, bytes: table.written)
        if ramp.isSettling, (0..<ramp.allowed).allSatisfy({ delivers(connections[$0]) }) {
            ramp.settled(at: now, bytes: table.written)
        }
        actions += checkpointIfDue(now: now)
        return actions + moveRamp(now: now)
    }

    /// Moves the connection ramp on: more connections start, or the ones the last step added leave
    /// and their ranges go back to the others.
    private mutating func moveRamp(now: Moment) -> [TransferAction] {
        guard let written = table?.written else { return [] }
        let rate: (Double) -> String = { "\(ByteCount.format(Int64($0)))/s" }
        switch ramp.update(now: now, bytes: written) {
        case nil:
            return []
        case .up(let allowed, let measured):
            return [.log("\(rate(measured)) so far; trying up to \(allowed) connections")] + startConnections(now: now)
        case .back(let allowed, let more, let measured, let before):
            var actions: [TransferAction] = [
                .log(
                    "\(more) connections gave \(rate(measured)) against \(rate(before)) with \(allowed): back to \(allowed)"
                )
            ]
            for index in connections.indices where index >= allowed {
                table?.releaseAll(of: index)
                actions += stopConnection(index, .replaced)
            }
            return actions
        }
    }

    /// A connection reached the end of its range while its answer goes on: it continues into the next
    /// range when no other connection delivers that one, so a download whose other connections are
    /// refused, stalled or told to wait still finishes at the speed of the one that works.
    private mutating func reachedLimit(_ connection: Int, at offset: Int64, now: Moment) -> [TransferAction] {
        guard phase.kind == .transferring, var table, connections.indices.contains(connection),
            case .receiving(var receiving) = connections[connection].state,
            offset >= table.segments[receiving.segment].end,
            receiving.ask.isOpenEnded || (receiving.ask.to ?? .max) > offset,
            let next = table.successor(of: receiving.segment)
        else { return [.proceed(connection: connection, nil)] }
        if let owner = table.owner(of: next), owner != connection, case .receiving = connections[owner].state,
            now - table.segments[next].lastProgress < settings.stallTakeover
        {
            // Its connection delivers it: stop here and take other work.
            return [.proceed(connection: connection, nil)]
        }
        let skipped = table.segments[next].position - offset
        if rangeServed, table.owner(of: next) == nil, skipped > skipAllowance {
            // A connection that left wrote much of it (a step back of the ramp, a failure): asking
            // for the rest where it stands costs less than reading those bytes again.
            return [
                .proceed(connection: connection, nil),
                .log(
                    "connection \(connection) asks for bytes \(table.segments[next].position)- rather than read \(ByteCount.format(skipped)) again"
                ),
            ]
        }
        let displaced = table.handOver(next, to: connection, now: now)
        // A cut made while the answer was read may leave it past the start of `next`: the bytes it
        // went on writing there are stored (written before it asked) and count for `next`.
        let from = table.segments[next].position
        if offset > from {
            noteWritten(by: connections[connection].source, from: from, upTo: min(offset, table.segments[next].end))
            table.advance(next, to: offset, now: now)
        }
        self.table = table
        receiving.segment = next
        receiving.lastByte = max(receiving.lastByte, now)
        connections[connection].state = .receiving(receiving)
        let range = table.segments[next]
        var actions: [TransferAction] = [
            .proceed(connection: connection, Continuation(segment: next, skipTo: range.position, limit: range.end)),
            .log(
                "connection \(connection) goes on into bytes \(range.position)-\(range.end - 1): no other delivers them"
            ),
        ]
        if let displaced { actions += stopConnection(displaced, .replaced) }
        return actions
    }

    /// A progress report, when one is due (always with `force`): counting the open connections only
    /// then, not for every block written.
    private mutating func reportProgress(at now: Moment, force: Bool = false) -> [TransferAction] {
        guard let written = table?.written, meter?.record(written, at: now, force: force) == true,
            let progress = meter?.report(connections: openConnections)
        else { return [] }
        return [.report(.progress(progress))]
    }

    // MARK: Ends and failures

    /// A connection's request is over: what it wrote is judged, and the connection takes other work
    /// or waits.
    private mutating func ended(_ connection: Int, _ end: ConnectionEnd, now: Moment) -> [TransferAction] {
        guard connections.indices.contains(connection) else { return [] }
        if phase.kind == .checkingMirrors {
            if case .finished = end { return mirrorCheckEnded(connection, agrees: true, now: now) }
            return mirrorCheckEnded(connection, agrees: false, now: now)
        }
        var forgotten: [TransferAction] = []
        if phase.kind == .stoppingToVerify, case .receiving(let receiving) = connections[connection].state,
            receiving.checksBody
        {
            switch end {
            case .finished:
                break
            case .failed(.bodyDigestMismatch):
                // The bytes that completed the file failed their digest: they are fetched again.
                phase = .transferring
            case .failed, .dropped:
                forgotten = refetchUnchecked(receiving)
            }
        }
        guard phase.kind == .probing || phase.kind == .transferring else {
            // The download is stopping (or past it): whatever the request did no longer matters.
            table?.releaseAll(of: connection)
            if connections[connection].state != .retired { connections[connection].state = .idle }
            return finishStopping(now: now)
        }
        var actions: [TransferAction] = []
        switch (connections[connection].state, end) {
        case (.stopping(.stalled), _):
            let seconds = Int(settings.stallTimeout.seconds)
            let host = URL(string: finalURL)?.host.map { " from \($0)" } ?? ""
            actions = failed(
                connection, .retryable(HaulError(.timedOut, "no data\(host) for \(seconds) s"), retryAfter: nil),
                now: now)
        case (.stopping, _):
            connections[connection].state = .idle
        case (.receiving(let receiving), .finished(let offset)):
            actions = finishedReceiving(connection, segment: receiving.segment, at: offset, now: now)
        case (.receiving, .failed(let failure)), (.requesting, .failed(let failure)), (.queued, .failed(let failure)):
            actions = failed(connection, failure, now: now)
        case (.receiving, _), (.requesting, _), (.queued, _):
            table?.releaseAll(of: connection)
            connections[connection].state = .idle
        case (.idle, _), (.waiting, _), (.retired, _):
            break
        }
        return forgotten + actions + afterConnectionChange(now: now)
    }

    /// Stops connection `index` for `cause`: a request out or an answer being written is abandoned,
    /// a wait ends. One already stopping keeps its cause (a stall still counts as a failed attempt).
    private mutating func stopConnection(_ index: Int, _ cause: Connection.StopCause) -> [TransferAction] {
        switch connections[index].state {
        case .requesting, .queued, .receiving:
            connections[index].state = .stopping(cause)
            return [.abandon(connection: index)]
        case .waiting:
            connections[index].state = .idle
            return []
        case .idle, .stopping, .retired:
            return []
        }
    }

    /// The answer that completed the file ended, or stalled, before its Content-Digest could be
    /// checked: the download goes back to transferring, and its bytes are fetched again rather than
    /// trusted unchecked.
    private mutating func refetchUnchecked(_ receiving: Connection.Receiving) -> [TransferAction] {
        phase = .transferring
        return forget(segment: receiving.segment, from: receiving.ask.writeStart)
    }

    /// Forgets what one answer wrote, from `from` up to where it now writes in range `segment` (it
    /// may have gone on through several ranges), to fetch it again: the ranges' progress and piece
    /// hashes, and with one range the file's bytes past `from`.
    private mutating func forget(segment: Int, from: Int64) -> [TransferAction] {
        guard var table else { return [] }
        let upTo = table.segments[segment].position
        for index in table.segments.indices
        where table.segments[index].start < upTo && table.segments[index].position > from {
            table.cut(index, to: max(from, table.segments[index].start))
        }
        self.table = table
        manifest?.forgetPieces(from: from, to: max(upTo, table.segments[segment].end))
        return table.isSingle ? [.cut(to: from)] : [.forgetHashes(from: from)]
    }

    /// A connection's answer ended: where its range is complete, the connection is free; where not,
    /// the attempt failed.
    private mutating func finishedReceiving(_ connection: Int, segment: Int, at offset: Int64, now: Moment)
        -> [TransferAction]
    {
        guard var table else {
            connections[connection].state = .idle
            return []
        }
        if table.segments[segment].end == RangeTable.unknownEnd, offset >= table.segments[segment].position {
            // A body of unknown length ends where the file does.
            table.setLength(offset)
            manifest?.totalLength = offset
            self.table = table
        }
        if table.segments[segment].isComplete || table.owner(of: segment) != connection {
            connections[connection].failures = 0
            connections[connection].state = .idle
            return []
        }
        let end = table.segments[segment].end
        let message =
            table.isSingle
            ? "the connection ended after \(ByteCount.format(offset)) of \(ByteCount.format(end))"
            : "a connection ended at byte \(offset) of a range that runs to \(end)"
        return failed(connection, .retryable(HaulError(.network, message), retryAfter: nil), now: now)
    }

    /// A connection's attempt failed: retry it after a delay, retire it when the others can go on
    /// without it, or end the download.
    private mutating func failed(_ connection: Int, _ failure: TransferFailure, now: Moment) -> [TransferAction] {
        var progressed = false
        var segment: Int?
        if case .receiving(let receiving) = connections[connection].state {
            progressed = receiving.progressed
            segment = receiving.segment
        }
        table?.releaseAll(of: connection)
        if let actions = mirrorFailure(failure, on: connection) {
            connections[connection].state = .idle
            return actions
        }
        connections[connection].state = .idle
        switch failure {
        case .fatal(let error):
            return fail(error, now: now)
        case .cancelled:
            return []
        case .overlapMismatch:
            return restart(.remoteChanged("the bytes before the resume point differ from the partial file"), now: now)
        case .bodyDigestMismatch(let detail, let from):
            // The body is not what the server says it sent: what it added is fetched again.
            let actions = segment.map { forget(segment: $0, from: from) } ?? []
            let error = HaulError(.checksumMismatch, "the response body failed its Content-Digest (\(detail))")
            return actions + retry(connection, error, retryAfter: nil, progressed: false, now: now)
        case .retryable(let error, let retryAfter):
            return retry(connection, error, retryAfter: retryAfter, progressed: progressed, now: now)
        case .refused(let error):
            // Bytes stored by an earlier session, or by this one.
            let hasBytes = manifest != nil || (table?.written ?? 0) > 0
            // With mirrors, the others may answer: the refused one is dropped as any failing source.
            if !settings.retry.retriesRefusedConnections && !heardFromServer && !hasBytes && sources.count == 1 {
                return fail(error, now: now)
            }
            return retry(connection, error, retryAfter: nil, progressed: progressed, now: now)
        }
    }

    /// Schedules another attempt of `connection` after a failure, or retires it, or fails the
    /// download, as the retry policy decides.
    private mutating func retry(
        _ connection: Int, _ error: HaulError, retryAfter: Duration?, progressed: Bool, now: Moment
    ) -> [TransferAction] {
        if progressed { connections[connection].failures = 0 }
        connections[connection].failures += 1
        let failures = connections[connection].failures
        let decision = settings.retry.decide(failures: failures, retryAfter: retryAfter, random: random.nextUnit())
        // What arrived before the failure is stored now.
        var actions = checkpointIfDue(now: now, force: true)
        let exhausted = if case .retry = decision { false } else { true }
        if let moved = sourceFailed(connection, error, exhausted: exhausted, now: now) { return actions + moved }
        switch decision {
        case .retry(let delay):
            connections[connection].state = .waiting(until: now + delay)
            actions += [
                .report(.retrying(attempt: failures, delay: delay, error: error)),
                .log("connection \(connection): \(error.message); retry \(failures) in \(delay)"),
            ]
        case .exhausted, .waitTooLong:
            let final = RetryPolicy.finalError(error, decision)
            guard othersCanContinue(without: connection) else { return actions + fail(final, now: now) }
            connections[connection].state = .retired
            actions.append(.log("connection \(connection) retires (\(final.message)); the others fetch its ranges"))
        }
        return actions
    }

    /// After a connection's request ended: finish a stop, or give the freed connection work.
    private mutating func afterConnectionChange(now: Moment) -> [TransferAction] {
        if case .stopping = phase { return finishStopping(now: now) }
        if phase.kind == .transferring, table?.isComplete == true { return stop(then: .verify, now: now) }
        return resumeWork(now: now)
    }

    // MARK: Time

    /// Time passed: stalled connections are abandoned, waits end, checkpoints and the ramp move on.
    private mutating func timer(now: Moment) -> [TransferAction] {
        var actions: [TransferAction] = []
        for index in connections.indices {
            switch connections[index].state {
            case .requesting(_, _, let since) where now - since >= settings.stallTimeout:
                connections[index].state = .stopping(.stalled)
                actions += [.abandon(connection: index), .log("connection \(index): no answer; stalled")]
            case .receiving(let receiving) where now - receiving.lastByte >= settings.stallTimeout:
                if receiving.progressed { connections[index].failures = 0 }
                if phase.kind == .stoppingToVerify, receiving.checksBody {
                    actions += refetchUnchecked(receiving)
                }
                connections[index].state = .stopping(.stalled)
                actions += [.abandon(connection: index), .log("connection \(index): no data; stalled")]
            case .waiting(let until) where now >= until:
                connections[index].state = .idle
            default:
                break
            }
        }
        if phase.kind == .transferring, table != nil {
            actions += checkpointIfDue(now: now)
            actions += moveRamp(now: now)
        }
        return actions + resumeWork(now: now)
    }

    /// Stores a checkpoint when one is due (or now, when `force`d and there is progress to store),
    /// while the file is fetched and not yet complete.
    private mutating func checkpointIfDue(now: Moment, force: Bool = false) -> [TransferAction] {
        guard phase.kind == .transferring || phase.kind == .probing, var record = manifest, let table,
            !table.isComplete, let durable = checkpoints.takeIfDue(table.segments, now: now, force: force)
        else { return [] }
        record.segments = table.manifestSegments
        return [.checkpoint(Checkpoint(manifest: record, durable: durable))]
    }

    // MARK: Giving connections work

    /// Gives idle connections work: the next request of a file written in order, or ranges to fetch.
    private mutating func resumeWork(now: Moment) -> [TransferAction] {
        switch phase {
        case .probing:
            // The first request failed, and its wait is over: ask again.
            guard !connections.contains(where: { $0.isBusy || $0.isWaiting }),
                connections.contains(where: { $0.state == .idle })
            else { return [] }
            return probe(now: now)
        case .transferring:
            guard let table else { return [] }
            if table.isSingle, !table.segments[0].isComplete, table.owner(of: 0) == nil {
                // The file is written in order: the next request asks for the rest, as the first did,
                // once the wait after the last failure is over.
                guard !connections.contains(where: { $0.isBusy || $0.isWaiting }),
                    connections.contains(where: { $0.state == .idle })
                else { return [] }
                return probe(now: now)
            }
            return startConnections(now: now)
        default:
            return []
        }
    }

    /// Gives every idle connection the download may use a range to fetch.
    private mutating func startConnections(now: Moment) -> [TransferAction] {
        guard phase.kind == .transferring, rangesAllowed, var table, !table.isComplete, let record = manifest,
            record.validator.ifRangeValue != nil, let total = table.totalLength
        else { return [] }
        let wasSingle = table.isSingle
        let endsBefore = table.segments.map(\.end)
        var sends: [TransferAction] = []
        var stops: [TransferAction] = []
        for index in connections.indices where index < ramp.allowed && connections[index].state == .idle {
            guard let claim = table.claim(connection: index, now: now, stallTakeover: settings.stallTakeover) else {
                continue
            }
            if let displaced = claim.displaced {
                stops.append(
                    .log(
                        "connection \(index) takes over bytes \(claim.from)-\(claim.to - 1) from stalled connection \(displaced)"
                    ))
                stops += stopConnection(displaced, .replaced)
            }
            let source = source(for: index)
            let ask = rangeAsk(
                from: claim.from, to: claim.to, source: source, validator: record.validator, total: total)
            sends.append(send(ask, on: index, segment: claim.segment, source: source, now: now))
        }
        self.table = table
        var actions: [TransferAction] = []
        if wasSingle && !table.isSingle {
            // The manifest records the ranges before any byte is written out of order: one range
            // means "the file's size is what is kept", which holds only for a file written in order.
            var layout = record
            layout.segments = table.manifestSegments
            manifest = layout
            actions.append(
                .prepareFile(
                    FilePreparation(
                        manifest: layout, startsOver: false, storesLayout: true, neededBytes: nil,
                        reservation: (total, 0, table.segments.count))))
        }
        for (index, end) in endsBefore.enumerated() where table.segments[index].end != end {
            if let owner = table.owner(of: index), case .receiving = connections[owner].state {
                actions.append(.setLimit(connection: owner, table.segments[index].end))
            }
        }
        return actions + stops + sends
    }

    // MARK: Mirrors

    /// Decides how the mirrors are used, from what the origin's answer (or the stored manifest) shows:
    /// returns the report for the caller.
    private mutating func decideMirrorUse(validator: ResourceValidator, rangesAllowed: Bool) -> [TransferAction] {
        guard hasMirrors, mirrorUse == nil else { return [] }
        let report: MirrorReport
        if !rangesAllowed {
            mirrorUse = .inTurn
            report = .inTurn(reason: "the file comes over one connection")
        } else if settings.checksumGiven {
            mirrorUse = .mixed(digests: [])
            report = .mixed(proof: "the file's checksum is checked at the end, and every mirror must give its length")
        } else if !validator.digests.isEmpty {
            mirrorUse = .mixed(digests: validator.digests)
            report = .mixed(proof: "every mirror must send the Repr-Digest \(sources[origin].url) sends")
        } else {
            mirrorUse = .inTurn
            report = .inTurn(
                reason:
                    "no checksum was given and \(sources[origin].url) sends no Repr-Digest, so nothing shows they hold the same bytes"
            )
        }
        return [.report(.mirror(report)), .log(report.description)]
    }

    /// A mirror's answer to a range, when the mirrors are mixed: the mirror is dropped when the
    /// answer does not fit (another length, version or digest, the whole file for a range, a status
    /// no retry mends), and its first accepted answer gives the validator of its later requests.
    /// `nil` when the answer goes the usual way.
    private mutating func mirrorAnswer(
        _ verdict: ResponseVerdict, head: ResponseHead, on connection: Int, now: Moment
    ) -> [TransferAction]? {
        let source = connections[connection].source
        guard isMixing, othersActive(besides: source) else { return nil }
        let reason: String
        switch verdict {
        case .accept:
            guard let refusal = mirrorRefusal(head) else {
                if sources[source].validator == nil {
                    sources[source].validator = ResourceValidator(headers: head.headers)
                }
                return nil
            }
            reason = refusal
        case .restart(let why): reason = why.description
        case .fail(_, let message, _): reason = message
        case .alreadyComplete, .probeRefused: reason = "it refused the range"
        case .retry: return nil
        }
        table?.releaseAll(of: connection)
        connections[connection].state = .idle
        return [.drop(connection: connection)] + dropSource(source, reason)
    }

    /// A failure on a connection to a mixed mirror that drops the mirror rather than the download:
    /// one about the server, not the disk. `nil` when the failure goes the usual way.
    private mutating func mirrorFailure(_ failure: TransferFailure, on connection: Int) -> [TransferAction]? {
        let source = connections[connection].source
        guard isMixing, sources[source].isActive, othersActive(besides: source),
            case .fatal(let error) = failure, Self.isAboutTheServer(error)
        else { return nil }
        return dropSource(source, error.message)
    }

    /// Counts a failed attempt against the connection's source: past ``sourceFailureLimit`` in a
    /// row, mixed mirrors drop it (the connection takes a range from another at once), and mirrors
    /// used in turn go on to the next one. `nil` when the attempt is retried as usual.
    private mutating func sourceFailed(_ connection: Int, _ error: HaulError, exhausted: Bool, now: Moment)
        -> [TransferAction]?
    {
        guard hasMirrors else { return nil }
        let source = connections[connection].source
        // A server that delivers on another connection works: this connection's failures are its
        // own (one connection per client, say), and it retires as without mirrors.
        let delivering = connections.indices.contains { index in
            guard index != connection, connections[index].source == source,
                case .receiving(let receiving) = connections[index].state
            else { return false }
            return receiving.progressed
        }
        guard !delivering else { return nil }
        sources[source].failures += 1
        guard exhausted || sources[source].failures >= Self.sourceFailureLimit else { return nil }
        if isMixing {
            guard sources[source].isActive, othersActive(besides: source) else { return nil }
            connections[connection].failures = 0
            connections[connection].state = .idle
            return dropSource(source, error.message) + startConnections(now: now)
        }
        guard source == origin, let next = nextSource(for: error) else { return nil }
        return switchSource(to: next, error, now: now)
    }

    /// Stops using `source`: its connections stop and their ranges go to the others.
    private mutating func dropSource(_ source: Int, _ reason: String) -> [TransferAction] {
        guard sources[source].isActive else { return [] }
        sources[source].dropped = reason
        let url = sources[source].url
        var actions: [TransferAction] = [
            .report(.mirror(.dropped(url: url, reason: reason))), .log("mirror \(url) dropped: \(reason)"),
        ]
        for index in connections.indices where connections[index].source == source {
            connections[index].failures = 0
            guard connections[index].isBusy else { continue }
            table?.releaseAll(of: index)
            actions += stopConnection(index, .replaced)
        }
        return actions
    }

    /// The next source to fetch the file from when the file fails the caller's checksum and all of
    /// it came from the origin (mirrors used in turn, or mixed mirrors whose bytes were all fetched
    /// again from it): the checksum shows the origin serves other bytes.
    ///
    /// The mirrors dropped for differing from this origin come back first: it was the one wrong.
    private mutating func nextSourceAfterMismatch() -> Int? {
        guard hasMirrors, !isMixing || mirrorsThatWrote.isEmpty else { return nil }
        for index in sources.indices where sources[index].droppedAgainst == origin {
            sources[index].dropped = nil
            sources[index].droppedAgainst = nil
        }
        return nextActiveSource
    }

    /// Leaves the origin for source `next`: the download starts over from it (nothing shows the two
    /// hold the same bytes).
    private mutating func switchSource(to next: Int, _ error: HaulError, now: Moment) -> [TransferAction] {
        let failed = sources[origin].url
        // The restart's discard resets what the sources showed (``resetSources()``).
        let actions = dropSource(origin, error.message)
        origin = next
        return actions
            + restart(.mirrorFallback("\(failed) failed: \(error.message); next: \(sources[next].url)"), now: now)
    }

    /// Forgets what the mirrors showed of the bytes a restart discards: who wrote what, their
    /// validators and failures, and how they are used (the next origin's answer decides again). A
    /// dropped origin gives way to the first mirror still in use.
    private mutating func resetSources() {
        guard hasMirrors else { return }
        for index in sources.indices {
            sources[index].wrote = []
            sources[index].failures = 0
            sources[index].validator = nil
        }
        mirrorUse = nil
        if !sources[origin].isActive, let next = nextActiveSource { origin = next }
    }

    /// The source a stored download's bytes came from (see ``Manifest/source``), when it is one of
    /// this request's.
    private mutating func resumeFrom(_ stored: Manifest) {
        guard let source = stored.source, let index = sources.firstIndex(where: { $0.url == source }) else { return }
        origin = index
    }

    /// Records that `source` wrote `from..<upTo`.
    private mutating func noteWritten(by source: Int, from: Int64, upTo: Int64) {
        guard hasMirrors, sources.indices.contains(source), from < upTo else { return }
        sources[source].failures = 0
        if let last = sources[source].wrote.last, last.upperBound == from {
            sources[source].wrote[sources[source].wrote.count - 1] = last.lowerBound..<upTo
        } else {
            sources[source].wrote.append(from..<upTo)
        }
    }

    // MARK: Checking the mirrors' bytes

    /// The complete file failed its checksum or digest while mixed mirrors wrote part of it: a
    /// piece of what each mirror wrote is fetched again from the origin and compared with the disk
    /// (``TransferMachine/Phase/checkingMirrors``). `nil` when no mirror but the origin wrote a byte
    /// (the failure is then the origin's own).
    private mutating func checkMirrors(_ detail: String, thenPause: Bool, now: Moment) -> [TransferAction]? {
        guard isMixing, let table, let record = manifest, table.totalLength != nil else { return nil }
        let attributed = sources.reduce(Int64(0)) { sum, source in
            sum + source.wrote.reduce(Int64(0)) { $0 + $1.upperBound - $1.lowerBound }
        }
        if attributed < table.written {
            // Bytes stored by an earlier session may come from any mirror: nobody can be blamed,
            // and nothing of them can be trusted.
            return restart(
                .untrustedPartial("the file failed its check (\(detail)) and mirrors wrote part of it earlier"),
                now: now)
        }
        let contributors = mirrorsThatWrote
        guard !contributors.isEmpty, sources[origin].isActive else { return nil }
        var checks = MirrorChecks(detail: detail, pending: [])
        for source in contributors {
            // The longest stretch it wrote, its first piece's worth.
            guard let interval = sources[source].wrote.max(by: { $0.count < $1.count }),
                let segment = table.segments.firstIndex(where: {
                    $0.start <= interval.lowerBound && interval.lowerBound < $0.end
                })
            else {
                checks.blamed.insert(source)
                continue
            }
            let to = min(interval.upperBound, interval.lowerBound + record.pieceSize, table.segments[segment].end)
            checks.pending.append(MirrorCheck(source: source, segment: segment, from: interval.lowerBound, to: to))
        }
        phase = .checkingMirrors(checks)
        for index in connections.indices where connections[index].state != .retired {
            connections[index].state = .idle
        }
        self.table?.releaseAllOwners()
        if thenPause {
            // A pause asked for during the file's check: no time to compare, what every mirror
            // wrote is forgotten before it stops.
            return concludeMirrorChecks(checks, thenPause: true, now: now)
        }
        let log = TransferAction.log(
            "the file failed its check (\(detail)): a piece of what each mirror wrote is compared with \(sources[origin].url)"
        )
        return [log] + nextMirrorChecks(checks, now: now)
    }

    /// Sends the checks still to make on the connections free for them.
    private mutating func nextMirrorChecks(_ checks: MirrorChecks, now: Moment) -> [TransferAction] {
        guard let record = manifest, let total = table?.totalLength else { return [] }
        var checks = checks
        var actions: [TransferAction] = []
        for index in connections.indices where connections[index].state == .idle && !checks.pending.isEmpty {
            let check = checks.pending.removeFirst()
            checks.running[index] = check
            let ask = RangeAsk.compare(
                from: check.from, to: check.to, ifRange: record.validator.ifRangeValue,
                expected: RangeAsk.Expected(validator: record.validator, totalLength: total))
            actions.append(send(ask, on: index, segment: check.segment, source: origin, now: now))
        }
        phase = .checkingMirrors(checks)
        if checks.running.isEmpty && checks.pending.isEmpty {
            return concludeMirrorChecks(checks, thenPause: false, now: now)
        }
        return actions
    }

    /// The origin's answer to a check: its bytes are compared with the disk, none written.
    private mutating func mirrorCheckAnswer(_ verdict: ResponseVerdict, on connection: Int, now: Moment)
        -> [TransferAction]
    {
        guard case .checkingMirrors(let checks) = phase, let check = checks.running[connection],
            case .accept(let facts) = verdict,
            case .requesting(let ask, _, _) = connections[connection].state
        else {
            // The origin cannot show what the bytes should be: the mirror is not trusted.
            connections[connection].state = .idle
            return [.drop(connection: connection)] + mirrorCheckEnded(connection, agrees: false, now: now)
        }
        connections[connection].state = .receiving(.init(ask: ask, segment: check.segment, lastByte: now))
        return [
            .receive(
                connection: connection,
                ReceivePlan(
                    segment: check.segment, bodyStart: facts.bodyStart, writeStart: check.to, limit: check.to,
                    answerEnd: check.to, contentDigests: [], pieceSize: manifest?.pieceSize ?? settings.pieceSize))
        ]
    }

    /// A check's request ended: the bytes matched (`agrees`), differed, or could not be compared.
    private mutating func mirrorCheckEnded(_ connection: Int, agrees: Bool, now: Moment) -> [TransferAction] {
        guard case .checkingMirrors(var checks) = phase, let check = checks.running.removeValue(forKey: connection)
        else { return [] }
        connections[connection].state = .idle
        if !agrees { checks.blamed.insert(check.source) }
        return nextMirrorChecks(checks, now: now)
    }

    /// Every check is done: the mirrors whose bytes differ are dropped and what they wrote is
    /// fetched again from the others. When no check told them apart, what every mirror wrote is
    /// fetched again from the origin. With `thenPause` (the caller cancelled), the download pauses
    /// instead, what it trusts kept.
    private mutating func concludeMirrorChecks(_ checks: MirrorChecks, thenPause: Bool, now: Moment) -> [TransferAction]
    {
        guard var table else { return [] }
        let contributors = mirrorsThatWrote
        let blamed = checks.blamed.isEmpty ? contributors : contributors.filter { checks.blamed.contains($0) }
        var actions: [TransferAction] = []
        var forgotten: Int64 = 0
        let firstForgotten = blamed.compactMap { sources[$0].wrote.map(\.lowerBound).min() }.min() ?? 0
        // The hash kept of the file's first bytes no longer holds from there.
        actions.append(.forgetHashes(from: firstForgotten))
        for source in blamed {
            for interval in sources[source].wrote {
                forgotten += interval.upperBound - interval.lowerBound
                for index in table.segments.indices
                where table.segments[index].start < interval.upperBound
                    && table.segments[index].position > interval.lowerBound
                {
                    table.cut(index, to: max(interval.lowerBound, table.segments[index].start))
                }
                manifest?.forgetPieces(from: interval.lowerBound, to: interval.upperBound)
            }
            sources[source].wrote = []
            let reason =
                checks.blamed.contains(source)
                ? "its bytes differ from \(sources[origin].url)'s" : "the complete file failed its check"
            actions += dropSource(source, reason)
            sources[source].droppedAgainst = origin
        }
        self.table = table
        phase = .transferring
        meter = ProgressMeter(
            startingAt: table.written, totalBytes: table.totalLength, interval: settings.progressInterval)
        let urls = blamed.map { sources[$0].url }.joined(separator: ", ")
        actions.append(
            .log(
                "the file failed its check (\(checks.detail)): \(ByteCount.format(forgotten)) from \(urls) fetched again"
            ))
        if thenPause {
            // A pause asked for during the check: it keeps what is trusted, and the refetch waits.
            return actions + stop(then: .pause, now: now)
        }
        if let record = manifest {
            actions.append(
                .started(
                    StartFacts(
                        url: finalURL, totalBytes: table.totalLength, resumedFrom: table.written, resumable: true,
                        validator: record.validator)))
        }
        return actions + startConnections(now: now)
    }
}
