import Dispatch
import Haul
import Synchronization

/// Places on remote hosts shared by a fleet's workers through their queue in PostgreSQL (see
/// ``SharedHostSlots``): a worker takes a row of `haul_host_slot` for each request to a host, at
/// most `limit` rows per host over all workers, and its rows go with its registration when it dies.
///
/// A place given back stays the worker's for ``linger`` (longer than the downloader keeps an idle
/// connection open), so that its connection has closed before another worker may open one; a
/// request of the worker to the same host meanwhile takes it again at once, without the database.
/// While none is free, a request asks again every ``pollInterval``.
package final class PostgreSQLHostSlots: SharedHostSlots {
    /// The most connections to one host over every worker.
    package let limit: Int
    /// How long the worker's downloader keeps an idle connection open.
    package let idleTimeout: Duration
    /// How long a place given back is kept before it goes back to the database.
    package let linger: Duration
    /// How often a request that waits for a place asks again.
    package let pollInterval: Duration
    private let store: PostgreSQLQueueStore
    private let lease: FleetLease

    private struct Kept {
        let host: String
        let slot: Int
        let since: ContinuousClock.Instant
        /// The worker's registration it was taken under: one that lost its lease has no place left.
        let token: Int64
    }

    /// Places given back and kept a while, oldest first.
    private let kept = Mutex<[Kept]>([])
    private let sweeper = Mutex<Task<Void, Never>?>(nil)

    /// Places of `lease`'s worker in `store`'s queue, at most `limit` per host over every worker.
    /// A place given back is kept `idleTimeout` and `margin` more: the margin covers a downloader
    /// too busy to close its idle connection on time.
    package init(
        store: PostgreSQLQueueStore, lease: FleetLease, limit: Int, idleTimeout: Duration = .seconds(1),
        margin: Duration = .seconds(2), pollInterval: Duration = .milliseconds(100)
    ) {
        self.store = store
        self.lease = lease
        self.limit = max(1, limit)
        self.idleTimeout = idleTimeout
        self.linger = idleTimeout + margin
        self.pollInterval = pollInterval
    }

    deinit { sweeper.withLock { $0?.cancel() } }

    /// Runs a blocking call to the database on a thread of Dispatch's, not on one of the few the
    /// downloads' tasks share: a database that is slow to answer holds up no download.
    private static func offThread<Value: Sendable>(_ work: @escaping @Sendable () -> Value) async -> Value {
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(returning: work()) }
        }
    }

    /// Takes a place on `host`: one this worker kept, else a free one of the database's, asking
    /// again every ``pollInterval`` while there is none.
    package func take(_ host: String, waiting: () -> Void) async throws -> Int {
        var told = false
        while true {
            try Task.checkCancellation()
            let token = lease.token
            let reused = kept.withLock { kept -> Int? in
                guard let index = kept.lastIndex(where: { $0.host == host && $0.token == token }) else { return nil }
                return kept.remove(at: index).slot
            }
            if let reused { return reused }
            let (store, limit, name) = (self.store, self.limit, lease.name)
            if let slot = await Self.offThread({
                try? store.takeHostSlot(host, limit: limit, worker: name, fence: token)
            }) {
                return slot
            }
            if !told {
                told = true
                waiting()
            }
            try await Task.sleep(for: pollInterval)
        }
    }

    /// Keeps place `slot` on `host` for ``linger``, then gives it back to the database.
    package func give(_ host: String, _ slot: Int) {
        let token = lease.token
        kept.withLock { $0.append(Kept(host: host, slot: slot, since: .now, token: token)) }
        sweeper.withLock { sweeper in
            guard sweeper == nil else { return }
            // Sends back what was kept long enough, as long as anything is kept.
            sweeper = Task { [weak self] in
                while let self, await self.sweep() {}
            }
        }
    }

    /// Gives back to the database the places kept for ``linger``; returns whether any is still
    /// kept (the sweeper then goes on), after waiting for the next to be due.
    private func sweep() async -> Bool {
        let now = ContinuousClock.now
        let due = kept.withLock { kept -> [Kept] in
            let due = kept.filter { now - $0.since >= linger }
            kept.removeAll { now - $0.since >= linger }
            return due
        }
        // Those of an older registration went with it.
        let current = due.filter { $0.token == lease.token }
        let (store, name) = (self.store, lease.name)
        let places = current.map { ($0.host, $0.slot) }
        if !current.isEmpty, await Self.offThread({ (try? store.giveHostSlots(places, worker: name)) == nil }) {
            // The database is out of reach: they are given back a second later.
            kept.withLock { $0 = current + $0 }
            try? await Task.sleep(for: .seconds(1))
            return true
        }
        let next = kept.withLock { kept -> ContinuousClock.Instant? in
            guard let oldest = kept.map(\.since).min() else { return nil }
            return oldest + linger
        }
        guard let next else {
            // Nothing kept: the next give starts another sweeper, unless one was given meanwhile.
            return sweeper.withLock { sweeper in
                if kept.withLock({ $0.isEmpty }) {
                    sweeper = nil
                    return false
                }
                return true
            }
        }
        try? await Task.sleep(until: max(next, ContinuousClock.now + .milliseconds(20)))
        return true
    }
}
