import Haul
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One worker's lease on a queue in PostgreSQL: the worker is alive while the lease runs, renews it
/// while it works, and gives it back when it stops. A worker that dies (killed, cut off from the
/// database) stops renewing; once the lease has run out, another worker takes its downloads over
/// (``PostgreSQLQueueStore/takeOverExpiredWorkers(now:)``).
///
/// Fencing: every registration has a number of its own, which each commit of the worker names
/// (``QueueFence``), so a worker taken over from writes no record any more; and the worker itself
/// stops writing files (``isHeld``) a third of the lease before the lease runs out by its own
/// clock, so that nobody takes over a download while it still writes. Workers' clocks must agree
/// to within that third (10 s of a 30 s lease; NTP keeps them to milliseconds).
package final class FleetLease: QueueOwnership, QueueLease {
    /// The worker's name, as the records it owns carry it: `host.pid.n`.
    package let name: String
    /// How long a lease lasts without renewal, in seconds.
    package let duration: Double
    let store: PostgreSQLQueueStore
    private let clock: @Sendable () -> Double
    private struct State {
        var fence: Int64
        /// When the lease was last renewed, by this worker's clock.
        var renewedAt: Double
        var lost = false
    }
    private let state: Mutex<State>
    private static let serial = Mutex(0)

    /// Registers a new worker on `store`'s queue.
    ///
    /// - Parameters:
    ///   - duration: how long the lease lasts without a renewal (`--lease-time`).
    ///   - clock: now, in seconds since 1970; the system's clock unless a test gives its own.
    package init(
        store: PostgreSQLQueueStore, duration: Double = 30,
        clock: @escaping @Sendable () -> Double = { Date().timeIntervalSince1970 }
    ) throws {
        let host = ProcessInfo.processInfo.hostName
        let pid = Int(ProcessInfo.processInfo.processIdentifier)
        let serial = Self.serial.withLock { value -> Int in
            value += 1
            return value
        }
        let name = "\(host).\(pid).\(serial)"
        let now = clock()
        let fence = try store.registerWorker(name, duration: duration, now: now)
        self.name = name
        self.duration = duration
        self.store = store
        self.clock = clock
        self.state = Mutex(State(fence: fence, renewedAt: now))
    }

    /// The number of this registration.
    package var token: Int64 { state.withLock { $0.fence } }

    /// The fence a commit made now names (see ``QueueChanges/fence``).
    package func fence() -> QueueFence {
        let now = clock()
        return state.withLock { QueueFence(owner: name, token: $0.fence, now: now) }
    }

    /// Renews the lease; returns whether it still holds. A lease found taken over (or run out
    /// before the renewal came) is lost for good. A database that cannot be reached leaves the
    /// lease as it was: it holds until its time runs out.
    @discardableResult
    package func renew() -> Bool {
        let (fence, lost) = state.withLock { ($0.fence, $0.lost) }
        guard !lost else { return false }
        let now = clock()
        guard let renewed = try? store.renewWorker(name, fence: fence, duration: duration, now: now) else {
            return isHeld
        }
        return state.withLock { state in
            if renewed {
                state.renewedAt = max(state.renewedAt, now)
            } else {
                state.lost = true
            }
            return !state.lost
        }
    }

    /// Whether this worker may still write its downloads' files and records: the lease was not
    /// lost, and two thirds of it have not passed since the last renewal.
    package var isHeld: Bool {
        let now = clock()
        return state.withLock { !$0.lost && now < $0.renewedAt + duration * 2 / 3 }
    }

    /// Whether the worker `owner` holds a lease now (this one does while ``isHeld``).
    package func isAlive(_ owner: String) -> Bool {
        if owner == name { return isHeld }
        return (try? store.workerIsAlive(owner, now: clock())) ?? true
    }

    /// Registers again, with a new fence, once the lease was lost (see ``QueueLease/rejoin()``).
    package func rejoin() throws {
        // What this worker owned under its old registration goes back to the queue first: the
        // worker forgot it when the lease was lost.
        try store.takeOverExpiredWorkers(now: clock(), also: name)
        let now = clock()
        let fence = try store.registerWorker(name, duration: duration, now: now)
        state.withLock { $0 = State(fence: fence, renewedAt: now) }
    }

    /// How many live workers run downloads now (see ``QueueLease/downloadingWorkers()``).
    package func downloadingWorkers() throws -> Int {
        try store.downloadingWorkers(now: clock())
    }

    /// The fleet's total rate (see ``QueueLease/totalRate()``).
    package func totalRate() throws -> Int64?? { try store.setting("total_rate") }

    /// Sets the fleet's total rate (see ``QueueLease/setTotalRate(_:)``).
    package func setTotalRate(_ bytesPerSecond: Int64?) throws {
        try store.setSetting("total_rate", to: bytesPerSecond)
    }

    /// `worker NAME`.
    package func describe(_ owner: String) -> String { "worker \(owner)" }

    /// This lease.
    package var lease: (any QueueLease)? { self }

    /// Gives the lease back: from now on this worker reads as gone.
    package func release() {
        let fence = state.withLock { state -> Int64 in
            state.lost = true
            return state.fence
        }
        try? store.removeWorker(name, fence: fence)
    }

    /// Takes over from the workers whose lease ran out (see
    /// ``PostgreSQLQueueStore/takeOverExpiredWorkers(now:)``).
    @discardableResult
    package func takeOverExpired() throws -> [String] {
        try store.takeOverExpiredWorkers(now: clock())
    }
}
