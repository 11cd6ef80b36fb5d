/// How many connections a download may use now: all it is allowed at once when the caller asked
/// for a number, else one at first and more only while they add throughput.
///
/// Adaptive ramping measures the download's rate over a window, doubles the connections, waits until
/// the new ones deliver (a request's round trip, a TCP slow start; at most a window), measures again,
/// and keeps the step only when the rate rose by at least half of what the added connections would
/// add at the old rate per connection; then it goes on doubling up to the maximum. (Half, because a
/// local disk or CPU that is the real bottleneck still lets two connections look up to a third faster
/// for the first second, and then runs slower with them.) Where one connection is the bottleneck (a
/// per-connection limit, a long or lossy path) each step nearly doubles the rate and the download
/// reaches its maximum within a few windows. Where it is not (a fast local server, a shared
/// bottleneck, a disk that slows down with writes in several places) the step does not pay, and the
/// download goes back to the connections it had before.
struct ConnectionRamp: Sendable {
    private enum Stage: Equatable, Sendable {
        /// Waiting for the first bytes before measuring.
        case idle
        /// Measuring the rate with the current connections, since `since` when `bytes` were written.
        case measuring(since: Moment, bytes: Int64)
        /// Letting newly added connections start before measuring.
        case settling(until: Moment)
        /// No more connections will be added.
        case done
    }

    /// The most connections the download may use.
    let maximum: Int
    /// The connections the download may use now.
    private(set) var allowed: Int
    let window: Duration
    private var stage: Stage
    /// The rate measured before the last increase, in bytes per second, and the connections then.
    private var before: (rate: Double, connections: Int)?

    /// - Parameters:
    ///   - adaptive: start with one connection and add more while they help; otherwise use all at once.
    init(maximum: Int, adaptive: Bool, window: Duration = .milliseconds(500)) {
        self.maximum = max(1, maximum)
        self.window = window
        let ramps = adaptive && self.maximum > 1
        allowed = ramps ? 1 : self.maximum
        stage = ramps ? .idle : .done
    }

    /// Whether connections may still be added.
    var isRamping: Bool { stage != .done }

    /// Starts measuring, once the first connection delivers; `bytes` is the download's written count.
    mutating func begin(at now: Moment, bytes: Int64) {
        guard stage == .idle else { return }
        stage = .measuring(since: now, bytes: bytes)
    }

    /// Stops adding connections (the file is about to be complete, or cannot be split further).
    mutating func stop() { stage = .done }

    /// Every connection allowed now delivers: measure from here rather than wait out the settling window.
    mutating func settled(at now: Moment, bytes: Int64) {
        guard case .settling = stage else { return }
        stage = .measuring(since: now, bytes: bytes)
    }

    /// Whether the ramp waits for newly added connections to deliver.
    var isSettling: Bool {
        if case .settling = stage { true } else { false }
    }

    /// When ``update(now:bytes:)`` has something to decide next.
    var nextDecision: Moment? {
        switch stage {
        case .measuring(let since, _): since + window
        case .settling(let until): until
        case .idle, .done: nil
        }
    }

    /// A change of the connections allowed, with the rates that decided it (bytes per second).
    enum Step: Equatable, Sendable {
        /// More connections: the rate rose with the last step (or this is the first).
        case up(to: Int, rate: Double)
        /// Back to fewer: `more` connections gave `rate`, no better than `before` with `to`.
        case back(to: Int, from: Int, rate: Double, before: Double)
    }

    /// Moves the ramp on; returns the change of the allowed connections, if any.
    mutating func update(now: Moment, bytes: Int64) -> Step? {
        switch stage {
        case .idle, .done:
            return nil
        case .settling(let until):
            if now >= until { stage = .measuring(since: now, bytes: bytes) }
            return nil
        case .measuring(let since, let start):
            guard now - since >= window else { return nil }
            let rate = Double(bytes - start) / (now - since).seconds
            if let before {
                let added = Double(allowed - before.connections) / Double(before.connections)
                guard rate >= before.rate * (1 + 0.5 * added) else {
                    // The last step did not pay: back to the connections the download had before it.
                    let more = allowed
                    allowed = before.connections
                    stage = .done
                    return .back(to: allowed, from: more, rate: rate, before: before.rate)
                }
            }
            guard allowed < maximum else {
                stage = .done
                return nil
            }
            before = (rate, allowed)
            allowed = min(maximum, allowed * 2)
            // Even the last step is measured: it is kept only if it pays.
            stage = .settling(until: now + window)
            return .up(to: allowed, rate: rate)
        }
    }
}
