/// The ranges of one download and which connection fetches each: a plain value the transfer machine
/// owns and changes one event at a time.
///
/// A download with one range is written in order from its start; several ranges are written at
/// their own offsets. Ranges only shrink from their end, and every byte written belongs to the same
/// validated version of the file, so a connection that writes a little past a range that was just
/// cut short is harmless.
struct RangeTable: Equatable, Sendable {
    struct Segment: Equatable, Sendable {
        var start: Int64
        /// One past the last byte; ``RangeTable/unknownEnd`` while the file's length is not known.
        var end: Int64
        /// Bytes from `start` written to the file.
        var written: Int64
        /// Bytes from `start` known to be flushed to stable storage.
        var durable: Int64
        /// The connection fetching the range, if any.
        var owner: Int?
        /// When the range last made progress (or was last claimed).
        var lastProgress: Moment

        var position: Int64 { start + written }
        var remaining: Int64 { max(0, end - position) }
        var isComplete: Bool { remaining == 0 }
    }

    /// A range given to a connection: bytes `from..<to` of segment `segment`.
    struct Claim: Equatable, Sendable {
        let segment: Int
        let from: Int64
        let to: Int64
        /// The connection whose stalled range this claim took over, which must stop.
        var displaced: Int?
    }

    /// Ranges start on multiples of this.
    static let boundary: Int64 = 65_536
    /// The end of a file whose length is not known yet.
    static let unknownEnd = Int64.max

    /// No range is cut shorter than this (at least ``boundary``).
    let minimumSplit: Int64
    private(set) var segments: [Segment]

    init(_ segments: [Segment], minimumSplit: Int64) {
        // Ranges are cut on 64 KiB boundaries: a smaller minimum could cut one to nothing.
        self.minimumSplit = max(Self.boundary, minimumSplit)
        self.segments = segments
    }

    /// A file written in order from its start: one range.
    init(totalLength: Int64?, written: Int64, durable: Int64, minimumSplit: Int64, now: Moment) {
        self.init(
            [
                Segment(
                    start: 0, end: totalLength ?? Self.unknownEnd, written: written, durable: min(durable, written),
                    owner: nil, lastProgress: now)
            ], minimumSplit: minimumSplit)
    }

    var written: Int64 { segments.reduce(0) { $0 + $1.written } }
    var isComplete: Bool { segments.allSatisfy(\.isComplete) }
    /// Whether the ranges are still one, written in order from the start of the file.
    var isSingle: Bool { segments.count == 1 }
    var totalLength: Int64? { segments.map(\.end).max().flatMap { $0 == Self.unknownEnd ? nil : $0 } }

    /// Cuts the rest of a single range into `parts` ranges of equal length (on 64 KiB boundaries,
    /// none shorter than `minimumSplit`), left unowned for connections to claim in order. Returns
    /// whether it cut anything.
    @discardableResult
    mutating func split(into parts: Int, now: Moment) -> Bool {
        guard isSingle, let first = segments.first, first.end != Self.unknownEnd else { return false }
        let count = Int64(max(1, min(parts, Int(first.remaining / minimumSplit))))
        guard count > 1 else { return false }
        // Each range is at least `minimumSplit`, so at least one boundary long: the cuts, rounded
        // down to a boundary, stay in order and past the bytes already written.
        let length = first.remaining / count
        let bounds = (1..<count).map { (first.position + $0 * length) / Self.boundary * Self.boundary }
        segments[0].end = bounds[0]
        for (index, start) in bounds.enumerated() {
            let end = index + 1 < bounds.count ? bounds[index + 1] : first.end
            segments.append(Segment(start: start, end: end, written: 0, durable: 0, owner: nil, lastProgress: now))
        }
        return true
    }

    /// Gives `connection` a range: the earliest unowned unfinished one; else half of the largest
    /// remaining one; else the rest of a range whose connection has made no progress for
    /// `stallTakeover`. `nil` when there is nothing for it now.
    mutating func claim(connection: Int, now: Moment, stallTakeover: Duration) -> Claim? {
        if let index = segments.indices.filter({ segments[$0].owner == nil && !segments[$0].isComplete })
            .min(by: { segments[$0].start < segments[$1].start })
        {
            segments[index].owner = connection
            segments[index].lastProgress = now
            return Claim(segment: index, from: segments[index].position, to: segments[index].end)
        }
        let open = segments.indices.filter {
            !segments[$0].isComplete && segments[$0].end != Self.unknownEnd && segments[$0].owner != connection
        }
        let victim: Int
        let cut: Int64
        var displaced: Int?
        if let largest = open.max(by: { segments[$0].remaining < segments[$1].remaining }),
            segments[largest].remaining >= 2 * minimumSplit
        {
            // Half of what is left, on a 64 KiB boundary.
            victim = largest
            cut = (segments[largest].position + segments[largest].remaining / 2) / Self.boundary * Self.boundary
        } else if let stalled = open.filter({ now - segments[$0].lastProgress >= stallTakeover })
            .max(by: { segments[$0].remaining < segments[$1].remaining })
        {
            victim = stalled
            cut = segments[stalled].position
            displaced = segments[stalled].owner
        } else {
            return nil
        }
        let segment = segments[victim]
        guard cut >= segment.position, cut < segment.end else { return nil }
        segments[victim].end = cut
        segments.append(
            Segment(start: cut, end: segment.end, written: 0, durable: 0, owner: connection, lastProgress: now))
        return Claim(segment: segments.count - 1, from: cut, to: segment.end, displaced: displaced)
    }

    /// The unfinished range that starts where `index` ends, if any: the one an answer that goes on
    /// past the end of `index` would deliver next.
    func successor(of index: Int) -> Int? {
        let end = segments[index].end
        return segments.indices.first { segments[$0].start == end && !segments[$0].isComplete }
    }

    /// Gives range `index` to `connection`, which goes on into it from the range before; returns the
    /// connection that had it, if another.
    mutating func handOver(_ index: Int, to connection: Int, now: Moment) -> Int? {
        let previous = segments[index].owner
        segments[index].owner = connection
        segments[index].lastProgress = max(segments[index].lastProgress, now)
        return previous == connection ? nil : previous
    }

    /// Counts range `index` as making progress until `moment` (a rate limit holds its bytes back):
    /// no idle connection takes it over before then.
    mutating func hold(_ index: Int, until moment: Moment) {
        guard segments.indices.contains(index) else { return }
        segments[index].lastProgress = max(segments[index].lastProgress, moment)
    }

    /// Records bytes written up to `position`; returns whether the range is complete.
    @discardableResult
    mutating func advance(_ index: Int, to position: Int64, now: Moment) -> Bool {
        let reached = min(position, segments[index].end) - segments[index].start
        if reached > segments[index].written {
            segments[index].written = reached
            segments[index].lastProgress = max(segments[index].lastProgress, now)
        }
        return segments[index].isComplete
    }

    /// Forgets the bytes of range `index` from `position` on: they have to be fetched again.
    mutating func cut(_ index: Int, to position: Int64) {
        let kept = max(0, position - segments[index].start)
        segments[index].written = min(segments[index].written, kept)
        segments[index].durable = min(segments[index].durable, segments[index].written)
    }

    /// Fixes the end of a file whose length was not known: it ended at `length`.
    mutating func setLength(_ length: Int64) {
        for index in segments.indices where segments[index].end == Self.unknownEnd { segments[index].end = length }
    }

    /// Lets another connection continue range `index`.
    mutating func release(_ index: Int, from connection: Int) {
        if segments[index].owner == connection { segments[index].owner = nil }
    }

    /// Leaves every range to whoever claims it next (every connection has stopped).
    mutating func releaseAllOwners() {
        for index in segments.indices { segments[index].owner = nil }
    }

    /// Lets other connections continue every range of `connection`.
    mutating func releaseAll(of connection: Int) {
        for index in segments.indices where segments[index].owner == connection { segments[index].owner = nil }
    }

    /// The connection fetching range `index`.
    func owner(of index: Int) -> Int? { segments[index].owner }

    /// Marks every range's bytes up to `written` (as captured before a flush) durable.
    mutating func markDurable(_ captured: [Segment]) {
        for (index, segment) in captured.enumerated() where index < segments.count {
            segments[index].durable = max(segments[index].durable, min(segment.written, segments[index].written))
        }
    }

    /// The ranges as the manifest records them.
    var manifestSegments: [Manifest.Segment] {
        segments.map { segment in
            Manifest.Segment(
                start: segment.start, end: segment.end == Self.unknownEnd ? nil : segment.end,
                written: segment.written, durable: segment.durable)
        }
    }

    /// The ranges a manifest recorded, with what can be trusted of each.
    init(manifest segments: [Manifest.Segment], totalLength: Int64?, minimumSplit: Int64, now: Moment) {
        self.init(
            segments.map { segment in
                Segment(
                    start: segment.start, end: segment.end ?? totalLength ?? Self.unknownEnd, written: segment.written,
                    durable: min(segment.durable, segment.written), owner: nil, lastProgress: now)
            }, minimumSplit: minimumSplit)
    }
}
