import Synchronization

/// Gives up on exchanges that have not ended a timeout after they began. One task, asleep on the
/// transfer clock until the earliest deadline, watches them all, where a timer of each exchange's own
/// would cost a task, a sleep and a cancellation apiece: the price of a small file.
///
/// The task runs only while something is watched: it ends when it wakes to find nothing, and the
/// next exchange starts another.
final class StallWatch: Sendable {
    private struct Watched {
        let deadline: Moment
        let abort: @Sendable () -> Void
    }

    private struct State {
        var watched: [Int: Watched] = [:]
        var lastTicket = 0
        var watcher: Task<Void, Never>?
        var stopped = false
    }

    /// How long an exchange may take.
    let timeout: Duration
    private let clock: TransferClock
    private let state = Mutex(State())

    init(timeout: Duration, clock: TransferClock) {
        self.timeout = timeout
        self.clock = clock
    }

    /// Watches an exchange that begins now: `abort` runs, once, on the watching task if the exchange
    /// has not ended (``end(_:)``) within the timeout. Returns the ticket that ends the watch. After
    /// ``stop()`` nothing new is watched.
    func begin(abort: @escaping @Sendable () -> Void) -> Int {
        let deadline = clock.now + timeout
        return state.withLock { state in
            state.lastTicket += 1
            guard !state.stopped else { return state.lastTicket }
            state.watched[state.lastTicket] = Watched(deadline: deadline, abort: abort)
            if state.watcher == nil { state.watcher = Task { await self.watch() } }
            return state.lastTicket
        }
    }

    /// The exchange of `ticket` ended: it is no longer watched.
    func end(_ ticket: Int) {
        state.withLock { _ = $0.watched.removeValue(forKey: ticket) }
    }

    /// How many exchanges are watched.
    var count: Int { state.withLock { $0.watched.count } }

    /// Watches no exchange that begins from now on; those watched already are until they end or
    /// stall. The watching task ends once none is left.
    func stop() {
        let idle = state.withLock { state -> Task<Void, Never>? in
            state.stopped = true
            guard state.watched.isEmpty else { return nil }
            defer { state.watcher = nil }
            return state.watcher
        }
        idle?.cancel()
    }

    /// Sleeps until the earliest deadline, aborts the exchanges it passed, and again, until nothing
    /// is watched.
    private func watch() async {
        while true {
            let earliest = state.withLock { state -> Moment? in
                guard let earliest = state.watched.values.lazy.map(\.deadline).min() else {
                    state.watcher = nil
                    return nil
                }
                return earliest
            }
            guard let earliest else { return }
            do {
                try await clock.sleep(until: earliest)
            } catch {
                return
            }
            let now = clock.now
            let due = state.withLock { state -> [@Sendable () -> Void] in
                let passed = state.watched.filter { $0.value.deadline <= now }
                for ticket in passed.keys { state.watched[ticket] = nil }
                return passed.values.map(\.abort)
            }
            for abort in due { abort() }
        }
    }
}
