/// When a download stores its progress, and the checkpoint being stored: progress is stored every
/// `interval` while bytes arrive, durably (the data flushed first) every `durableInterval`, one
/// checkpoint at a time.
struct CheckpointSchedule: Sendable {
    /// A checkpoint being stored.
    enum InFlight: Sendable {
        /// Without a flush: it makes no byte durable.
        case quick
        /// After a flush: the ranges as they stood when it was taken are durable once it is stored.
        case durable([RangeTable.Segment])
    }

    /// How often progress is stored.
    private let interval: Duration
    /// How often progress is stored durably.
    private let durableInterval: Duration
    /// The checkpoint being stored, if one is.
    private(set) var inFlight: InFlight?
    /// Whether written bytes are not in a stored checkpoint yet.
    private(set) var hasUnsavedProgress = false
    /// When the last checkpoint was taken.
    private(set) var last: Moment
    /// When the last durable checkpoint was taken.
    private(set) var lastDurable: Moment

    /// A schedule that starts counting at `now`.
    init(interval: Duration, durableInterval: Duration, now: Moment) {
        self.interval = interval
        self.durableInterval = durableInterval
        self.last = now
        self.lastDurable = now
    }

    /// Whether progress waits to be stored and no checkpoint is in flight.
    var isWanted: Bool { hasUnsavedProgress && inFlight == nil }

    /// When the next checkpoint is due, if one is wanted.
    var nextDue: Moment? { isWanted ? last + interval : nil }

    /// Bytes were written.
    mutating func noteProgress() { hasUnsavedProgress = true }

    /// What was written so far is not to be stored (the file starts anew, or is gone).
    mutating func forgetProgress() { hasUnsavedProgress = false }

    /// Takes a checkpoint of `segments` if one is wanted and due at `now`, or at once with `force`.
    /// Returns whether it is durable, or `nil` when none is taken.
    mutating func takeIfDue(_ segments: [RangeTable.Segment], now: Moment, force: Bool) -> Bool? {
        guard isWanted, force || now - last >= interval else { return nil }
        let durable = now - lastDurable >= durableInterval
        inFlight = durable ? .durable(segments) : .quick
        last = now
        if durable { lastDurable = now }
        hasUnsavedProgress = false
        return durable
    }

    /// Takes the last checkpoint of a download that stops, of `segments`, whatever is due.
    mutating func takeLast(_ segments: [RangeTable.Segment], durable: Bool) {
        inFlight = durable ? .durable(segments) : .quick
    }

    /// The checkpoint in flight is stored: returns the ranges it makes durable, if it was durable.
    mutating func stored() -> [RangeTable.Segment]? {
        defer { inFlight = nil }
        guard case .durable(let segments) = inFlight else { return nil }
        return segments
    }
}
