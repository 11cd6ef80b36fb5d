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

    /// Whether ranges come from every mirror.
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

    /// Why a mirror's accepted answer to a range cannot be mixed with the others' bytes, if so.
    func mirrorRefusal(_ head: ResponseHead) -> String? {
        guard case .mixed(let digests) = mirrorUse, !digests.isEmpty else { return nil }
        let theirs = ResourceValidator(headers: head.headers).digests
        if digests.contains(where: { theirs.contains($0) }) { return nil }
        return theirs.isEmpty
            ? "it sends no Repr-Digest, so nothing shows it holds the same file"
            : "its Repr-Digest differs: it serves another version"
    }

    /// The next source to fetch the file from when the one in use fails with `error` and the mirrors
    /// are not mixed, if there is one and the error is about the server.
    func nextSource(for error: HaulError) -> Int? {
        guard hasMirrors, !isMixing, Self.isAboutTheServer(error) else { return nil }
        return nextActiveSource
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
