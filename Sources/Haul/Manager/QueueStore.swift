/// Where a download queue keeps its records, so that the queue outlives the process and several
/// processes share it: what a ``DownloadManager`` needs from durable storage, in its own terms.
///
/// Every store gives the same guarantees, which the conformance suite of the tests checks:
/// - a record reads back as it was written, its request without its secrets (``DownloadRequest``'s
///   encoder leaves them out);
/// - IDs grow and are never given out again, not even after a record is deleted;
/// - the manager's writes never touch a record's ``StoredDownload/request``: another process may
///   have just written it, and only ``setRequest(_:for:ifOwnedBy:)`` and ``clearRequest(for:)``
///   change it;
/// - a ``QueueChanges`` is made all together or not at all, and stores opened on the same storage
///   (by other processes too) see each other's committed changes without losing any;
/// - every failure is a ``HaulError`` with code ``HaulError/Code/database``; storage found damaged
///   says so, and what to do.
///
/// The requirements are synchronous: the manager is an actor whose every step reads its memory,
/// writes the store and updates its memory, and relies on nothing else running on it in between.
package protocol QueueStore: Sendable {
    /// Every record, in ID order.
    func allDownloads() throws -> [StoredDownload]

    /// The record with this ID; `nil` when there is none (it was removed, or never added).
    func download(_ id: DownloadID) throws -> StoredDownload?

    /// Makes every change of `changes` in one transaction: all of them or, when one fails (an update
    /// of a record that is gone, a new record whose key is taken), none. Returns the IDs given to
    /// ``QueueChanges/inserts``, in their order.
    @discardableResult
    func commit(_ changes: QueueChanges) throws -> [DownloadID]

    /// Asks the manager `owner` (a ``ProcessClaim`` name) to do `request` with the download: sets
    /// the record's ``StoredDownload/request`` only while `owner` owns it. Returns whether it did.
    func setRequest(_ request: OwnerRequest, for id: DownloadID, ifOwnedBy owner: String) throws -> Bool

    /// Clears the download's ``StoredDownload/request``, once its owner has done it (or will not).
    func clearRequest(for id: DownloadID) throws

    /// The downloads `owner` owns that another process asked something of, in ID order.
    func pendingRequests(for owner: String) throws -> [(id: DownloadID, request: OwnerRequest)]

    // MARK: Reading a queue of any size

    /// At most `limit` records in `states` (any state when `nil`) whose ID is greater than `after`
    /// (from the first when `nil`), in ID order: a page that stays right while records are added or
    /// removed before it.
    func downloads(in states: Set<DownloadState>?, after: DownloadID?, limit: Int) throws -> [StoredDownload]

    /// At most `limit` records in `states` (any state when `nil`), in ID order, skipping the first
    /// `offset` of them.
    func downloads(in states: Set<DownloadState>?, offset: Int, limit: Int) throws -> [StoredDownload]

    /// At most `limit` records in `states`, in the order a queue starts them (higher priority
    /// first, then older), skipping the first `offset` of them. The records are sorted for each
    /// page: for lines of a moderate length (aria2's `tellWaiting`), not for paging a million.
    func downloadsInStartOrder(in states: Set<DownloadState>, offset: Int, limit: Int) throws -> [StoredDownload]

    /// How many records there are in each state, in one read; a state without records is absent.
    func counts() throws -> [DownloadState: Int]

    /// Per state: how many records, their bytes, the sum of their known totals and how many have
    /// none, in one read.
    func totals() throws -> [DownloadState: QueueTotals]

    /// The ID of the record added last that is still stored; `nil` when there is none.
    func newestID() throws -> DownloadID?

    /// The records with these IDs in `states` (any state when `nil`), in ID order; IDs without one
    /// are left out.
    func downloads(ids: [DownloadID], in states: Set<DownloadState>?) throws -> [StoredDownload]

    /// The records with these keys (``StoredDownload/key``), in ID order; keys without one are left out.
    func downloads(keys: [String]) throws -> [StoredDownload]

    /// The records of downloads into a directory (their keys begin with
    /// ``StoredDownload/directoryKeyPrefix``) that have learnt a file of `destinations`, in ID
    /// order. A download to a named file is not among them: its key names its file.
    func downloadsIntoDirectories(destinations: [String]) throws -> [StoredDownload]

    /// The record with this key (``StoredDownload/key``, unique); `nil` when there is none.
    func download(key: String) throws -> StoredDownload?

    /// A number that differs from an earlier one when, in between, something other than this store
    /// object committed a change to the storage (another process, another store opened on it);
    /// this store's own commits leave it as it is. `nil` when the store cannot tell: whoever
    /// asks must then read again what it read before.
    func othersChangeVersion() throws -> Int?

    /// The records whose file is `destination`, in ID order.
    func downloads(destination: String) throws -> [StoredDownload]

    /// At most `limit` queued records `owner` owns, in the order they start: higher priority first,
    /// then lower ID.
    func nextQueued(ownedBy owner: String, limit: Int) throws -> [StoredDownload]

    /// The owners records name (each once, in no particular order): few, since an owner is a live
    /// or dead manager.
    func owners() throws -> [String]

    /// At most `limit` records `owner` owns (ownerless ones when `nil`) in `states` (any state when
    /// `nil`), whose ID is greater than `after`, in ID order.
    func downloads(
        ownedBy owner: String?, in states: Set<DownloadState>?, after: DownloadID?, limit: Int
    ) throws -> [StoredDownload]

    /// Gives at most `limit` queued records nobody owns to `owner`, best first (higher priority,
    /// then lower ID), and returns them as they are now, in that order. Records another store is
    /// claiming at the same moment are passed over: two stores never get the same record. Each
    /// claimed record's ``StoredDownload/updatedAt`` is set to `now`.
    func claimQueued(for owner: String, limit: Int, now: Double) throws -> [StoredDownload]

    /// Gives every queued record that one of `owners` owns (or nobody, when `includingUnowned`) to
    /// `newOwner` (nobody when `nil`), in one transaction, without reading them; returns how many
    /// changed. Each changed record's ``StoredDownload/bytesPerSecond`` is cleared and its
    /// ``StoredDownload/updatedAt`` set to `now`.
    @discardableResult
    func reassignQueued(
        from owners: [String], includingUnowned: Bool, to newOwner: String?, now: Double
    ) throws -> Int

    /// Lets go of every record `owner` owns but those in `keeping` (nobody owns them afterwards),
    /// in one transaction; returns how many changed. ``StoredDownload/updatedAt`` is set to `now`.
    @discardableResult
    func release(ownedBy owner: String, keeping: Set<DownloadID>, now: Double) throws -> Int

    /// What the commits of every manager sharing the queue change, as they are made (each
    /// ``QueueNotice`` names its sender, the owner its ``QueueChanges/fence`` names); `nil` when the
    /// store cannot tell (SQLite). The stream goes on across lost connections (what was committed
    /// while it was cut off is not told) and ends when its reader stops reading.
    func notices() -> AsyncStream<QueueNotice>?
}

extension QueueStore {
    /// Cannot tell (see the requirement).
    package func othersChangeVersion() throws -> Int? { nil }

    /// The records with these IDs, in ID order; IDs without one are left out.
    package func downloads(ids: [DownloadID]) throws -> [StoredDownload] {
        try downloads(ids: ids, in: nil)
    }

    /// Adds `records` all together (or none, when one's key is taken) and returns their IDs in order.
    @discardableResult
    package func insert(_ records: [StoredDownload]) throws -> [DownloadID] {
        try commit(QueueChanges(inserts: records))
    }

    /// Writes every field of `records` but their ``StoredDownload/request``, all together; fails and
    /// writes none when one of them is gone.
    package func update(_ records: [StoredDownload]) throws {
        try commit(QueueChanges(updates: records))
    }

    /// Deletes the download's record; one that is gone already is no error.
    package func delete(_ id: DownloadID) throws {
        try commit(QueueChanges(deletes: [id]))
    }
}

/// What a ``QueueStore`` sums over the records of one state (``QueueStore/totals()``).
package struct QueueTotals: Sendable, Equatable {
    /// How many records.
    package var count = 0
    /// Their ``StoredDownload/bytes`` together.
    package var bytes: Int64 = 0
    /// Their known ``StoredDownload/totalBytes`` together.
    package var totalBytes: Int64 = 0
    /// How many have no ``StoredDownload/totalBytes``.
    package var unknownTotals = 0

    /// Totals with these values (none, unless given).
    package init(count: Int = 0, bytes: Int64 = 0, totalBytes: Int64 = 0, unknownTotals: Int = 0) {
        self.count = count
        self.bytes = bytes
        self.totalBytes = totalBytes
        self.unknownTotals = unknownTotals
    }
}

/// Changes a ``QueueStore`` makes in one transaction (``QueueStore/commit(_:)``), in this order:
/// ``updatesIfPresent``, ``updates``, ``inserts``, ``deletes``. A record in both update lists ends
/// as ``updates`` has it.
///
/// The changes are a value, not a closure run inside the transaction: the manager decides
/// everything first (which file is in the way, which download is queued again), so a transaction
/// holds the storage only as long as it takes to write, and a store that talks to a server
/// sends them in one go.
package struct QueueChanges: Sendable {
    /// Records written only when they are still stored (changes that waited to be written while
    /// the download was removed). An update writes every field but ``StoredDownload/request``.
    package var updatesIfPresent: [StoredDownload] = []
    /// Records written (every field but ``StoredDownload/request``); one that is gone fails the
    /// transaction.
    package var updates: [StoredDownload] = []
    /// New records, their ``StoredDownload/id`` ignored; a key already taken fails the transaction.
    package var inserts: [StoredDownload] = []
    /// Records to delete; one that is gone already is no error.
    package var deletes: [DownloadID] = []
    /// The lease the changes are made under, when the store keeps leases (a fleet's): the
    /// transaction first checks that it still holds, and makes none of the changes when it does not.
    package var fence: QueueFence?

    /// Changes with the given parts (each empty unless given).
    package init(
        updatesIfPresent: [StoredDownload] = [], updates: [StoredDownload] = [], inserts: [StoredDownload] = [],
        deletes: [DownloadID] = [], fence: QueueFence? = nil
    ) {
        self.updatesIfPresent = updatesIfPresent
        self.updates = updates
        self.inserts = inserts
        self.deletes = deletes
        self.fence = fence
    }

    /// Whether there is nothing to do (a fence alone is nothing).
    package var isEmpty: Bool { updatesIfPresent.isEmpty && updates.isEmpty && inserts.isEmpty && deletes.isEmpty }
}

/// A worker's lease as a commit names it (``QueueChanges/fence``): the worker, the number its
/// registration was given, and the time by the worker's clock. A store that keeps leases refuses the
/// commit, with ``HaulError/Code/locked``, when that worker's lease has another number or ran out by
/// then: another worker may have taken its downloads over.
package struct QueueFence: Sendable, Equatable {
    /// The worker (the owner name its records carry).
    package var owner: String
    /// The number of its registration.
    package var token: Int64
    /// Now, by the worker's clock, in seconds since 1970.
    package var now: Double

    /// A fence of `owner`'s registration `token` at `now`.
    package init(owner: String, token: Int64, now: Double) {
        self.owner = owner
        self.token = token
        self.now = now
    }
}
