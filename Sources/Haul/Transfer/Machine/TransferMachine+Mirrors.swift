/// The rules for mirrors: several URLs of one file (``DownloadRequest/mirrors``).
///
/// The first URL that answers is the download's origin: its answer gives the file's length and the
/// validator the manifest keeps. Mirrors serve ranges side by side only when something shows they
/// hold the same bytes: a checksum the complete file must match (and the same length in every
/// answer), or the same `Repr-Digest` in every answer. Then a mirror that fails again and again,
/// refuses ranges, or answers with another length or digest is dropped and its ranges go to the
/// others; and when the complete file fails its checksum or digest, a piece of what each mirror
/// wrote is compared with the origin's bytes, and the mirrors that differ are dropped and their
/// bytes fetched again (``Phase/checkingMirrors``). Without such proof the mirrors are used one
/// after another: when the URL in use fails, the next one serves the file from byte 0, so bytes of
/// two servers never meet in one file.
extension TransferMachine {
    /// One URL the file may come from: the request's own (0), then its mirrors in order.
    struct Source: Equatable, Sendable {
        let url: String
        /// Why the download stopped using it (`nil` while it is used).
        var dropped: String?
        /// What the source's first answer identified its copy by: the `If-Range` of its later requests.
        var validator: ResourceValidator?
        /// Failed attempts on this source since it last delivered bytes.
        var failures = 0
        /// The parts of the file it wrote, as intervals (adjacent ones merged).
        var wrote: [Range<Int64>] = []
        /// The origin it was dropped for differing from (or failing along with): it comes back if
        /// that origin turns out to be the one serving other bytes.
        var droppedAgainst: Int?

        var isActive: Bool { dropped == nil }
    }

    /// How a download with mirrors uses them.
    enum MirrorUse: Equatable, Sendable {
        /// Ranges come from every mirror; with `digests`, each answer must carry one of them.
        case mixed(digests: [Checksum])
        /// One mirror after another, never mixed.
        case inTurn
    }

    /// Failed attempts in a row after which a source is left for another.
    static let sourceFailureLimit = 3

    /// Whether the download has mirrors.
    var hasMirrors: Bool { sources.count > 1 }

    var isMixing: Bool {
        if case .mixed = mirrorUse { true } else { false }
    }

    /// The source connection `connection` fetches its next range from: the origin, unless the mirrors
    /// are mixed, when the connections are spread over the sources in use.
    func source(for connection: Int) -> Int {
        guard isMixing else { return origin }
        let active = sources.indices.filter { sources[$0].isActive }
        guard !active.isEmpty else { return origin }
        return active[connection % active.count]
    }

    /// Whether a source other than `source` is still in use.
    func othersActive(besides source: Int) -> Bool {
        sources.indices.contains { $0 != source && sources[$0].isActive }
    }

    /// The first source in use other than the origin: the next to fetch the file from.
    var nextActiveSource: Int? {
        sources.indices.first { $0 != origin && sources[$0].isActive }
    }

    /// The sources other than the origin that wrote bytes of the file in this session.
    var mirrorsThatWrote: [Int] {
        sources.indices.filter { $0 != origin && !sources[$0].wrote.isEmpty }
    }

    /// The request for bytes `from..<to` from `source`: the origin's with the manifest's validator in
    /// `If-Range`; a mirror's with the validator its own first answer gave (none before that: its
    /// answer must then show the same length, and the same digest when digests are the proof).
    func rangeAsk(from: Int64, to: Int64?, source: Int, validator: ResourceValidator, total: Int64) -> RangeAsk {
        guard source != origin else {
            return .range(
                from: from, to: to, ifRange: validator.ifRangeValue,
                expected: RangeAsk.Expected(validator: validator, totalLength: total))
        }
        var expected = sources[source].validator ?? ResourceValidator()
        if case .mixed(let digests) = mirrorUse, expected.digests.isEmpty { expected.digests = digests }
        return .range(
            from: from, to: to, ifRange: expected.ifRangeValue,
            expected: RangeAsk.Expected(validator: expected, totalLength: total))
    }

    /// Decides how the mirrors are used, from what the origin's answer (or the stored manifest) shows:
    /// returns the report for the caller.
    mutating func decideMirrorUse(validator: ResourceValidator, rangesAllowed: Bool) -> [TransferAction] {
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

    /// Why a mirror's accepted answer to a range cannot be mixed with the others' bytes, if so.
    func mirrorRefusal(_ head: ResponseHead) -> String? {
        guard case .mixed(let digests) = mirrorUse, !digests.isEmpty else { return nil }
        let theirs = ResourceValidator(headers: head.headers).digests
        if digests.contains(where: { theirs.contains($0) }) { return nil }
        return theirs.isEmpty
            ? "it sends no Repr-Digest, so nothing shows it holds the same file"
            : "its Repr-Digest differs: it serves another version"
    }

    /// A mirror's answer to a range, when the mirrors are mixed: the mirror is dropped when the
    /// answer does not fit (another length, version or digest, the whole file for a range, a status
    /// no retry mends), and its first accepted answer gives the validator of its later requests.
    /// `nil` when the answer goes the usual way.
    mutating func mirrorAnswer(
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
    mutating func mirrorFailure(_ failure: TransferFailure, on connection: Int) -> [TransferAction]? {
        let source = connections[connection].source
        guard isMixing, sources[source].isActive, othersActive(besides: source),
            case .fatal(let error) = failure, Self.isAboutTheServer(error)
        else { return nil }
        return dropSource(source, error.message)
    }

    /// Counts a failed attempt against the connection's source: past ``sourceFailureLimit`` in a
    /// row, mixed mirrors drop it (the connection takes a range from another at once), and mirrors
    /// used in turn go on to the next one. `nil` when the attempt is retried as usual.
    mutating func sourceFailed(_ connection: Int, _ error: HaulError, exhausted: Bool, now: Moment)
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
    mutating func dropSource(_ source: Int, _ reason: String) -> [TransferAction] {
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

    /// The next source to fetch the file from when the one in use fails with `error` and the mirrors
    /// are not mixed, if there is one and the error is about the server.
    func nextSource(for error: HaulError) -> Int? {
        guard hasMirrors, !isMixing, Self.isAboutTheServer(error) else { return nil }
        return nextActiveSource
    }

    /// The next source to fetch the file from when the file fails the caller's checksum and all of
    /// it came from the origin (mirrors used in turn, or mixed mirrors whose bytes were all fetched
    /// again from it): the checksum shows the origin serves other bytes.
    ///
    /// The mirrors dropped for differing from this origin come back first: it was the one wrong.
    mutating func nextSourceAfterMismatch() -> Int? {
        guard hasMirrors, !isMixing || mirrorsThatWrote.isEmpty else { return nil }
        for index in sources.indices where sources[index].droppedAgainst == origin {
            sources[index].dropped = nil
            sources[index].droppedAgainst = nil
        }
        return nextActiveSource
    }

    /// Leaves the origin for source `next`: the download starts over from it (nothing shows the two
    /// hold the same bytes).
    mutating func switchSource(to next: Int, _ error: HaulError, now: Moment) -> [TransferAction] {
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
    mutating func resetSources() {
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
    mutating func resumeFrom(_ stored: Manifest) {
        guard let source = stored.source, let index = sources.firstIndex(where: { $0.url == source }) else { return }
        origin = index
    }

    /// Records that `source` wrote `from..<upTo`.
    mutating func noteWritten(by source: Int, from: Int64, upTo: Int64) {
        guard hasMirrors, sources.indices.contains(source), from < upTo else { return }
        sources[source].failures = 0
        if let last = sources[source].wrote.last, last.upperBound == from {
            sources[source].wrote[sources[source].wrote.count - 1] = last.lowerBound..<upTo
        } else {
            sources[source].wrote.append(from..<upTo)
        }
    }

    /// One check of a mirror's bytes: bytes `from..<to` (in range `segment`), which `source` wrote,
    /// fetched again from the origin and compared with the disk.
    struct MirrorCheck: Equatable, Sendable {
        let source: Int
        let segment: Int
        let from: Int64
        let to: Int64
    }

    /// The checks of the mirrors' bytes after the complete file failed its check.
    struct MirrorChecks: Equatable, Sendable {
        /// What the file's check said.
        let detail: String
        /// The checks no connection makes yet.
        var pending: [MirrorCheck]
        /// The checks under way, by connection.
        var running: [Int: MirrorCheck] = [:]
        /// Mirrors whose bytes differ from the origin's, or could not be compared.
        var blamed: Set<Int> = []
    }

    /// The complete file failed its checksum or digest while mixed mirrors wrote part of it: a
    /// piece of what each mirror wrote is fetched again from the origin and compared with the disk
    /// (``TransferMachine/Phase/checkingMirrors``). `nil` when no mirror but the origin wrote a byte
    /// (the failure is then the origin's own).
    mutating func checkMirrors(_ detail: String, thenPause: Bool, now: Moment) -> [TransferAction]? {
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
    mutating func mirrorCheckAnswer(_ verdict: ResponseVerdict, on connection: Int, now: Moment) -> [TransferAction] {
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
    mutating func mirrorCheckEnded(_ connection: Int, agrees: Bool, now: Moment) -> [TransferAction] {
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
    mutating func concludeMirrorChecks(_ checks: MirrorChecks, thenPause: Bool, now: Moment) -> [TransferAction] {
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

    /// Whether an error is about the server or the way to it (worth another mirror), not about the
    /// disk or the caller's request.
    static func isAboutTheServer(_ error: HaulError) -> Bool {
        let codes: Set<HaulError.Code> = [
            .network, .timedOut, .tls, .httpStatus, .protocolViolation, .redirectRefused, .remoteChanged, .invalidURL,
            .unsupportedScheme,
        ]
        // A 407 is the proxy's: another mirror through the same proxy would get the same answer.
        return codes.contains(error.code) && error.status != 407
    }
}
