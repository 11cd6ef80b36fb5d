import Synchronization

/// A clock that moves only when a test moves it, so rules about time (retry delays, stalls,
/// take-overs, rates) are checked in milliseconds of real time and without depending on how fast the
/// machine is. Sleepers wake, in deadline order, as soon as ``advance(by:)`` passes their deadline.
final class ManualClock: Clock, Sendable {
    struct Instant: InstantProtocol, CustomStringConvertible {
        let offset: Duration

        func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        func duration(to other: Instant) -> Duration { other.offset - offset }
        static func < (left: Instant, right: Instant) -> Bool { left.offset < right.offset }

        var description: String { "\(offset)" }
    }

    private struct Sleeper {
        let id: Int
        let deadline: Instant
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now = Instant(offset: .zero)
        var sleepers: [Sleeper] = []
        var nextID = 0
        /// Every deadline a sleeper asked for, in order.
        var requested: [Duration] = []
    }

    private let state = Mutex(State())

    var now: Instant { state.withLock { $0.now } }
    var minimumResolution: Duration { .zero }

    /// How many tasks are sleeping on the clock now.
    var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    /// The time each sleep asked for, measured from when it started, in order.
    var requestedSleeps: [Duration] { state.withLock { $0.requested } }

    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        try Task.checkCancellation()
        let id = state.withLock { state -> Int? in
            state.requested.append(deadline.offset - state.now.offset)
            guard deadline > state.now else { return nil }
            state.nextID += 1
            return state.nextID
        }
        guard let id else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                let wakeNow = state.withLock { state -> Bool in
                    if Task.isCancelled { return true }
                    state.sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                    return false
                }
                if wakeNow { continuation.resume(throwing: CancellationError()) }
            }
        } onCancel: {
            let cancelled = state.withLock { state -> Sleeper? in
                guard let index = state.sleepers.firstIndex(where: { $0.id == id }) else { return nil }
                return state.sleepers.remove(at: index)
            }
            cancelled?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Moves the clock forward and wakes every sleeper whose deadline has come, earliest first.
    func advance(by duration: Duration) {
        let woken = state.withLock { state -> [Sleeper] in
            state.now = state.now.advanced(by: duration)
            let now = state.now
            let due = state.sleepers.filter { $0.deadline <= now }.sorted { $0.deadline < $1.deadline }
            state.sleepers.removeAll { $0.deadline <= now }
            return due
        }
        for sleeper in woken { sleeper.continuation.resume() }
    }

    /// Waits (in real time, briefly) until a task sleeps on the clock until `offset` from its start.
    func waitForSleep(until offset: Duration, timeout: Duration = .seconds(10)) async throws {
        let start = ContinuousClock.now
        while !state.withLock({ $0.sleepers.contains { $0.deadline.offset == offset } }) {
            guard ContinuousClock.now - start < timeout else {
                throw TestFailure("nothing sleeps until \(offset) on the manual clock after \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(1))
        }
    }

    /// Waits (in real time, briefly) until at least `count` tasks sleep on the clock.
    func waitForSleepers(_ count: Int = 1, timeout: Duration = .seconds(10)) async throws {
        let start = ContinuousClock.now
        while sleeperCount < count {
            guard ContinuousClock.now - start < timeout else {
                throw TestFailure("no \(count) sleepers on the manual clock after \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(1))
        }
    }
}
