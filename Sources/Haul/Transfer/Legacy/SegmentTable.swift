import Synchronization

/// The ranges of a download fetched over several connections, and which connection fetches which.
///
/// A connection that has nothing left to fetch takes over half of the largest remaining range (never
/// leaving a piece smaller than `minimumSplit`), so a slow connection does not hold the download back
/// at the end; a range whose connection has made no progress for `stallTakeover` is taken over whole.
/// Ranges only ever shrink from the end, and every byte written belongs to the same validated version
/// of the file, so a connection that writes a little past a range that was just cut short is harmless.
final class SegmentTable: Sendable {
    struct Segment: Sendable, Equatable {
        var start: Int64
        /// One past the last byte.
        var end: Int64
        /// Bytes from `start` written to the file.
        var written: Int64
        /// Bytes from `start` known to be flushed (from the manifest; raised by durable checkpoints).
        var durable: Int64
        var owner: Int?
        var lastProgress: ContinuousClock.Instant = .now

        var position: Int64 { start + written }
        var remaining: Int64 { max(0, end - position) }
    }

    /// A range for one connection to fetch: bytes `from..<to` of segment `index`.
    struct Assignment: Sendable, Equatable {
        let index: Int
        let from: Int64
        let to: Int64
    }

    private struct State {
        var segments: [Segment]
        var failure: (any Error)?
        var connections = 0
    }

    /// Ranges start on multiples of this.
    static let boundary: Int64 = 65_536
    /// No range is cut shorter than this (at least ``boundary``).
    let minimumSplit: Int64
    let stallTakeover: Duration
    private let state: Mutex<State>

    init(_ segments: [Segment], minimumSplit: Int64, stallTakeover: Duration = .seconds(3)) {
        // Ranges are cut on 64 KiB boundaries: a smaller minimum could cut one to nothing.
        self.minimumSplit = max(Self.boundary, minimumSplit)
        self.stallTakeover = stallTakeover
        self.state = Mutex(State(segments: segments))
    }

    /// Cuts the rest of the first segment into `parts` ranges of equal length (on 64 KiB boundaries, none
    /// shorter than `minimumSplit`), left unowned for the connections to claim in order. The connections
    /// of a fresh download start with their final ranges, so each asks for exactly what it fetches,
    /// rather than halving the largest range once per connection, which leaves uneven ranges for a
    /// number of connections that is not a power of two and cuts short the early requests.
    func split(into parts: Int) {
        state.withLock { state in
            guard let first = state.segments.first, state.segments.count == 1 else { return }
            let count = Int64(max(1, min(parts, Int(first.remaining / minimumSplit))))
            guard count > 1 else { return }
            // Each range is at least `minimumSplit`, so at least one boundary long: the cuts, rounded
            // down to a boundary, stay in order and past the bytes already written.
            let length = first.remaining / count
            let bounds = (1..<count).map { (first.position + $0 * length) / Self.boundary * Self.boundary }
            state.segments[0].end = bounds[0]
            for (index, start) in bounds.enumerated() {
                let end = index + 1 < bounds.count ? bounds[index + 1] : first.end
                state.segments.append(Segment(start: start, end: end, written: 0, durable: 0, owner: nil))
            }
        }
    }

    /// Gives `worker` a range: an unowned unfinished segment (the earliest), else half of the largest
    /// remaining one, else the rest of a stalled one; `nil` when there is nothing left for it.
    func claim(worker: Int, now: ContinuousClock.Instant = .now) -> Assignment? {
        state.withLock { state -> Assignment? in
            guard state.failure == nil else { return nil }
            if let index = state.segments.indices.filter({
                state.segments[$0].owner == nil && state.segments[$0].remaining > 0
            }).min(by: { state.segments[$0].start < state.segments[$1].start }) {
                state.segments[index].owner = worker
                state.segments[index].lastProgress = now
                return Assignment(index: index, from: state.segments[index].position, to: state.segments[index].end)
            }
            guard
                let victim = state.segments.indices.filter({ state.segments[$0].remaining > 0 })
                    .max(by: { state.segments[$0].remaining < state.segments[$1].remaining })
            else { return nil }
            let segment = state.segments[victim]
            let split: Int64
            if segment.remaining >= 2 * minimumSplit {
                // Half of what is left, on a 64 KiB boundary.
                split = (segment.position + segment.remaining / 2) / Self.boundary * Self.boundary
            } else if now - segment.lastProgress >= stallTakeover {
                split = segment.position
            } else {
                return nil
            }
            guard split >= segment.position, split < segment.end else { return nil }
            state.segments[victim].end = split
            state.segments.append(
                Segment(start: split, end: segment.end, written: 0, durable: 0, owner: worker, lastProgress: now))
            return Assignment(index: state.segments.count - 1, from: split, to: segment.end)
        }
    }

    /// The current end of a segment: where its connection must stop.
    func end(of index: Int) -> Int64 { state.withLock { $0.segments[index].end } }

    /// `assignment` as it stands now: its range may have been cut short since it was claimed (the
    /// connection asks for what is still its own); `nil` when nothing of it is left.
    func current(_ assignment: Assignment) -> Assignment? {
        // Ranges only shrink from the end, so the segment's end is never past the one claimed.
        let end = end(of: assignment.index)
        guard end > assignment.from else { return nil }
        return Assignment(index: assignment.index, from: assignment.from, to: end)
    }

    /// Records bytes written up to `position`; returns whether the segment is complete.
    @discardableResult
    func advance(_ index: Int, to position: Int64, now: ContinuousClock.Instant = .now) -> Bool {
        state.withLock { state in
            let segment = state.segments[index]
            let reached = min(position, segment.end) - segment.start
            if reached > segment.written {
                state.segments[index].written = reached
                state.segments[index].lastProgress = now
            }
            return state.segments[index].remaining == 0
        }
    }

    /// Lets another connection continue a segment whose connection failed.
    func release(_ index: Int, worker: Int) {
        state.withLock { state in
            if state.segments[index].owner == worker { state.segments[index].owner = nil }
        }
    }

    /// Stops every connection: the first failure wins.
    func fail(_ error: any Error) {
        state.withLock { state in
            if state.failure == nil { state.failure = error }
        }
    }

    var failure: (any Error)? { state.withLock { $0.failure } }

    /// Counts a connection in; it is counted out by ``retire(_:)``.
    func join() { state.withLock { $0.connections += 1 } }

    /// A connection that keeps failing (a server allowing fewer connections than asked, say) leaves
    /// while others go on; returns false when it is the last one, whose failure ends the download.
    func retire(_ worker: Int) -> Bool {
        state.withLock { state in
            guard state.connections > 1 else { return false }
            state.connections -= 1
            for index in state.segments.indices where state.segments[index].owner == worker {
                state.segments[index].owner = nil
            }
            return true
        }
    }

    var segments: [Segment] { state.withLock { $0.segments } }

    var written: Int64 { state.withLock { $0.segments.reduce(0) { $0 + $1.written } } }

    var isComplete: Bool { state.withLock { $0.segments.allSatisfy { $0.remaining == 0 } } }

    /// Marks every segment's bytes up to `written` (as captured before a flush) durable.
    func markDurable(_ captured: [Segment]) {
        state.withLock { state in
            for (index, segment) in captured.enumerated() where index < state.segments.count {
                state.segments[index].durable = max(
                    state.segments[index].durable, min(segment.written, state.segments[index].written))
            }
        }
    }
}

extension SegmentTable.Segment {
    init(_ segment: Manifest.Segment, trusted: Int64, total: Int64) {
        let end = segment.end ?? total
        self.init(start: segment.start, end: end, written: trusted, durable: min(segment.durable, trusted), owner: nil)
    }

    var manifestSegment: Manifest.Segment {
        Manifest.Segment(start: start, end: end, written: written, durable: durable)
    }
}
