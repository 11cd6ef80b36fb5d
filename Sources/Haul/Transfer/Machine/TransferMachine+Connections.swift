import NIOHTTP1

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The rules for connections: answers, progress, going on past a range, failures, stalls,
/// take-overs and the next range to claim.
extension TransferMachine {
    mutating func received(_ head: ResponseHead, on connection: Int, now: Moment) -> [TransferAction] {
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
    mutating func refused(_ verdict: ResponseVerdict, on connection: Int, now: Moment) -> [TransferAction] {
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

    static func retryable(status: Int, retryAfter: Int64?) -> TransferFailure {
        let phrase = HTTPResponseStatus(statusCode: status).reasonPhrase
        return .retryable(
            HaulError(.httpStatus, "the server answered \(status) \(phrase)", status: status),
            retryAfter: retryAfter.map { .seconds($0) })
    }

    // MARK: Progress

    /// A rate limit holds the request's bytes back until `until`: neither its stall clock nor a
    /// take-over of its range runs before then.
    mutating func throttled(_ request: RequestTag, until: Moment) {
        guard isCurrent(request), case .receiving(var receiving) = connections[request.connection].state else {
            return
        }
        receiving.lastByte = max(receiving.lastByte, until)
        connections[request.connection].state = .receiving(receiving)
        table?.hold(receiving.segment, until: until)
    }

    mutating func wrote(_ request: RequestTag, segment: Int, upTo: Int64, pieces: [Int: String], now: Moment)
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
    mutating func moveRamp(now: Moment) -> [TransferAction] {
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
    mutating func reachedLimit(_ connection: Int, at offset: Int64, now: Moment) -> [TransferAction] {
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
    mutating func reportProgress(at now: Moment, force: Bool = false) -> [TransferAction] {
        guard let written = table?.written, meter?.record(written, at: now, force: force) == true,
            let progress = meter?.report(connections: openConnections)
        else { return [] }
        return [.report(.progress(progress))]
    }

    /// Connections with a request out or an answer arriving.
    var openConnections: Int {
        connections.count { connection in
            switch connection.state {
            case .requesting, .receiving: true
            case .idle, .waiting, .stopping, .retired: false
            }
        }
    }

    /// The most bytes a connection reads and drops to go on into the next range rather than ask
    /// for it anew: what it receives while a new request waits for its answer, twice over, at least
    /// 1 MiB.
    var skipAllowance: Int64 {
        let receiving = connections.filter { if case .receiving = $0.state { true } else { false } }.count
        let perConnection = (meter?.bytesPerSecond ?? 0) / Double(max(1, receiving))
        return max(1 << 20, Int64(min(2 * answerDelay.seconds * perConnection, Double(Int64.max / 2))))
    }

    // MARK: Ends and failures

    mutating func ended(_ connection: Int, _ end: ConnectionEnd, now: Moment) -> [TransferAction] {
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
        case (.receiving, .failed(let failure)), (.requesting, .failed(let failure)):
            actions = failed(connection, failure, now: now)
        case (.receiving, _), (.requesting, _):
            table?.releaseAll(of: connection)
            connections[connection].state = .idle
        case (.idle, _), (.waiting, _), (.retired, _):
            break
        }
        return forgotten + actions + afterConnectionChange(now: now)
    }

    /// Stops connection `index` for `cause`: a request out or an answer being written is abandoned,
    /// a wait ends. One already stopping keeps its cause (a stall still counts as a failed attempt).
    mutating func stopConnection(_ index: Int, _ cause: Connection.StopCause) -> [TransferAction] {
        switch connections[index].state {
        case .requesting, .receiving:
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
    mutating func failed(_ connection: Int, _ failure: TransferFailure, now: Moment) -> [TransferAction] {
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
        }
    }

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

    /// Whether a connection delivers bytes (or has left): what the ramp waits for before measuring.
    private func delivers(_ connection: Connection) -> Bool {
        switch connection.state {
        case .receiving(let receiving): receiving.progressed
        case .retired: true
        default: false
        }
    }

    /// Whether other connections can finish the download if `connection` leaves.
    private func othersCanContinue(without connection: Int) -> Bool {
        guard phase.kind == .transferring, rangesAllowed else { return false }
        return connections.indices.contains { index in
            index != connection && index < ramp.allowed && connections[index].state != .retired
        }
    }

    /// After a connection's request ended: finish a stop, or give the freed connection work.
    private mutating func afterConnectionChange(now: Moment) -> [TransferAction] {
        if case .stopping = phase { return finishStopping(now: now) }
        if phase.kind == .transferring, table?.isComplete == true { return stop(then: .verify, now: now) }
        return resumeWork(now: now)
    }

    // MARK: Time

    mutating func timer(now: Moment) -> [TransferAction] {
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
    mutating func checkpointIfDue(now: Moment, force: Bool = false) -> [TransferAction] {
        guard phase.kind == .transferring || phase.kind == .probing, var record = manifest, let table,
            !table.isComplete, let durable = checkpoints.takeIfDue(table.segments, now: now, force: force)
        else { return [] }
        record.segments = table.manifestSegments
        return [.checkpoint(Checkpoint(manifest: record, durable: durable))]
    }

    /// When an idle connection could take over a range that made no progress, if one can.
    var nextTakeover: Moment? {
        guard rangesAllowed, let table,
            connections.indices.contains(where: { $0 < ramp.allowed && connections[$0].state == .idle })
        else { return nil }
        // Only a range a connection is fetching can stall; one without a busy owner is claimed as it is.
        return table.segments.filter { segment in
            guard let owner = segment.owner, !segment.isComplete else { return false }
            return connections.indices.contains(owner) && connections[owner].isBusy
        }
        .map { $0.lastProgress + settings.stallTakeover }
        .min()
    }

    // MARK: Giving connections work

    /// Gives idle connections work: the next request of a file written in order, or ranges to fetch.
    mutating func resumeWork(now: Moment) -> [TransferAction] {
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
    mutating func startConnections(now: Moment) -> [TransferAction] {
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
}

extension TransferMachine.Connection {
    var isWaiting: Bool {
        if case .waiting = state { true } else { false }
    }
}

extension Manifest {
    /// Forgets the hashes of the pieces that overlap `from..<to`: their bytes are fetched again.
    mutating func forgetPieces(from: Int64, to: Int64) {
        guard pieceSize > 0, from < to else { return }
        let first = Int(from / pieceSize)
        let last = Int(min((to - 1) / pieceSize, Int64(pieces.count - 1)))
        guard first <= last else { return }
        for index in first...last { pieces[index] = nil }
    }
}
