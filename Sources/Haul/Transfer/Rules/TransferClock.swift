/// A point in time on a ``TransferClock``: the time since that clock was adopted. Time rules
/// (retry delays, stalls, take-overs, checkpoints, rates, progress) compare moments, so they can be
/// checked with any clock, including a test clock that moves only when told to.
package struct Moment: Comparable, Hashable, Sendable, CustomStringConvertible {
    /// The time since the clock's start.
    package let offset: Duration

    package init(_ offset: Duration) { self.offset = offset }

    package static let zero = Moment(.zero)

    package static func < (left: Moment, right: Moment) -> Bool { left.offset < right.offset }
    package static func + (moment: Moment, duration: Duration) -> Moment { Moment(moment.offset + duration) }
    package static func - (left: Moment, right: Moment) -> Duration { left.offset - right.offset }

    package var description: String { "\(offset)" }
}

/// The clock a downloader and a download manager read time from: the continuous clock unless the
/// caller gives another (a test clock, say). Wraps any `Clock` measured in `Duration`, so the
/// engine's rules see one concrete type of instant, ``Moment``.
package struct TransferClock: Sendable {
    private let base: any ClockBase

    package init<C: Clock>(_ clock: C) where C.Duration == Duration {
        base = ClockAdapter(clock)
    }

    /// The continuous clock: monotonic, and it keeps counting while the machine sleeps.
    package static let continuous = TransferClock(ContinuousClock())

    package var now: Moment { base.now }

    /// Suspends until `deadline`; throws `CancellationError` when the task is cancelled first.
    package func sleep(until deadline: Moment) async throws {
        try await base.sleep(until: deadline)
    }

    /// Suspends for `duration`; throws `CancellationError` when the task is cancelled first.
    package func sleep(for duration: Duration) async throws {
        try await base.sleep(until: now + duration)
    }
}

private protocol ClockBase: Sendable {
    var now: Moment { get }
    func sleep(until deadline: Moment) async throws
}

/// Measures a clock's instants from the one it showed when adopted.
private struct ClockAdapter<C: Clock>: ClockBase where C.Duration == Duration {
    let clock: C
    let start: C.Instant

    init(_ clock: C) {
        self.clock = clock
        self.start = clock.now
    }

    var now: Moment { Moment(start.duration(to: clock.now)) }

    func sleep(until deadline: Moment) async throws {
        try await clock.sleep(until: start.advanced(by: deadline.offset), tolerance: nil)
    }
}
