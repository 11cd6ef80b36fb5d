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
    /// The phases of a download, each with what holds only while the download is in it.
    enum Phase: Sendable {
        /// Nothing has happened yet.
        case created
        /// The stored bytes of a resumed download are being checked.
        case resuming
        /// The first request is out: what the file is, and whether it comes in ranges, is not known.
        case probing
        /// The first answer arrived; the destination it names is being opened, the answer held.
        case choosingDestination(FirstAnswer)
        /// Connections fetch the ranges.
        case transferring
        /// Connections are stopping; then the download goes on as `then` says.
        case stopping(then: AfterStop)
        /// The partial data is being discarded, for this reason; then the download starts over, or
        /// pauses when the caller cancelled it while it could not stop (`thenPause`).
        case restarting(RestartReason, thenPause: Bool)
        /// The complete file is being checked; with `thenPause`, the caller cancelled meanwhile, and
        /// the download pauses once the check is over.
        case verifying(thenPause: Bool)
        /// The complete file failed its check: a piece of what each mirror wrote is being fetched
        /// again from the origin and compared with the disk, to tell which mirror served other bytes.
        case checkingMirrors(MirrorChecks)
        /// The complete file is being renamed into place.
        case finishing
        /// The last checkpoint of a cancelled download is being stored.
        case pausing
        /// The last checkpoint of a download failing with this error is being stored.
        case failing(HaulError)
        /// Cancelled; the data and its manifest are kept.
        case paused
        /// Failed with this error; the data and its manifest are kept.
        case failed(HaulError)
        /// The file is complete under its final name.
        case completed

        /// Whether the download is over.
        var isTerminal: Bool {
            switch self {
            case .paused, .failed, .completed: true
            default: false
            }
        }

        /// A phase without its details, one case for every phase and for every course a stop can
        /// take: what a test goes through to reach every phase there is.
        enum Kind: CaseIterable, Sendable {
            case created
            case resuming
            case probing
            case choosingDestination
            case transferring
            case stoppingToRestart
            case stoppingToVerify
            case stoppingToPause
            case stoppingToFail
            case restarting
            case verifying
            case checkingMirrors
            case finishing
            case pausing
            case failing
            case paused
            case failed
            case completed
        }

        /// The phase without its details.
        var kind: Kind {
            switch self {
            case .created: .created
            case .resuming: .resuming
            case .probing: .probing
            case .choosingDestination: .choosingDestination
            case .transferring: .transferring
            case .stopping(then: .restart): .stoppingToRestart
            case .stopping(then: .verify): .stoppingToVerify
            case .stopping(then: .pause): .stoppingToPause
            case .stopping(then: .fail): .stoppingToFail
            case .restarting: .restarting
            case .verifying: .verifying
            case .checkingMirrors: .checkingMirrors
            case .finishing: .finishing
            case .pausing: .pausing
            case .failing: .failing
            case .paused: .paused
            case .failed: .failed
            case .completed: .completed
            }
        }
    }

    /// The first accepted answer of a download whose destination it names, held while the
    /// destination is opened.
    struct FirstAnswer: Sendable {
        /// The connection the answer came on.
        let connection: Int
        /// What the request asked.
        let ask: RangeAsk
        /// The answer's head.
        let head: ResponseHead
        /// What the classifier found in it.
        let facts: ResponseFacts
    }

    /// What a download does once its connections have stopped.
    enum AfterStop: Sendable {
        /// Discard the partial data and start over, for this reason (or pause once it is discarded,
        /// when the caller cancelled the download while its file was checked).
        case restart(RestartReason, thenPause: Bool)
        /// Check the complete file.
        case verify
        /// Store the last checkpoint and pause.
        case pause
        /// Store the last checkpoint and fail with this error.
        case fail(HaulError)

        /// Which of two stops wins: a pause wins over everything, a failure over a restart, a
        /// restart over completion. Of two equal ones, the first stays (the first error is the one
        /// the caller hears about).
        var rank: Int {
            switch self {
            case .verify: 0
            case .restart: 1
            case .fail: 2
            case .pause: 3
            }
        }
    }

    /// One connection of the download and what it is doing.
    struct Connection: Equatable, Sendable {
        enum State: Equatable, Sendable {
            /// Free to take a range.
            case idle
            /// `ask` was sent for `segment` (`nil` before the file's ranges are known).
            case requesting(RangeAsk, segment: Int?, since: Moment)
            /// Writing the answer's body.
            case receiving(Receiving)
            /// Waiting before the next attempt.
            case waiting(until: Moment)
            /// Told to stop; its request has not ended yet.
            case stopping(StopCause)
            /// Left the download: the server keeps refusing it.
            case retired
        }

        /// A connection writing its answer's body.
        struct Receiving: Equatable, Sendable {
            let ask: RangeAsk
            /// The range it writes now.
            var segment: Int
            /// When its last bytes were written, or when a rate limit that holds them back lets
            /// them go, whichever is later: its stall clock runs from there.
            var lastByte: Moment
            /// Whether it wrote a byte in this request.
            var progressed = false
            /// Whether the body must match a `Content-Digest` when it ends: the file is not complete
            /// before that is known.
            var checksBody = false
        }

        /// Why a connection was told to stop.
        enum StopCause: Equatable, Sendable {
            /// Nothing arrived for the stall timeout: the attempt counts as failed.
            case stalled
            /// Another connection took its range.
            case replaced
            /// The download is pausing, restarting, failing or complete.
            case shutdown
        }

        var state: State = .idle
        /// Failed attempts in a row.
        var failures = 0
        /// The serial number of the connection's current request.
        var serial = 0
        /// The source (see ``TransferMachine/sources``) of its current request.
        var source = 0

        /// Whether a request of this connection is under way.
        var isBusy: Bool {
            switch state {
            case .requesting, .receiving, .stopping: true
            case .idle, .waiting, .retired: false
            }
        }
    }

    let settings: Settings
    /// The URL the caller asked for.
    let originalURL: String
    /// The kernel boot this process runs in (what decides whether written bytes are trusted).
    let bootID: String?
    var phase: Phase = .created
    /// The download's record: validator, length, ranges, piece hashes.
    var manifest: Manifest?
    /// The ranges and who fetches them, once the file is known.
    var table: RangeTable?
    var connections: [Connection]
    var ramp: ConnectionRamp
    /// Restarts from byte 0 in this call.
    var restarts = 0
    /// The bytes kept from earlier sessions, once known.
    var resumedFrom: Int64?
    /// The URL the bytes come from, after redirects.
    var finalURL: String
    /// Whether the destination is known (a directory download names it from the first answer).
    var destinationKnown = false
    /// How a fresh request asks for the file.
    enum RangeProbe: Equatable, Sendable {
        /// With `bytes=0-`, to learn whether ranges are served.
        case ask
        /// Without a range, once: `bytes=0-` was told to come back, and the plain request tells
        /// whether the range or the server's load was the reason.
        case deferred
        /// Without a range: the server refused `bytes=0-`.
        case refused
    }
    var rangeProbe = RangeProbe.ask
    /// Whether the file may be fetched in ranges by several connections.
    var rangesAllowed = false
    /// Whether the server answered a request for a range with its bytes in this call: a range whose
    /// connection left can then be asked for where it stands.
    var rangeServed = false
    /// How long the last answer took to arrive after its request: what asking again costs.
    var answerDelay = Duration.zero
    var meter: ProgressMeter?
    /// When progress is stored, and the checkpoint being stored.
    var checkpoints: CheckpointSchedule
    var random: SplitMix64
    /// The serial number of the last request sent.
    var lastSerial = 0
    /// The URLs the file may come from: the request's own, then its mirrors.
    var sources: [Source]
    /// How the mirrors are used, once the origin's answer has shown it (`nil` before, and without mirrors).
    var mirrorUse: MirrorUse?
    /// The source the file comes from in order, and whose validator the manifest keeps.
    var origin = 0

    init(
        settings: Settings, url: String, mirrors: [String] = [], bootID: String?, now: Moment,
        seed: UInt64 = .random(in: 0...UInt64.max)
    ) {
        self.settings = settings
        self.originalURL = url
        self.sources = ([url] + mirrors).map { Source(url: $0) }
        self.finalURL = url
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
        case .head(let request, let head):
            guard isCurrent(request) else { return [.drop(connection: request.connection)] }
            return received(head, on: request.connection, now: now)
        case .wrote(let request, let segment, let upTo, let pieces):
            return wrote(request, segment: segment, upTo: upTo, pieces: pieces, now: now)
        case .throttled(let request, let until):
            throttled(request, until: until)
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
            case .idle, .stopping, .retired: break
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
    mutating func probe(now: Moment) -> [TransferAction] {
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
    mutating func send(_ ask: RangeAsk, on connection: Int, segment: Int?, source: Int? = nil, now: Moment)
        -> TransferAction
    {
        lastSerial += 1
        let source = source ?? origin
        connections[connection].serial = lastSerial
        connections[connection].source = source
        connections[connection].state = .requesting(ask, segment: segment, since: now)
        return .send(RequestTag(connection: connection, serial: lastSerial, source: source), ask)
    }

    /// Whether `request` is its connection's current request (events of earlier ones are late).
    func isCurrent(_ request: RequestTag) -> Bool {
        connections.indices.contains(request.connection) && connections[request.connection].serial == request.serial
    }

    // MARK: The first answer

    /// Handles the answer to the first request of an attempt.
    mutating func firstAnswer(
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
        let resumable =
            facts.acceptsRanges && facts.contentEncoding == nil
            && (!facts.validator.isEmpty || settings.trustUnvalidatedResume)
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
    mutating func restart(_ reason: RestartReason, now: Moment) -> [TransferAction] {
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
    mutating func fail(_ error: HaulError, now: Moment) -> [TransferAction] {
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
    mutating func stop(then next: AfterStop, now: Moment) -> [TransferAction] {
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
    mutating func finishStopping(now: Moment) -> [TransferAction] {
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

    private mutating func beginVerifying(now: Moment) -> [TransferAction] {
        guard let table, let total = table.totalLength ?? manifest?.totalLength else {
            return fail(HaulError(.protocolViolation, "the file's length is not known"), now: now)
        }
        phase = .verifying(thenPause: false)
        return reportProgress(at: now, force: true) + [
            .verify(totalBytes: total, validator: manifest?.validator ?? ResourceValidator())
        ]
    }

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
    mutating func record(_ pieces: [Int: String]) {
        guard !pieces.isEmpty, var record = manifest else { return }
        for (index, hash) in pieces {
            if record.pieces.count <= index {
                record.pieces += Array(repeating: nil, count: index + 1 - record.pieces.count)
            }
            record.pieces[index] = hash
        }
        manifest = record
    }
}
