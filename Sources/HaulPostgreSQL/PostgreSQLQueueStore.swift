import Haul
import NIOCore
import NIOPosix
import PostgresNIO

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A download queue in a PostgreSQL database: the ``QueueStore`` several haul daemons, on one
/// machine or many, share.
///
/// It keeps what the SQLite store keeps, in the same shape (see ``PostgreSQLSchema``), and gives
/// the same guarantees, which the store conformance suite checks on both. A commit is one
/// transaction of a few statements whatever its size: the records of each part travel as one JSON
/// parameter, which the server unpacks (`jsonb_to_recordset`). Transactions that meet another in a
/// deadlock or a serialization failure are run again, a few times.
package final class PostgreSQLQueueStore: QueueStore {
    /// Where the queue lives (its ``PostgreSQLLocation/description`` holds no password).
    package let location: PostgreSQLLocation
    private let connector: PostgreSQLConnector

    /// Connects to the database at `location` and brings its tables up to date (creating them in an
    /// empty database). Fails with ``HaulError/Code/database`` when the server cannot be reached or
    /// refuses. A statement waits for the server at most `statementTimeout`, connecting and
    /// signing in at most `connectTimeout`.
    ///
    /// `migrating: false` opens it to read only: nothing is created or changed, and a database
    /// whose queue is not at this haul's version is refused.
    package init(
        location: PostgreSQLLocation, statementTimeout: TimeAmount = .seconds(30),
        connectTimeout: TimeAmount = .seconds(10), migrating: Bool = true
    ) throws {
        self.location = location
        self.connector = PostgreSQLConnector(
            location: location, statementTimeout: statementTimeout, connectTimeout: connectTimeout)
        try run("cannot open the queue database") { session in
            if migrating { try PostgreSQLSchema.migrate(session) } else { try PostgreSQLSchema.check(session) }
        }
    }

    /// The columns a record is read from, in the order ``record(_:)`` reads them.
    private static let columns =
        "id, key, definition, destination, priority, state, error_code, error_message, error_status, bytes, "
        + "total_bytes, bytes_per_second, owner, request, hook, created_at, started_at, finished_at, updated_at"

    /// The columns the manager writes: every one but `id` and `request` (see ``QueueStore``).
    private static let managed = [
        "key", "definition", "destination", "priority", "state", "error_code", "error_message", "error_status",
        "bytes", "total_bytes", "bytes_per_second", "owner", "hook", "created_at", "started_at", "finished_at",
        "updated_at",
    ]

    /// The shape of the JSON records of a commit's statement, as `jsonb_to_recordset` reads them.
    private static let recordShape =
        "n integer, id bigint, key text, definition text, destination text, priority integer, state text, "
        + "error_code text, error_message text, error_status integer, bytes bigint, total_bytes bigint, "
        + "bytes_per_second double precision, owner text, hook text, created_at double precision, "
        + "started_at double precision, finished_at double precision, updated_at double precision"

    // MARK: The queue's records

    package func allDownloads() throws -> [StoredDownload] {
        try records("SELECT \(Self.columns) FROM download ORDER BY id")
    }

    package func download(_ id: DownloadID) throws -> StoredDownload? {
        try records("SELECT \(Self.columns) FROM download WHERE id = $1", binding: id.rawValue).first
    }

    package func commit(_ changes: QueueChanges) throws -> [DownloadID] {
        guard !changes.isEmpty || changes.fence != nil else { return [] }
        // Each list once per record, the last of its changes winning, as the SQLite store's
        // statements one after another would leave it.
        let updatesIfPresent = Self.lastOfEach(changes.updatesIfPresent)
        let updates = Self.lastOfEach(changes.updates)
        let inserts = try Self.json(changes.inserts)
        let present = try Self.json(updatesIfPresent)
        let required = try Self.json(updates)
        let touched = (updatesIfPresent + updates).compactMap(\.id) + changes.deletes.map(\.rawValue)
        let fence = changes.fence
        return try transaction("could not update the queue database") { session in
            if let fence { try Self.check(fence, session) }
            // The rows this transaction changes, locked in ID order (two commits never wait on
            // each other in a circle), with the state each has now.
            var states: [Int64: String] = [:]
            if !touched.isEmpty {
                for row in try session.query(
                    "SELECT id, state FROM download WHERE id = ANY($1) ORDER BY id FOR UPDATE",
                    Self.binds(Array(Set(touched))))
                {
                    let (id, state) = try row.decode((Int64, String).self)
                    states[id] = state
                }
            }
            var deltas: [String: Int] = [:]
            func moved(_ records: [StoredDownload]) {
                for record in records {
                    guard let id = record.id, let old = states[id] else { continue }
                    if old != record.state.rawValue {
                        deltas[old, default: 0] -= 1
                        deltas[record.state.rawValue, default: 0] += 1
                    }
                    states[id] = record.state.rawValue
                }
            }
            if let present {
                try session.query(Self.updateSQL, Self.binds(present))
                moved(updatesIfPresent)
            }
            if let required {
                if let gone = updates.first(where: { $0.id.map { states[$0] == nil } ?? true }) {
                    throw HaulError(
                        .database,
                        "could not update download \(gone.downloadID): not found in the queue (removed meanwhile)")
                }
                try session.query(Self.updateSQL, Self.binds(required))
                moved(updates)
            }
            var ids: [DownloadID] = []
            if let inserts {
                let columns = Self.managed.joined(separator: ", ")
                let returned = try session.query(
                    """
                    INSERT INTO download (\(columns))
                    SELECT \(columns) FROM jsonb_to_recordset($1::jsonb) AS u(\(Self.recordShape)) ORDER BY n
                    RETURNING id
                    """, Self.binds(inserts))
                // IDs come from a sequence in the order of the rows: sorted, they are in the order given.
                ids = try returned.map { DownloadID(try $0.decode(Int64.self)) }.sorted()
                for record in changes.inserts { deltas[record.state.rawValue, default: 0] += 1 }
            }
            var removed: [DownloadID] = []
            if !changes.deletes.isEmpty {
                for row in try session.query(
                    "DELETE FROM download WHERE id = ANY($1) RETURNING id", Self.binds(changes.deletes.map(\.rawValue)))
                {
                    let id = try row.decode(Int64.self)
                    if let state = states[id] { deltas[state, default: 0] -= 1 }
                    removed.append(DownloadID(id))
                }
            }
            try Self.count(deltas, session)
            // The other workers hear of it once it is committed (`NOTIFY` waits for the commit).
            let changed = Set((updatesIfPresent + updates).compactMap(\.id)).filter { states[$0] != nil }
            try Self.notify(
                QueueNotice(
                    sender: fence?.owner ?? "", added: ids, changed: changed.sorted().map(DownloadID.init),
                    removed: removed.sorted { $0.rawValue < $1.rawValue }), session)
            return ids
        }
    }

    /// The channel commits are told on (see ``notices()``).
    static let noticeChannel = "haul_queue"

    /// Tells every listening worker `notice`, once the transaction of `session` commits (`NOTIFY`
    /// waits for it); nothing for a notice of no IDs.
    private static func notify(_ notice: QueueNotice, _ session: PostgreSQLSession) throws {
        let payloads = notice.payloads
        guard !payloads.isEmpty else { return }
        try session.query("SELECT pg_notify('\(noticeChannel)', p) FROM unnest($1::text[]) AS p", binds(payloads))
    }

    /// What every worker's commits change, as PostgreSQL tells it (`LISTEN`) on a connection of
    /// its own, made again a second after it is lost.
    package func notices() -> AsyncStream<QueueNotice>? {
        let (stream, continuation) = AsyncStream<QueueNotice>.makeStream()
        let connector = self.connector
        let listening = Task {
            while !Task.isCancelled {
                do {
                    let connection = try await connector.connection()
                    do {
                        try await connection.listen(on: Self.noticeChannel) { notifications in
                            for try await notification in notifications {
                                if let notice = QueueNotice(payload: notification.payload) {
                                    continuation.yield(notice)
                                }
                            }
                        }
                    } catch {
                        // Lost: made again below.
                    }
                    try? await connection.close()
                } catch {
                    // The server cannot be reached: tried again below.
                }
                try? await Task.sleep(for: .seconds(1))
            }
            continuation.finish()
        }
        continuation.onTermination = { _ in listening.cancel() }
        return stream
    }

    /// The statement that writes the managed columns of the records of a JSON list.
    private static let updateSQL =
        "UPDATE download AS d SET " + managed.map { "\($0) = u.\($0)" }.joined(separator: ", ")
        + " FROM jsonb_to_recordset($1::jsonb) AS u(\(recordShape)) WHERE d.id = u.id"

    package func setRequest(_ request: OwnerRequest, for id: DownloadID, ifOwnedBy owner: String) throws -> Bool {
        var binds = PostgresBindings()
        binds.append(request.rawValue)
        binds.append(id.rawValue)
        binds.append(owner)
        let result = try run("could not update the queue database") { session in
            try session.query("UPDATE download SET request = $1 WHERE id = $2 AND owner = $3", binds)
        }
        return (result.metadata.rows ?? 0) > 0
    }

    package func clearRequest(for id: DownloadID) throws {
        _ = try run("could not update the queue database") { session in
            try session.query("UPDATE download SET request = NULL WHERE id = $1", Self.binds(id.rawValue))
        }
    }

    package func pendingRequests(for owner: String) throws -> [(id: DownloadID, request: OwnerRequest)] {
        let result = try run("could not read the queue database") { session in
            try session.query(
                "SELECT id, request FROM download WHERE owner = $1 AND request IS NOT NULL ORDER BY id",
                Self.binds(owner))
        }
        return try result.compactMap { row in
            let (id, request) = try row.decode((Int64, String).self)
            return OwnerRequest(rawValue: request).map { (DownloadID(id), $0) }
        }
    }

    // MARK: Reading a queue of any size

    package func downloads(in states: Set<DownloadState>?, after: DownloadID?, limit: Int) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        var binds = Self.stateBinds(states)
        binds.append(after?.rawValue ?? 0)
        binds.append(Int64(limit))
        return try records(
            "SELECT \(Self.columns) FROM download WHERE \(Self.stateCondition) AND id > $2 ORDER BY id LIMIT $3",
            binds)
    }

    package func downloads(in states: Set<DownloadState>?, offset: Int, limit: Int) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        var binds = Self.stateBinds(states)
        binds.append(Int64(max(0, offset)))
        binds.append(Int64(limit))
        return try records(
            "SELECT \(Self.columns) FROM download WHERE \(Self.stateCondition) ORDER BY id OFFSET $2 LIMIT $3", binds)
    }

    package func downloadsInStartOrder(in states: Set<DownloadState>, offset: Int, limit: Int) throws
        -> [StoredDownload]
    {
        guard limit > 0 else { return [] }
        var binds = Self.stateBinds(states)
        binds.append(Int64(max(0, offset)))
        binds.append(Int64(limit))
        return try records(
            "SELECT \(Self.columns) FROM download WHERE \(Self.stateCondition) ORDER BY priority DESC, id OFFSET $2 LIMIT $3",
            binds)
    }

    package func counts() throws -> [DownloadState: Int] {
        let result = try run("could not read the queue database") { session in
            try session.query("SELECT state, n FROM download_count WHERE n > 0")
        }
        var counts: [DownloadState: Int] = [:]
        for row in result {
            let (state, count) = try row.decode((String, Int64).self)
            if let state = DownloadState(rawValue: state) { counts[state] = Int(count) }
        }
        return counts
    }

    package func totals() throws -> [DownloadState: QueueTotals] {
        let result = try run("could not read the queue database") { session in
            try session.query(
                """
                SELECT state, count(*), coalesce(sum(bytes), 0)::bigint, coalesce(sum(total_bytes), 0)::bigint,
                    count(*) - count(total_bytes)
                FROM download GROUP BY state
                """)
        }
        var totals: [DownloadState: QueueTotals] = [:]
        for row in result {
            let (state, count, bytes, totalBytes, unknown) = try row.decode((String, Int64, Int64, Int64, Int64).self)
            guard let state = DownloadState(rawValue: state) else { continue }
            totals[state] = QueueTotals(
                count: Int(count), bytes: bytes, totalBytes: totalBytes, unknownTotals: Int(unknown))
        }
        return totals
    }

    package func newestID() throws -> DownloadID? {
        let result = try run("could not read the queue database") { session in
            try session.query("SELECT max(id) FROM download")
        }
        return try result.first?.decode(Int64?.self).map(DownloadID.init)
    }

    package func downloads(ids: [DownloadID], in states: Set<DownloadState>?) throws -> [StoredDownload] {
        guard !ids.isEmpty else { return [] }
        var binds = Self.stateBinds(states)
        binds.append(ids.map(\.rawValue))
        return try records(
            "SELECT \(Self.columns) FROM download WHERE \(Self.stateCondition) AND id = ANY($2) ORDER BY id", binds)
    }

    package func downloads(keys: [String]) throws -> [StoredDownload] {
        guard !keys.isEmpty else { return [] }
        return try records("SELECT \(Self.columns) FROM download WHERE key = ANY($1) ORDER BY id", binding: keys)
    }

    package func downloadsIntoDirectories(destinations: [String]) throws -> [StoredDownload] {
        guard !destinations.isEmpty else { return [] }
        return try records(
            """
            SELECT \(Self.columns) FROM download
            WHERE destination = ANY($1) AND key LIKE '\(StoredDownload.directoryKeyPrefix)%' ORDER BY id
            """, binding: destinations)
    }

    package func download(key: String) throws -> StoredDownload? {
        try records("SELECT \(Self.columns) FROM download WHERE key = $1", binding: key).first
    }

    package func downloads(destination: String) throws -> [StoredDownload] {
        try records("SELECT \(Self.columns) FROM download WHERE destination = $1 ORDER BY id", binding: destination)
    }

    package func nextQueued(ownedBy owner: String, limit: Int) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        var binds = PostgresBindings()
        binds.append(owner)
        binds.append(Int64(limit))
        return try records(
            """
            SELECT \(Self.columns) FROM download WHERE owner = $1 AND state = 'queued'
            ORDER BY priority DESC, id LIMIT $2
            """, binds)
    }

    package func owners() throws -> [String] {
        let result = try run("could not read the queue database") { session in
            try session.query("SELECT DISTINCT owner FROM download WHERE owner IS NOT NULL")
        }
        return try result.map { try $0.decode(String.self) }
    }

    package func downloads(
        ownedBy owner: String?, in states: Set<DownloadState>?, after: DownloadID?, limit: Int
    ) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        var binds = Self.stateBinds(states)
        binds.append(after?.rawValue ?? 0)
        binds.append(Int64(limit))
        binds.append(owner)
        return try records(
            """
            SELECT \(Self.columns) FROM download
            WHERE owner IS NOT DISTINCT FROM $4 AND \(Self.stateCondition) AND id > $2 ORDER BY id LIMIT $3
            """, binds)
    }

    package func claimQueued(for owner: String, limit: Int, now: Double) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        var binds = PostgresBindings()
        binds.append(owner)
        binds.append(now)
        binds.append(Int64(limit))
        let result = try transaction("could not update the queue database") { session in
            // Rows another worker is claiming now are locked, and skipped rather than waited for.
            try session.query(
                """
                UPDATE download SET owner = $1, updated_at = $2 WHERE id IN (
                    SELECT id FROM download WHERE owner IS NULL AND state = 'queued'
                    ORDER BY priority DESC, id LIMIT $3 FOR UPDATE SKIP LOCKED)
                RETURNING \(Self.columns)
                """, binds)
        }
        return try result.map(Self.record).sorted {
            ($0.priority, -($0.id ?? 0)) > ($1.priority, -($1.id ?? 0))
        }
    }

    package func reassignQueued(
        from owners: [String], includingUnowned: Bool, to newOwner: String?, now: Double
    ) throws -> Int {
        guard !owners.isEmpty || includingUnowned else { return 0 }
        var binds = PostgresBindings()
        binds.append(newOwner)
        binds.append(now)
        binds.append(owners)
        binds.append(includingUnowned)
        let result = try transaction("could not update the queue database") { session in
            try session.query(
                """
                UPDATE download SET owner = $1, bytes_per_second = NULL, updated_at = $2
                WHERE state = 'queued' AND (owner = ANY($3) OR ($4 AND owner IS NULL))
                    AND owner IS DISTINCT FROM $1
                """, binds)
        }
        return result.metadata.rows ?? 0
    }

    package func release(ownedBy owner: String, keeping: Set<DownloadID>, now: Double) throws -> Int {
        var binds = PostgresBindings()
        binds.append(now)
        binds.append(owner)
        binds.append(keeping.map(\.rawValue))
        let result = try transaction("could not update the queue database") { session in
            try session.query(
                "UPDATE download SET owner = NULL, updated_at = $1 WHERE owner = $2 AND NOT (id = ANY($3))", binds)
        }
        return result.metadata.rows ?? 0
    }

    // MARK: Workers and their leases

    /// Registers the worker `name` (this process, on this host) with a lease until
    /// `now + duration` and returns the number of this registration (its fence). A registration of that name still there is replaced.
    package func registerWorker(_ name: String, duration: Double, now: Double) throws -> Int64 {
        var binds = PostgresBindings()
        binds.append(name)
        binds.append(now + duration)
        binds.append(ProcessInfo.processInfo.hostName)
        binds.append(ProcessInfo.processInfo.processIdentifier)
        binds.append(now)
        let result = try run("could not register with the queue database") { session in
            try session.query(
                """
                INSERT INTO haul_worker (name, fence, expires_at, host, pid, started_at)
                VALUES ($1, nextval('haul_worker_fence'), $2, $3, $4, $5)
                ON CONFLICT (name) DO UPDATE SET fence = excluded.fence, expires_at = excluded.expires_at,
                    host = excluded.host, pid = excluded.pid, started_at = excluded.started_at
                RETURNING fence
                """, binds)
        }
        guard let fence = try result.first?.decode(Int64.self) else {
            throw HaulError(.database, "the queue database \(location) gave no number to the worker \(name)")
        }
        return fence
    }

    /// Moves the end of the worker's lease to `now + duration`, while the registration `fence` is
    /// still the worker's and its lease has not run out; returns whether it did (when not, the lease
    /// is lost for good: another worker may have taken its downloads).
    package func renewWorker(_ name: String, fence: Int64, duration: Double, now: Double) throws -> Bool {
        var binds = PostgresBindings()
        binds.append(now + duration)
        binds.append(name)
        binds.append(fence)
        binds.append(now)
        let result = try run("could not renew the lease in the queue database") { session in
            try session.query(
                "UPDATE haul_worker SET expires_at = $1 WHERE name = $2 AND fence = $3 AND expires_at > $4", binds)
        }
        return (result.metadata.rows ?? 0) > 0
    }

    /// Whether the worker `name` holds a lease at `now`.
    package func workerIsAlive(_ name: String, now: Double) throws -> Bool {
        var binds = PostgresBindings()
        binds.append(name)
        binds.append(now)
        let result = try run("could not read the queue database") { session in
            try session.query("SELECT 1 FROM haul_worker WHERE name = $1 AND expires_at > $2", binds)
        }
        return !result.rows.isEmpty
    }

    /// The setting `name` of the fleet: `nil` when none was ever set, `.some(nil)` when it was set
    /// to none.
    package func setting(_ name: String) throws -> Int64?? {
        let result = try run("could not read the queue database") { session in
            try session.query("SELECT value FROM haul_setting WHERE name = $1", Self.binds(name))
        }
        guard let row = result.first else { return nil }
        return .some(try row.decode(Int64?.self))
    }

    /// Sets the fleet's setting `name` (to none when `nil`).
    package func setSetting(_ name: String, to value: Int64?) throws {
        var binds = PostgresBindings()
        binds.append(name)
        binds.append(value)
        _ = try run("could not update the queue database") { session in
            try session.query(
                """
                INSERT INTO haul_setting (name, value) VALUES ($1, $2)
                ON CONFLICT (name) DO UPDATE SET value = excluded.value
                """, binds)
        }
    }

    /// How many workers whose lease runs at `now` own a running download.
    package func downloadingWorkers(now: Double) throws -> Int {
        let result = try run("could not read the queue database") { session in
            try session.query(
                """
                SELECT count(DISTINCT d.owner) FROM download AS d JOIN haul_worker AS w ON w.name = d.owner
                WHERE d.state = 'running' AND w.expires_at > $1
                """, Self.binds(now))
        }
        return Int(try result.first?.decode(Int64.self) ?? 0)
    }

    /// The workers registered now, by name, with the end of their lease and where they run.
    package func workers() throws -> [(name: String, expiresAt: Double, host: String, pid: Int)] {
        let result = try run("could not read the queue database") { session in
            try session.query("SELECT name, expires_at, host, pid FROM haul_worker ORDER BY name")
        }
        return try result.map { row in
            let (name, expires, host, pid) = try row.decode((String, Double, String, Int32).self)
            return (name, expires, host, Int(pid))
        }
    }

    /// Ends the registration `fence` of the worker `name` (a worker that stops).
    package func removeWorker(_ name: String, fence: Int64) throws {
        var binds = PostgresBindings()
        binds.append(name)
        binds.append(fence)
        _ = try run("could not update the queue database") { session in
            try session.query("DELETE FROM haul_worker WHERE name = $1 AND fence = $2", binds)
        }
    }

    /// Takes the first free place of the `limit` places on `host` for the worker `worker`, while its
    /// registration `fence` is still the worker's; `nil` when none is free (or another worker took the
    /// one this saw free at the same moment).
    package func takeHostSlot(_ host: String, limit: Int, worker: String, fence: Int64) throws -> Int? {
        var binds = PostgresBindings()
        binds.append(host)
        binds.append(worker)
        binds.append(Int32(max(1, limit)))
        binds.append(fence)
        let result = try run("could not update the queue database") { session in
            try session.query(
                """
                INSERT INTO haul_host_slot (host, slot, worker)
                SELECT $1, s, $2 FROM generate_series(0, $3 - 1) AS s
                WHERE EXISTS (SELECT 1 FROM haul_worker WHERE name = $2 AND fence = $4)
                    AND NOT EXISTS (SELECT 1 FROM haul_host_slot AS h WHERE h.host = $1 AND h.slot = s)
                ORDER BY s LIMIT 1
                ON CONFLICT DO NOTHING
                RETURNING slot
                """, binds)
        }
        return try result.first.map { Int(try $0.decode(Int32.self)) }
    }

    /// Gives back the worker's places `slots` (each a host and a place on it).
    package func giveHostSlots(_ slots: [(host: String, slot: Int)], worker: String) throws {
        guard !slots.isEmpty else { return }
        var binds = PostgresBindings()
        binds.append(worker)
        binds.append(slots.map(\.host))
        binds.append(slots.map { Int32($0.slot) })
        _ = try run("could not update the queue database") { session in
            try session.query(
                """
                DELETE FROM haul_host_slot
                WHERE worker = $1 AND (host, slot) IN (SELECT * FROM unnest($2::text[], $3::integer[]))
                """, binds)
        }
    }

    /// How many places on `host` are taken, by every worker.
    package func hostSlotsTaken(_ host: String) throws -> Int {
        let result = try run("could not read the queue database") { session in
            try session.query("SELECT count(*) FROM haul_host_slot WHERE host = $1", Self.binds(host))
        }
        return Int(try result.first?.decode(Int64.self) ?? 0)
    }

    /// Takes over from every worker whose lease ran out by `now`: ends its registration (its later
    /// commits fail their fence), and gives every download it owned back to the queue, nobody's, a
    /// running one queued again, in one transaction. Returns the workers taken over from.
    ///
    /// `also`: a worker given up in any case (one that lost its lease and joins again: what it
    /// owned under its old registration is the queue's).
    @discardableResult
    package func takeOverExpiredWorkers(now: Double, also named: String? = nil) throws -> [String] {
        try transaction("could not update the queue database") { session in
            var binds = PostgresBindings()
            binds.append(now)
            binds.append(named)
            var gone = try session.query(
                "DELETE FROM haul_worker WHERE expires_at <= $1 OR name = $2 RETURNING name", binds
            ).map { try $0.decode(String.self) }
            if let named, !gone.contains(named) { gone.append(named) }
            guard !gone.isEmpty else { return [] }
            binds = PostgresBindings()
            binds.append(gone)
            binds.append(now)
            let row = try session.query(
                """
                WITH released AS (
                    UPDATE download AS d SET owner = NULL, bytes_per_second = NULL, updated_at = $2,
                        state = CASE WHEN d.state = 'running' THEN 'queued' ELSE d.state END
                    FROM (SELECT id, state AS old FROM download WHERE owner = ANY($1) ORDER BY id FOR UPDATE) AS o
                    WHERE d.id = o.id
                    RETURNING d.id, o.old)
                SELECT count(*) FILTER (WHERE old = 'running'), coalesce(array_agg(id ORDER BY id), '{}')
                FROM released
                """, binds
            ).first
            let (running, released): (Int64, [Int64]) = try row?.decode((Int64, [Int64]).self) ?? (0, [])
            try Self.count(["queued": Int(running), "running": -Int(running)], session)
            // Every worker hears of it, the one taking over too (which did not tell it itself).
            try Self.notify(QueueNotice(sender: "", changed: released.map(DownloadID.init)), session)
            return gone
        }
    }

    /// Adds `deltas` to the count of each state, in the transaction of the records' changes; the
    /// rows in the order of the states, so two transactions lock them in the same order.
    private static func count(_ deltas: [String: Int], _ session: PostgreSQLSession) throws {
        let changed = deltas.filter { $0.value != 0 }.sorted { $0.key < $1.key }
        guard !changed.isEmpty else { return }
        var binds = PostgresBindings()
        binds.append(changed.map(\.key))
        binds.append(changed.map { Int64($0.value) })
        try session.query(
            """
            INSERT INTO download_count (state, n) SELECT * FROM unnest($1::text[], $2::bigint[])
            ON CONFLICT (state) DO UPDATE SET n = download_count.n + excluded.n
            """, binds)
    }

    /// Fails the transaction with ``HaulError/Code/locked`` unless `fence`'s worker holds that
    /// registration and its lease at `fence.now`; the row stays locked until the transaction ends,
    /// so a take-over waits for it.
    private static func check(_ fence: QueueFence, _ session: PostgreSQLSession) throws {
        var binds = PostgresBindings()
        binds.append(fence.owner)
        binds.append(fence.token)
        binds.append(fence.now)
        let held = try session.query(
            "SELECT 1 FROM haul_worker WHERE name = $1 AND fence = $2 AND expires_at > $3 FOR SHARE", binds)
        guard held.rows.isEmpty else { return }
        throw HaulError(
            .locked,
            "this worker's lease on the queue (\(fence.owner), registration \(fence.token)) has run out or was "
                + "taken over: its downloads may run elsewhere now, so it writes nothing more")
    }

    // MARK: Statements

    /// The condition on `state` for the first parameter, an array of states or `NULL` for any.
    private static let stateCondition = "($1::text[] IS NULL OR state = ANY($1::text[]))"

    /// The first parameter of ``stateCondition``.
    private static func stateBinds(_ states: Set<DownloadState>?) -> PostgresBindings {
        var binds = PostgresBindings()
        binds.append(states.map { $0.map(\.rawValue).sorted() })
        return binds
    }

    /// Bindings of one value.
    private static func binds<Value: PostgresDynamicTypeEncodable>(_ value: Value) -> PostgresBindings {
        var binds = PostgresBindings()
        binds.append(value)
        return binds
    }

    /// The records a query reads.
    private func records(_ sql: String, _ binds: PostgresBindings = PostgresBindings()) throws -> [StoredDownload] {
        let result = try run("could not read the queue database") { session in try session.query(sql, binds) }
        return try result.map(Self.record)
    }

    private func records<Value: PostgresDynamicTypeEncodable>(_ sql: String, binding value: Value) throws
        -> [StoredDownload]
    {
        try records(sql, Self.binds(value))
    }

    /// A record from a row of ``columns``.
    private static func record(_ row: PostgresRow) throws -> StoredDownload {
        let cells = row.makeRandomAccess()
        let state = try cells["state"].decode(String.self)
        guard let downloadState = DownloadState(rawValue: state) else {
            throw HaulError(.database, "the queue database holds an unknown download state '\(state)'")
        }
        let requestName = try cells["request"].decode(String?.self)
        let request = requestName.flatMap(OwnerRequest.init(rawValue:))
        if let requestName, request == nil {
            throw HaulError(.database, "the queue database holds an unknown request '\(requestName)'")
        }
        return StoredDownload(
            id: try cells["id"].decode(Int64.self), key: try cells["key"].decode(String.self),
            definition: try StoredDownload.decodeDefinition(try cells["definition"].decode(String.self)),
            destination: try cells["destination"].decode(String?.self),
            priority: Int(try cells["priority"].decode(Int32.self)), state: downloadState,
            error: (
                try cells["error_code"].decode(String?.self), try cells["error_message"].decode(String?.self),
                try cells["error_status"].decode(Int32?.self).map(Int.init)
            ),
            bytes: try cells["bytes"].decode(Int64.self), totalBytes: try cells["total_bytes"].decode(Int64?.self),
            bytesPerSecond: try cells["bytes_per_second"].decode(Double?.self),
            owner: try cells["owner"].decode(String?.self), request: request,
            hook: try cells["hook"].decode(String?.self), createdAt: try cells["created_at"].decode(Double.self),
            startedAt: try cells["started_at"].decode(Double?.self),
            finishedAt: try cells["finished_at"].decode(Double?.self),
            updatedAt: try cells["updated_at"].decode(Double.self))
    }

    /// One record as a commit sends it (see ``recordShape``).
    private struct Sent: Encodable {
        let n: Int
        let id: Int64?
        let key: String
        let definition: String
        let destination: String?
        let priority: Int
        let state: String
        let errorCode: String?
        let errorMessage: String?
        let errorStatus: Int?
        let bytes: Int64
        let totalBytes: Int64?
        let bytesPerSecond: Double?
        let owner: String?
        let hook: String?
        let createdAt: Double
        let startedAt: Double?
        let finishedAt: Double?
        let updatedAt: Double

        enum CodingKeys: String, CodingKey {
            case n, id, key, definition, destination, priority, state, bytes, owner, hook
            case errorCode = "error_code", errorMessage = "error_message", errorStatus = "error_status"
            case totalBytes = "total_bytes", bytesPerSecond = "bytes_per_second", createdAt = "created_at"
            case startedAt = "started_at", finishedAt = "finished_at", updatedAt = "updated_at"
        }
    }

    /// `records` as one JSON array, `nil` when there are none.
    private static func json(_ records: [StoredDownload]) throws -> String? {
        guard !records.isEmpty else { return nil }
        let sent = records.enumerated().map { position, record in
            Sent(
                n: position, id: record.id, key: record.key,
                definition: StoredDownload.encodeDefinition(record.definition), destination: record.destination,
                priority: record.priority, state: record.state.rawValue, errorCode: record.errorCode,
                errorMessage: record.errorMessage, errorStatus: record.errorStatus, bytes: record.bytes,
                totalBytes: record.totalBytes, bytesPerSecond: record.bytesPerSecond, owner: record.owner,
                hook: record.hook, createdAt: record.createdAt, startedAt: record.startedAt,
                finishedAt: record.finishedAt, updatedAt: record.updatedAt)
        }
        return String(decoding: try JSONEncoder().encode(sent), as: UTF8.self)
    }

    /// The last change of each record in `records`, in the order of those last changes.
    private static func lastOfEach(_ records: [StoredDownload]) -> [StoredDownload] {
        var seen: Set<Int64> = []
        var kept: [StoredDownload] = []
        for record in records.reversed() {
            if let id = record.id, !seen.insert(id).inserted { continue }
            kept.append(record)
        }
        return kept.reversed()
    }

    // MARK: Sessions and errors

    /// Runs `body` with the connection, turning failures into ``HaulError/Code/database``. A
    /// connection found lost is made again and `body` run once more: every caller of this is a
    /// single statement or a transaction, which the server made all or nothing of.
    private func run<T>(_ doing: String, _ body: (PostgreSQLSession) throws -> T) throws -> T {
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try connector.withSession(body)
            } catch let error as HaulError {
                throw error
            } catch let error as PostgreSQLSession.CommitOutcomeUnknown {
                throw HaulError(
                    .database,
                    "\(doing) \(location): the connection was lost while a change was being committed, which may "
                        + "or may not have been made (\(Self.describe(error.underlying)))",
                    underlying: error.underlying)
            } catch let error where attempt < 2 && PostgreSQLSession.isLostConnection(error) {
                continue
            } catch {
                throw failure(error, doing: doing)
            }
        }
    }

    /// Runs `body` in one transaction; one that met another in a deadlock or a serialization
    /// failure is run again, up to five times.
    private func transaction<T>(_ doing: String, _ body: (PostgreSQLSession) throws -> T) throws -> T {
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try run(doing) { session in try session.transaction { try body(session) } }
            } catch let error as HaulError where attempt < 5 && Self.isContention(error.underlying) {
                continue
            }
        }
    }

    /// Whether the server gave up a transaction because of another one (deadlock, serialization).
    private static func isContention(_ error: (any Error)?) -> Bool {
        guard let error = error as? PSQLError, let state = error.serverInfo?[.sqlState] else { return false }
        return state == "40P01" || state == "40001"
    }

    /// A PostgreSQL failure as one line that names the queue (without its password) and says what
    /// went wrong; a schema that is not Haul's any more says it is damaged and what to do.
    private func failure(_ error: any Error, doing: String) -> HaulError {
        let reason = Self.describe(error)
        if let error = error as? PSQLError, let state = error.serverInfo?[.sqlState],
            ["42703", "42P01", "42804", "22P02", "23514"].contains(state)
                || error.code == .server && state.hasPrefix("XX")
        {
            return HaulError(
                .database,
                "the queue database \(location) is damaged (\(reason)): stop every haul using it, restore it from "
                    + "a backup, or drop its tables (download, download_count, haul_migration) and add the "
                    + "downloads again; their partial files resume from the manifests beside them",
                underlying: error)
        }
        if error is PostgresDecodingError {
            return HaulError(
                .database,
                "the queue database \(location) is damaged (a column holds a value of the wrong type): stop every "
                    + "haul using it, restore it from a backup, or drop its tables (download, download_count, "
                    + "haul_migration) and add the downloads again",
                underlying: error)
        }
        return HaulError(.database, "\(doing) \(location): \(reason)", underlying: error)
    }

    /// What went wrong, in one line: the server's message when it sent one.
    static func describe(_ error: any Error) -> String {
        if let error = error as? PSQLError {
            if let message = error.serverInfo?[.message] {
                let state = error.serverInfo?[.sqlState].map { " (SQLSTATE \($0))" } ?? ""
                return message + state
            }
            if let underlying = error.underlying { return describe(underlying) }
            return "\(error.code)"
        }
        if let error = error as? NIOConnectionError {
            let reasons = error.connectionErrors.map { describe($0.error) }
            return "cannot connect: " + (reasons.isEmpty ? "\(error)" : Set(reasons).sorted().joined(separator: "; "))
        }
        if let error = error as? IOError { return error.description.replacingOccurrences(of: " (error set)", with: "") }
        return "\(error)".split(whereSeparator: \.isNewline).joined(separator: " ")
    }
}
