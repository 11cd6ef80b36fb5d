/// Who a manager is among the managers sharing its queue, and which of the others are alive: the
/// name it writes into the records it owns, and how it tells a live owner from a gone one.
///
/// Managers of one machine are processes, told alive by a lock (``ProcessClaim``); the workers of
/// a fleet share a queue in PostgreSQL and are alive while their lease runs (``lease``).
package protocol QueueOwnership: Sendable {
    /// The name this manager writes into the `owner` of the records it owns.
    var name: String { get }
    /// Whether the manager named `owner` still runs (this one does).
    func isAlive(_ owner: String) -> Bool
    /// Gives the claim up: from now on this manager reads as gone.
    func release()
    /// How a message names the manager `owner`, after "another haul process": `pid 1234`.
    func describe(_ owner: String) -> String
    /// The lease of a fleet's worker; `nil` for a process of one machine.
    var lease: (any QueueLease)? { get }
}

/// A fleet worker's lease on its queue (see ``QueueOwnership/lease``). A worker runs only what it
/// claimed from the queue, renews the lease while it works, writes nothing once the lease may have
/// run out, and takes over the downloads of workers whose lease did.
package protocol QueueLease: Sendable {
    /// How long the lease lasts without a renewal, in seconds.
    var duration: Double { get }
    /// Whether this worker may still write its downloads' files and records.
    var isHeld: Bool { get }
    /// Renews the lease; returns whether it still holds (a lost lease is lost for good).
    func renew() -> Bool
    /// The fence of a commit made now (``QueueChanges/fence``).
    func fence() -> QueueFence
    /// Gives the downloads of workers whose lease ran out back to the queue; returns those workers.
    func takeOverExpired() throws -> [String]
    /// Registers again after the lease was lost, with a new fence: what the worker owned before
    /// is the queue's (or another worker's) by now.
    func rejoin() throws
    /// How many live workers run downloads now, this one included when it does: the fleet's total
    /// rate is shared out among them.
    func downloadingWorkers() throws -> Int
    /// The fleet's total rate in bytes per second: `nil` when no worker ever set one, `.some(nil)`
    /// when it is set to none.
    func totalRate() throws -> Int64??
    /// Sets the fleet's total rate (none when `nil`), for every worker to follow.
    func setTotalRate(_ bytesPerSecond: Int64?) throws
}
