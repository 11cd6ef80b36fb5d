import GRDB
import GRDBSQLite

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The state database: a ``QueueStore`` in one SQLite file in WAL mode, shared safely by several
/// `haul` processes.
final class SQLiteQueueStore: QueueStore {
    /// The database file.
    let path: String
    /// The connections to it (a writer, and readers beside it).
    let database: DatabasePool

    /// Opens the database at `path`, creating it (its owner's alone) and bringing its tables up to
    /// date when needed.
    init(path: String) throws {
        self.path = path
        var configuration = Configuration()
        configuration.foreignKeysEnabled = true
        configuration.busyMode = .timeout(10)
        configuration.prepareDatabase { db in
            // In WAL mode NORMAL loses at most the last transactions on a power loss, never consistency;
            // the manager reconciles records with the files on disk when it opens.
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        do {
            // Opening switches a new database to WAL and runs the migrations; two processes doing that
            // at once can meet "database is locked" before SQLite's busy timeout applies. A lock file
            // makes them take turns (only for opening; afterwards SQLite's own locking is enough).
            let setup = try POSIX.open(path + ".open-lock", flags: O_RDWR | O_CREAT | O_NOFOLLOW, mode: 0o600)
            defer { POSIX.close(setup) }
            while flock(setup, LOCK_EX) != 0 && errno == EINTR {}
            defer { flock(setup, LOCK_UN) }
            // The database holds URLs and headers: its owner's alone. SQLite gives its -wal and -shm
            // files the database's mode; files an earlier version made are closed too.
            POSIX.close(try POSIX.open(path, flags: O_RDWR | O_CREAT | O_NOFOLLOW, mode: 0o600))
            for file in [path, path + "-wal", path + "-shm", path + ".open-lock"] {
                _ = file.withCString { chmod($0, 0o600) }
            }
            database = try DatabasePool(path: path, configuration: configuration)
            try Self.migrator.migrate(database)
        } catch let error as HaulError {
            throw error
        } catch {
            throw Self.failure(error, path: path, doing: "cannot open the state database")
        }
    }

    /// How a database of any earlier version becomes one of this version.
    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("1: downloads and their headers") { db in
            try db.create(table: "download") { table in
                table.autoIncrementedPrimaryKey("id")
                table.column("key", .text).notNull().unique()
                table.column("url", .text).notNull()
                table.column("directory", .text)
                table.column("destination", .text).indexed()
                table.column("overwrite", .boolean).notNull().defaults(to: false)
                table.column("checksum", .text)
                table.column("rateLimit", .integer).check { $0 > 0 }
                table.column("priority", .integer).notNull().defaults(to: 0)
                table.column("state", .text).notNull().indexed()
                    .check { DownloadState.allCases.map(\.rawValue).contains($0) }
                table.column("errorCode", .text)
                table.column("errorMessage", .text)
                table.column("errorStatus", .integer)
                table.column("bytes", .integer).notNull().defaults(to: 0).check { $0 >= 0 }
                table.column("totalBytes", .integer).check { $0 >= 0 }
                table.column("bytesPerSecond", .double)
                table.column("owner", .text)
                table.column("createdAt", .double).notNull()
                table.column("startedAt", .double)
                table.column("finishedAt", .double)
                table.column("updatedAt", .double).notNull()
                table.check(sql: "directory IS NOT NULL OR destination IS NOT NULL")
            }
            try db.create(table: "header") { table in
                table.column("downloadId", .integer).notNull()
                    .references("download", onDelete: .cascade)
                table.column("position", .integer).notNull()
                table.column("name", .text).notNull()
                table.column("value", .text).notNull()
                table.primaryKey(["downloadId", "position"])
            }
        }
        migrator.registerMigration("2: requests to the owning process") { db in
            try db.alter(table: "download") { table in
                table.add(column: "request", .text).check { OwnerRequest.allCases.map(\.rawValue).contains($0) }
            }
        }
        migrator.registerMigration("3: what the program run at a download's end said") { db in
            try db.alter(table: "download") { table in table.add(column: "hook", .text) }
        }
        migrator.registerMigration("4: a download's own connection count") { db in
            try db.alter(table: "download") { table in
                // The bounds as they were when this migration was written: a migration never changes.
                table.add(column: "connections", .integer).check { $0 >= 1 && $0 <= 64 }
            }
        }
        migrator.registerMigration("5: a download's mirrors") { db in
            // One URL per line; NULL: none.
            try db.alter(table: "download") { table in table.add(column: "mirrors", .text) }
        }
        migrator.registerMigration("6: one JSON description of each download") { db in
            try describeEachDownloadInJSON(db)
        }
        migrator.registerMigration("7: indexes for reading a queue of any size by pages") { db in
            // A narrow copy of the IDs with their state: skipping to a page's offset reads it
            // instead of whole records.
            try db.execute(sql: "CREATE INDEX download_on_id_state ON download (id, state)")
            // An owner's queued downloads in the order they start; an owner's downloads of a state.
            // Sums per state read this instead of whole records.
            try db.execute(sql: "CREATE INDEX download_on_state_bytes ON download (state, bytes, totalBytes)")
            try db.execute(
                sql: "CREATE INDEX download_on_owner_state_priority ON download (owner, state, priority DESC, id)")
        }
        migrator.registerMigration("8: the count of each state") { db in
            // Counting a million records per state took most of an API page's 60-76 ms. The store
            // keeps the counts in the transaction that changes the records (see ``commit(_:)``):
            // triggers would do the same, but give every write a statement journal in a temporary
            // file (17 writes a download).
            // A database of a build that kept the counts by triggers has the table and the triggers
            // already: the triggers go and the counts are taken again.
            try db.execute(
                sql: """
                    CREATE TABLE IF NOT EXISTS download_count (state TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
                    DROP TRIGGER IF EXISTS download_count_insert;
                    DROP TRIGGER IF EXISTS download_count_delete;
                    DROP TRIGGER IF EXISTS download_count_update;
                    DELETE FROM download_count;
                    INSERT INTO download_count (state, n) SELECT state, count(*) FROM download GROUP BY state;
                    """)
        }
        migrator.registerMigration("9: checks that need no temporary table") { db in
            try checkWithoutTemporaryTables(db)
        }
        migrator.registerMigration("10: fewer index entries for each download") { db in
            try indexLess(db)
        }
        return migrator
    }

    /// Migration 10: every new download was written into seven b-trees, and every change of one
    /// into five; an add of a million spent most of its writing time there. Two indexes go:
    /// - `download_on_state` and `download_on_state_bytes` become one, on `(state, id, bytes,
    ///   totalBytes)`: a page of one state in ID order, and the sums per state, read it alone.
    /// - `download_on_destination` keeps only the downloads into a directory (their key begins
    ///   with ``StoredDownload/directoryKeyPrefix``), the only ones looked up by file: a download
    ///   to a named file is found by its key, which holds the file.
    ///
    /// (Builds between 2f12625 and 16aad3e made migration 9 without the index on `state`: it is
    /// dropped only if it is there.)
    private static func indexLess(_ db: Database) throws {
        try db.execute(
            sql: """
                DROP INDEX IF EXISTS download_on_state;
                DROP INDEX IF EXISTS download_on_state_bytes;
                CREATE INDEX download_on_state_id ON download (state, id, bytes, totalBytes);
                DROP INDEX download_on_destination;
                CREATE INDEX download_on_destination ON download (destination) WHERE \(intoDirectory);
                """)
    }

    /// The condition of the downloads into a directory: a GLOB of a literal prefix is a range of
    /// the key index (its collation is BINARY), and the condition of the partial index on files.
    static let intoDirectory = "key GLOB '\(StoredDownload.directoryKeyPrefix)*'"

    /// Migration 9: the checks of `state` and `request` were `IN` lists, for which SQLite builds a
    /// temporary b-tree each time a row is written: a third of the time adding a hundred thousand
    /// downloads took. The same checks, written as comparisons, cost nothing. SQLite cannot change
    /// a check in place: the table is made anew, keeping every row, ID and the ID sequence, and
    /// its indexes with it. (The index on `state` alone stays, though `download_on_state_bytes`
    /// starts with it: a page of one state in ID order reads it, where the other needs a sort of
    /// every record of the state.)
    private static func checkWithoutTemporaryTables(_ db: Database) throws {
        func oneOf(_ column: String, _ values: [String]) -> String {
            "(" + values.map { "\"\(column)\" = '\($0)'" }.joined(separator: " OR ") + ")"
        }
        try db.create(table: "download9") { table in
            table.autoIncrementedPrimaryKey("id")
            table.column("key", .text).notNull().unique()
            table.column("definition", .jsonText).notNull()
            table.column("destination", .text)
            table.column("priority", .integer).notNull().defaults(to: 0)
            // The states and requests as they were when this migration was written.
            table.column("state", .text).notNull()
                .check(sql: oneOf("state", ["queued", "running", "paused", "completed", "failed", "cancelled"]))
            table.column("errorCode", .text)
            table.column("errorMessage", .text)
            table.column("errorStatus", .integer)
            table.column("bytes", .integer).notNull().defaults(to: 0).check { $0 >= 0 }
            table.column("totalBytes", .integer).check { $0 >= 0 }
            table.column("bytesPerSecond", .double)
            table.column("owner", .text)
            let requests = oneOf("request", ["pause", "cancel", "remove", "remove-files"])
            table.column("request", .text).check(sql: "\"request\" IS NULL OR " + requests)
            table.column("hook", .text)
            table.column("createdAt", .double).notNull()
            table.column("startedAt", .double)
            table.column("finishedAt", .double)
            table.column("updatedAt", .double).notNull()
        }
        let columns = [
            "id", "key", "definition", "destination", "priority", "state", "errorCode", "errorMessage", "errorStatus",
            "bytes", "totalBytes", "bytesPerSecond", "owner", "request", "hook", "createdAt", "startedAt",
            "finishedAt", "updatedAt",
        ].map { "\"\($0)\"" }.joined(separator: ", ")
        try db.execute(
            sql: """
                INSERT INTO download9 (\(columns)) SELECT \(columns) FROM download ORDER BY id;
                """)
        try replaceDownloadTable(with: "download9", db)
        try db.execute(
            sql: """
                CREATE INDEX download_on_destination ON download (destination);
                CREATE INDEX download_on_state ON download (state);
                CREATE INDEX download_on_id_state ON download (id, state);
                CREATE INDEX download_on_state_bytes ON download (state, bytes, totalBytes);
                CREATE INDEX download_on_owner_state_priority ON download (owner, state, priority DESC, id);
                """)
    }

    /// Migration 6: what was asked for moves from eight columns and the `header` table into one
    /// JSON column, `definition`, written by ``DownloadRequest``'s encoder (so a field added to a
    /// request needs no migration). SQLite cannot drop constrained columns: the table is made anew,
    /// keeping every ID and the ID sequence.
    private static func describeEachDownloadInJSON(_ db: Database) throws {
        try db.create(table: "download6") { table in
            table.autoIncrementedPrimaryKey("id")
            table.column("key", .text).notNull().unique()
            table.column("definition", .jsonText).notNull()
            table.column("destination", .text).indexed()
            table.column("priority", .integer).notNull().defaults(to: 0)
            table.column("state", .text).notNull().indexed()
                .check { ["queued", "running", "paused", "completed", "failed", "cancelled"].contains($0) }
            table.column("errorCode", .text)
            table.column("errorMessage", .text)
            table.column("errorStatus", .integer)
            table.column("bytes", .integer).notNull().defaults(to: 0).check { $0 >= 0 }
            table.column("totalBytes", .integer).check { $0 >= 0 }
            table.column("bytesPerSecond", .double)
            table.column("owner", .text)
            table.column("request", .text).check { ["pause", "cancel", "remove", "remove-files"].contains($0) }
            table.column("hook", .text)
            table.column("createdAt", .double).notNull()
            table.column("startedAt", .double)
            table.column("finishedAt", .double)
            table.column("updatedAt", .double).notNull()
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let rows = try Row.fetchCursor(db, sql: "SELECT * FROM download ORDER BY id")
        while let row = try rows.next() {
            let id: Int64 = row["id"]
            let headers = try Row.fetchAll(
                db, sql: "SELECT name, value FROM header WHERE downloadId = ? ORDER BY position", arguments: [id]
            ).map { (name: $0["name"] as String, value: $0["value"] as String) }
            let directory: String? = row["directory"]
            let destination: String? = row["destination"]
            let mirrorLines: String? = row["mirrors"]
            let request = DownloadRequest(
                url: row["url"], destination: directory.map { .directory($0) } ?? .file(destination ?? ""),
                headers: headers, overwrite: row["overwrite"],
                checksum: (row["checksum"] as String?).flatMap { try? Checksum(parsing: $0) },
                bytesPerSecondLimit: row["rateLimit"], connections: row["connections"],
                mirrors: mirrorLines.map { $0.split(separator: "\n").map(String.init) } ?? [])
            let definition = String(decoding: try encoder.encode(request), as: UTF8.self)
            try db.execute(
                sql: """
                    INSERT INTO download6 (id, key, definition, destination, priority, state, errorCode,
                        errorMessage, errorStatus, bytes, totalBytes, bytesPerSecond, owner, request, hook,
                        createdAt, startedAt, finishedAt, updatedAt)
                    SELECT id, key, ?, destination, priority, state, errorCode, errorMessage, errorStatus,
                        bytes, totalBytes, bytesPerSecond, owner, request, hook, createdAt, startedAt,
                        finishedAt, updatedAt
                    FROM download WHERE id = ?
                    """, arguments: [definition, id])
        }
        try db.drop(table: "header")
        try replaceDownloadTable(with: "download6", db)
    }

    /// The last step of a migration that makes the `download` table anew as `table`: `table`
    /// takes the ID sequence (IDs of removed downloads are not given out again), then the name.
    private static func replaceDownloadTable(with table: String, _ db: Database) throws {
        try db.execute(
            sql: """
                UPDATE sqlite_sequence
                SET seq = (SELECT max(seq) FROM sqlite_sequence WHERE name IN ('download', ?))
                WHERE name = ?;
                INSERT INTO sqlite_sequence (name, seq)
                SELECT ?, seq FROM sqlite_sequence
                WHERE name = 'download' AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = ?);
                """, arguments: [table, table, table, table])
        try db.drop(table: "download")
        try db.rename(table: table, to: "download")
    }

    // MARK: The queue's records

    /// Every record, in ID order (see ``QueueStore/allDownloads()``).
    func allDownloads() throws -> [StoredDownload] {
        try read { db in try StoredDownload.order(StoredDownload.Columns.id).fetchAll(db) }
    }

    /// The record with this ID, if any (see ``QueueStore/download(_:)``).
    func download(_ id: DownloadID) throws -> StoredDownload? {
        try read { db in try StoredDownload.fetchOne(db, key: id.rawValue) }
    }

    /// Makes `changes` in one write transaction (see ``QueueStore/commit(_:)``); records are
    /// written with GRDB's cached statements, so frequent progress writes build no SQL. The count of
    /// each state (`download_count`) changes in the same transaction.
    /// Managers of one machine do not tell each other what they change.
    func notices() -> AsyncStream<QueueNotice>? { nil }

    func commit(_ changes: QueueChanges) throws -> [DownloadID] {
        // Its owners are processes of one machine, told alive by their locks (ProcessClaim).
        guard changes.fence == nil else {
            throw HaulError(.database, "the SQLite queue keeps no leases: a fenced commit is for a PostgreSQL queue")
        }
        guard !changes.isEmpty else { return [] }
        return try write { db in
            // The state each changed record has now, kept up to date as it is written.
            let touched =
                (changes.updatesIfPresent + changes.updates).compactMap(\.id) + changes.deletes.map(\.rawValue)
            var stored = try Self.storedRows(of: touched, db)
            var counts = StateCounts()
            func update(_ record: StoredDownload) throws {
                // A record whose key and file are as stored leaves them, and their indexes, alone. Their
                // bytes are compared, as SQLite does: two spellings of one accented letter are equal
                // Swift strings, not the same path.
                let named = record.id.flatMap { stored[$0] }.map {
                    Self.sameBytes($0.key, record.key) && Self.sameBytes($0.destination, record.destination)
                }
                try record.updateManagedColumns(db, keepingKeyAndDestination: named ?? false)
                guard let id = record.id else { return }
                counts.move(from: stored[id]?.state, to: record.state.rawValue)
                stored[id] = (record.state.rawValue, record.key, record.destination)
            }
            for record in changes.updatesIfPresent {
                do {
                    try update(record)
                } catch is RecordError {
                    // Removed meanwhile: nothing left to update.
                }
            }
            for record in changes.updates { try update(record) }
            let ids = try StoredDownload.insertManagedColumns(of: changes.inserts, db)
            for record in changes.inserts { counts.add(record.state.rawValue, 1) }
            for id in changes.deletes where try StoredDownload.deleteOne(db, key: id.rawValue) {
                if let state = stored[id.rawValue]?.state { counts.add(state, -1) }
                stored[id.rawValue] = nil
            }
            try counts.store(db)
            return ids
        }
    }

    /// Changes to the count of each state, made by one transaction.
    private struct StateCounts {
        private var deltas: [String: Int] = [:]

        mutating func add(_ state: String, _ delta: Int) { deltas[state, default: 0] += delta }

        /// A record moved from one state to another (`nil`: it was not stored).
        mutating func move(from old: String?, to new: String) {
            guard let old, old != new else { return }
            add(old, -1)
            add(new, 1)
        }

        func store(_ db: Database) throws {
            for (state, delta) in deltas where delta != 0 {
                try db.cachedStatement(
                    sql: """
                        INSERT INTO download_count (state, n) VALUES (?, ?)
                        ON CONFLICT (state) DO UPDATE SET n = n + excluded.n
                        """
                ).execute(arguments: [state, delta])
            }
        }
    }

    /// The stored state, key and file of each of these records (those that exist).
    private static func storedRows(of ids: [Int64], _ db: Database) throws -> [Int64: StoredRow] {
        var rows: [Int64: StoredRow] = [:]
        try inLists(of: ids, db, { "SELECT id, state, key, destination FROM download WHERE id IN \($0)" }) {
            statement, arguments in
            for row in try Row.fetchAll(statement, arguments: arguments) {
                rows[row[0]] = (row[1], row[2], row[3])
            }
        }
        return rows
    }

    /// Whether two texts are the same bytes (both absent, or both present and byte for byte equal).
    private static func sameBytes(_ left: String?, _ right: String?) -> Bool {
        switch (left, right) {
        case (nil, nil): true
        case (let left?, let right?): left.utf8.elementsEqual(right.utf8)
        default: false
        }
    }

    /// What a commit reads of a record before it writes it: its state, for the counts; its key and
    /// file, which an update leaves alone when they are unchanged.
    private typealias StoredRow = (state: String, key: String, destination: String?)

    /// Sets the request while `owner` owns the download (see ``QueueStore/setRequest(_:for:ifOwnedBy:)``).
    func setRequest(_ request: OwnerRequest, for id: DownloadID, ifOwnedBy owner: String) throws -> Bool {
        try write { db in
            try db.cachedStatement(sql: "UPDATE download SET request = ? WHERE id = ? AND owner = ?")
                .execute(arguments: [request.rawValue, id.rawValue, owner])
            return db.changesCount > 0
        }
    }

    /// Clears the download's request (see ``QueueStore/clearRequest(for:)``).
    func clearRequest(for id: DownloadID) throws {
        try write { db in
            try db.cachedStatement(sql: "UPDATE download SET request = NULL WHERE id = ?")
                .execute(arguments: [id.rawValue])
        }
    }

    /// What was asked of `owner`'s downloads (see ``QueueStore/pendingRequests(for:)``).
    func pendingRequests(for owner: String) throws -> [(id: DownloadID, request: OwnerRequest)] {
        try read { db in
            try Row.fetchAll(
                db.cachedStatement(
                    sql: "SELECT id, request FROM download WHERE owner = ? AND request IS NOT NULL ORDER BY id"),
                arguments: [owner]
            ).compactMap { row in
                OwnerRequest(rawValue: row["request"] as String).map { (DownloadID(row["id"]), $0) }
            }
        }
    }

    // MARK: Reading a queue of any size

    /// The SQL condition on `state` for `states` (`1` when `nil`), and its arguments.
    private static func stateCondition(_ states: Set<DownloadState>?) -> (sql: String, arguments: StatementArguments) {
        guard let states else { return ("1", []) }
        let names = states.map(\.rawValue).sorted()
        guard !names.isEmpty else { return ("0", []) }
        return ("state IN (" + names.map { _ in "?" }.joined(separator: ",") + ")", StatementArguments(names))
    }

    /// A page of records after an ID (see ``QueueStore/downloads(in:after:limit:)``).
    func downloads(in states: Set<DownloadState>?, after: DownloadID?, limit: Int) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        let condition = Self.stateCondition(states)
        return try read { db in
            try StoredDownload.fetchAll(
                db, sql: "SELECT * FROM download WHERE \(condition.sql) AND id > ? ORDER BY id LIMIT ?",
                arguments: condition.arguments + [after?.rawValue ?? 0, limit])
        }
    }

    /// A page of records at an offset (see ``QueueStore/downloads(in:offset:limit:)``): the IDs
    /// skipped are read from a narrow index, not from the records.
    func downloads(in states: Set<DownloadState>?, offset: Int, limit: Int) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        let condition = Self.stateCondition(states)
        return try read { db in
            try StoredDownload.fetchAll(
                db,
                sql: """
                    SELECT * FROM download WHERE \(condition.sql) AND id >= (
                        SELECT id FROM download INDEXED BY download_on_id_state WHERE \(condition.sql)
                        ORDER BY id LIMIT 1 OFFSET ?)
                    ORDER BY id LIMIT ?
                    """,
                arguments: condition.arguments + condition.arguments + [max(0, offset), limit])
        }
    }

    /// A page of records in the order they start (see ``QueueStore/downloadsInStartOrder(in:offset:limit:)``).
    func downloadsInStartOrder(in states: Set<DownloadState>, offset: Int, limit: Int) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        let condition = Self.stateCondition(states)
        return try read { db in
            try StoredDownload.fetchAll(
                db, sql: "SELECT * FROM download WHERE \(condition.sql) ORDER BY priority DESC, id LIMIT ? OFFSET ?",
                arguments: condition.arguments + [limit, max(0, offset)])
        }
    }

    /// How many records each state has (see ``QueueStore/counts()``).
    func counts() throws -> [DownloadState: Int] {
        try read { db in
            var counts: [DownloadState: Int] = [:]
            let statement = try db.cachedStatement(sql: "SELECT state, n FROM download_count WHERE n > 0")
            for row in try Row.fetchAll(statement) {
                if let state = DownloadState(rawValue: row["state"]) { counts[state] = row["n"] }
            }
            return counts
        }
    }

    /// Sums per state (see ``QueueStore/totals()``).
    func totals() throws -> [DownloadState: QueueTotals] {
        try read { db in
            var totals: [DownloadState: QueueTotals] = [:]
            let rows = try Row.fetchAll(
                db,
                sql: """
                    SELECT state, count(*) AS n, total(bytes) AS bytes, total(totalBytes) AS totalBytes,
                        count(*) - count(totalBytes) AS unknown
                    FROM download GROUP BY state
                    """)
            for row in rows {
                guard let state = DownloadState(rawValue: row["state"]) else { continue }
                totals[state] = QueueTotals(
                    count: row["n"], bytes: Int64(row["bytes"] as Double),
                    totalBytes: Int64(row["totalBytes"] as Double),
                    unknownTotals: row["unknown"])
            }
            return totals
        }
    }

    /// At most this many values in one `IN (…)` list.
    private static let listChunk = 500

    /// Calls `body` with each ``listChunk`` of `values` and the statement `sql` makes of the text
    /// of their `IN` list (`(?,?,…)`). Every statement is prepared once and kept: a list shorter than
    /// ``listChunk`` is padded to a power of two by repeating its last value (which matches nothing
    /// more), so small lookups, such as a commit of a few records, share at most ten statements a
    /// query instead of each preparing its own.
    private static func inLists<Value: DatabaseValueConvertible>(
        of values: [Value], _ db: Database, _ sql: (_ list: String) -> String,
        _ body: (_ statement: Statement, _ arguments: StatementArguments) throws -> Void
    ) throws {
        for start in stride(from: 0, to: values.count, by: listChunk) {
            let chunk = values[start..<min(values.count, start + listChunk)]
            let length = listLength(for: chunk.count)
            let text = sql("(" + repeatElement("?", count: length).joined(separator: ",") + ")")
            var arguments = StatementArguments(chunk)
            if length > chunk.count, let last = chunk.last {
                arguments += StatementArguments(repeatElement(last, count: length - chunk.count))
            }
            try body(try db.cachedStatement(sql: text), arguments)
        }
    }

    /// How many values the `IN` list of `count` values holds: the smallest power of two not below
    /// `count` (1 for none), at most ``listChunk``.
    static func listLength(for count: Int) -> Int {
        guard count > 1 else { return 1 }
        guard count < listChunk else { return listChunk }
        return min(listChunk, 1 << (Int.bitWidth - (count - 1).leadingZeroBitCount))
    }

    /// Records whose `column` is one of `values` (and that meet `condition`, SQL with its arguments,
    /// which follow the `IN` list's), in ID order, read `IN` lists of ``listChunk`` values at a
    /// time in one snapshot.
    private func downloads<Value: DatabaseValueConvertible & Hashable & Sendable>(
        where column: String, in values: [Value],
        and condition: (sql: String, arguments: StatementArguments) = ("1", [])
    ) throws -> [StoredDownload] {
        guard !values.isEmpty else { return [] }
        let unique = Array(Set(values))
        return try read { db in
            var found: [StoredDownload] = []
            let sql = { (list: String) in "SELECT * FROM download WHERE \(column) IN \(list) AND \(condition.sql)" }
            try Self.inLists(of: unique, db, sql) { statement, arguments in
                found += try StoredDownload.fetchAll(statement, arguments: arguments + condition.arguments)
            }
            return found.sorted { $0.downloadID < $1.downloadID }
        }
    }

    /// The newest record's ID (see ``QueueStore/newestID()``): the end of the ID index.
    func newestID() throws -> DownloadID? {
        try read { db in try Int64.fetchOne(db, sql: "SELECT max(id) FROM download").map(DownloadID.init) }
    }

    /// The records with these IDs (see ``QueueStore/downloads(ids:in:)``).
    func downloads(ids: [DownloadID], in states: Set<DownloadState>?) throws -> [StoredDownload] {
        try downloads(where: "id", in: ids.map(\.rawValue), and: Self.stateCondition(states))
    }

    /// The records of these keys (see ``QueueStore/downloads(keys:)``).
    func downloads(keys: [String]) throws -> [StoredDownload] {
        try downloads(where: "key", in: keys)
    }

    /// The downloads into a directory that learnt these files (see
    /// ``QueueStore/downloadsIntoDirectories(destinations:)``). A queue with no download into a
    /// directory says so in one step of the key index, and the files are not looked up: an add of
    /// a hundred thousand named files spent a tenth of its time looking them up by file.
    func downloadsIntoDirectories(destinations: [String]) throws -> [StoredDownload] {
        guard !destinations.isEmpty else { return [] }
        let any = try read { db in
            try Bool.fetchOne(
                db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM download WHERE \(Self.intoDirectory))"))
        }
        guard any == true else { return [] }
        return try downloads(where: "destination", in: destinations, and: (Self.intoDirectory, []))
    }

    /// The record with this key (see ``QueueStore/download(key:)``).
    func download(key: String) throws -> StoredDownload? {
        try read { db in
            try StoredDownload.fetchOne(db, sql: "SELECT * FROM download WHERE key = ?", arguments: [key])
        }
    }

    /// SQLite's `data_version` as the writing connection sees it (see
    /// ``QueueStore/othersChangeVersion()``): it moves with each commit made through another
    /// connection, and not with this connection's own.
    /// Read outside a transaction: it takes no lock.
    func othersChangeVersion() throws -> Int? {
        do {
            return try database.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA data_version") }
        } catch {
            throw Self.failure(error, path: path, doing: "could not read the state database")
        }
    }

    /// The records of a file (see ``QueueStore/downloads(destination:)``).
    func downloads(destination: String) throws -> [StoredDownload] {
        // A download to a named file by its key; one into a directory by the file it learnt.
        try read { db in
            try StoredDownload.fetchAll(
                db,
                sql: """
                    SELECT * FROM download WHERE key = ? OR (destination = ? AND \(Self.intoDirectory)) ORDER BY id
                    """,
                arguments: [Identity.key(destination: destination), destination])
        }
    }

    /// An owner's next queued records (see ``QueueStore/nextQueued(ownedBy:limit:)``).
    func nextQueued(ownedBy owner: String, limit: Int) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        return try read { db in
            try StoredDownload.fetchAll(
                db,
                sql: """
                    SELECT * FROM download WHERE owner = ? AND state = 'queued'
                    ORDER BY priority DESC, id LIMIT ?
                    """,
                arguments: [owner, limit])
        }
    }

    /// The owners records name (see ``QueueStore/owners()``).
    func owners() throws -> [String] {
        try read { db in
            try String.fetchAll(db, sql: "SELECT DISTINCT owner FROM download WHERE owner IS NOT NULL")
        }
    }

    /// A page of an owner's records (see ``QueueStore/downloads(ownedBy:in:after:limit:)``).
    func downloads(
        ownedBy owner: String?, in states: Set<DownloadState>?, after: DownloadID?, limit: Int
    ) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        let condition = Self.stateCondition(states)
        return try read { db in
            try StoredDownload.fetchAll(
                db,
                sql: "SELECT * FROM download WHERE owner IS ? AND \(condition.sql) AND id > ? ORDER BY id LIMIT ?",
                arguments: StatementArguments([owner]) + condition.arguments + [after?.rawValue ?? 0, limit])
        }
    }

    /// Claims queued records nobody owns (see ``QueueStore/claimQueued(for:limit:now:)``): one
    /// write transaction, which SQLite runs alone.
    func claimQueued(for owner: String, limit: Int, now: Double) throws -> [StoredDownload] {
        guard limit > 0 else { return [] }
        return try write { db in
            var records = try StoredDownload.fetchAll(
                db,
                sql: """
                    SELECT * FROM download WHERE owner IS NULL AND state = 'queued'
                    ORDER BY priority DESC, id LIMIT ?
                    """,
                arguments: [limit])
            for index in records.indices {
                records[index].owner = owner
                records[index].updatedAt = now
                try db.cachedStatement(sql: "UPDATE download SET owner = ?, updatedAt = ? WHERE id = ?")
                    .execute(arguments: [owner, now, records[index].id])
            }
            return records
        }
    }

    /// Gives queued records to another owner (see
    /// ``QueueStore/reassignQueued(from:includingUnowned:to:now:)``).
    func reassignQueued(from owners: [String], includingUnowned: Bool, to newOwner: String?, now: Double) throws -> Int
    {
        var conditions = owners.isEmpty ? [] : ["owner IN (" + owners.map { _ in "?" }.joined(separator: ",") + ")"]
        if includingUnowned { conditions.append("owner IS NULL") }
        guard !conditions.isEmpty else { return 0 }
        return try write { db in
            try db.execute(
                sql: """
                    UPDATE download SET owner = ?, bytesPerSecond = NULL, updatedAt = ?
                    WHERE state = 'queued' AND (\(conditions.joined(separator: " OR ")))
                        AND owner IS NOT ?
                    """,
                arguments: StatementArguments([newOwner]) + [now] + StatementArguments(owners)
                    + StatementArguments([newOwner]))
            return db.changesCount
        }
    }

    /// Lets go of an owner's records (see ``QueueStore/release(ownedBy:keeping:now:)``).
    func release(ownedBy owner: String, keeping: Set<DownloadID>, now: Double) throws -> Int {
        let kept = keeping.map(\.rawValue).sorted()
        let exception = kept.isEmpty ? "" : " AND id NOT IN (" + kept.map { _ in "?" }.joined(separator: ",") + ")"
        return try write { db in
            try db.execute(
                sql: "UPDATE download SET owner = NULL, updatedAt = ? WHERE owner = ?" + exception,
                arguments: StatementArguments([now]) + [owner] + StatementArguments(kept))
            return db.changesCount
        }
    }

    // MARK: Transactions and errors

    /// Runs `body` in one write transaction, turning SQLite's errors into ``HaulError/Code/database``.
    private func write<T>(_ body: (Database) throws -> T) throws -> T {
        do {
            return try database.write(body)
        } catch let error as HaulError {
            throw error
        } catch {
            throw Self.failure(error, path: path, doing: "could not update the state database")
        }
    }

    /// Runs `body` on a snapshot of the database, turning SQLite's errors into
    /// ``HaulError/Code/database``.
    private func read<T>(_ body: (Database) throws -> T) throws -> T {
        do {
            return try database.read(body)
        } catch let error as HaulError {
            throw error
        } catch {
            throw Self.failure(error, path: path, doing: "could not read the state database")
        }
    }

    /// SQLite's error as a ``HaulError/Code/database`` one; a damaged file says what to do, whichever
    /// operation met the damage first.
    static func failure(_ error: any Error, path: String, doing: String) -> HaulError {
        if let error = error as? DatabaseError,
            [.SQLITE_CORRUPT, .SQLITE_NOTADB].contains(error.resultCode.primaryResultCode)
        {
            // Its -wal and -shm files go with it: SQLite would otherwise pair a new database with
            // the old log. The directory and name are quoted for a shell.
            let (directory, name) = DownloadPaths.split(path)
            let quoted = { (text: String) in "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'" }
            return HaulError(
                .database,
                "the state database \(path) is damaged (\(describe(error))): stop every haul process using it, "
                    + "move it aside with its -wal and -shm files (cd \(quoted(directory)) && mkdir -p damaged && "
                    + "mv \(quoted(name))* damaged/) and add the downloads again; their partial files resume from "
                    + "the manifests beside them",
                underlying: error)
        }
        return HaulError(.database, "\(doing) \(path): \(describe(error))", underlying: error)
    }

    /// What went wrong, in SQLite's words when it was SQLite.
    static func describe(_ error: any Error) -> String {
        if let error = error as? DatabaseError { return error.message ?? "\(error.resultCode)" }
        return "\(error)"
    }
}

/// A record as a row of the `download` table; its request is the `definition` column, as JSON.
extension StoredDownload: FetchableRecord, MutablePersistableRecord {
    package static let databaseTableName = "download"

    /// The table's columns, by name.
    package enum Columns: String, ColumnExpression, CaseIterable {
        case id, key, definition, destination, priority, state, errorCode, errorMessage, errorStatus, bytes
        case totalBytes, bytesPerSecond, owner, request, hook, createdAt, startedAt, finishedAt, updatedAt

        /// Every column but `id` and `request`: the manager writes whole records without ever
        /// clearing a request another process has just made.
        static let managed = allCases.filter { $0 != .id && $0 != .request }
    }

    /// A record from a row of the table, read column by column (reading records through their
    /// `Decodable` conformance cost more than the query when an add looks up thousands).
    package init(row: Row) throws {
        let state: String = row[Columns.state.rawValue]
        guard let downloadState = DownloadState(rawValue: state) else {
            throw HaulError(.database, "the state database holds an unknown download state '\(state)'")
        }
        let requestName: String? = row[Columns.request.rawValue]
        let request = requestName.flatMap(OwnerRequest.init(rawValue:))
        if let requestName, request == nil {
            throw HaulError(.database, "the state database holds an unknown request '\(requestName)'")
        }
        let definition: String = row[Columns.definition.rawValue]
        self.init(
            id: row[Columns.id.rawValue], key: row[Columns.key.rawValue],
            definition: try Self.decodeDefinition(definition),
            destination: row[Columns.destination.rawValue], priority: row[Columns.priority.rawValue],
            state: downloadState,
            error: (
                row[Columns.errorCode.rawValue], row[Columns.errorMessage.rawValue], row[Columns.errorStatus.rawValue]
            ),
            bytes: row[Columns.bytes.rawValue], totalBytes: row[Columns.totalBytes.rawValue],
            bytesPerSecond: row[Columns.bytesPerSecond.rawValue], owner: row[Columns.owner.rawValue],
            request: request, hook: row[Columns.hook.rawValue],
            createdAt: row[Columns.createdAt.rawValue], startedAt: row[Columns.startedAt.rawValue],
            finishedAt: row[Columns.finishedAt.rawValue], updatedAt: row[Columns.updatedAt.rawValue])
    }

    /// Takes the ID SQLite gave the new row.
    package mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }

    /// The statement that writes every managed column (see ``Columns/managed``) of one row.
    static let updateManagedColumnsSQL = updateSQL(Columns.managed)

    /// The managed columns but the key and the file: what changes as a download runs. SQLite
    /// rewrites the entry of every index on a column an UPDATE sets, changed or not; an update of
    /// these leaves the key's and the file's indexes alone (a third less time a write of a small
    /// file's state took).
    static let changingColumns = Columns.managed.filter { $0 != .key && $0 != .destination }

    /// The statement that writes ``changingColumns`` of one row.
    static let updateChangingColumnsSQL = updateSQL(changingColumns)

    /// `UPDATE download SET` these columns `WHERE id = ?`.
    private static func updateSQL(_ columns: [Columns]) -> String {
        "UPDATE download SET " + columns.map { "\"\($0.rawValue)\" = ?" }.joined(separator: ", ") + " WHERE id = ?"
    }

    /// How many rows one statement of a long insert writes. Each statement has a cost of its own
    /// (its cursors on the table and each index are opened and closed, its end is checked), which
    /// an add of a hundred thousand paid once a row. 32 rows bind 544 values, under the 999 an
    /// older SQLite allows in one statement.
    static let rowsPerInsert = 32

    /// The statement that inserts a row with every managed column (see ``Columns/managed``).
    static let insertManagedColumnsSQL = insertSQL(rows: 1)

    /// The statement that inserts ``rowsPerInsert`` rows with every managed column.
    static let insertManyManagedColumnsSQL = insertSQL(rows: rowsPerInsert)

    /// `INSERT INTO download` the managed columns of `rows` rows.
    private static func insertSQL(rows: Int) -> String {
        let row = "(" + Columns.managed.map { _ in "?" }.joined(separator: ", ") + ")"
        return "INSERT INTO download (" + Columns.managed.map { "\"\($0.rawValue)\"" }.joined(separator: ", ")
            + ") VALUES " + repeatElement(row, count: rows).joined(separator: ", ")
    }

    /// Binds `columns` to `statement`, in their order from its first parameter, straight through
    /// SQLite's own calls: adding a hundred thousand records spent more on building GRDB's
    /// arguments than SQLite spent on inserting them. Returns the next parameter's position.
    private func bind(_ columns: [Columns], to statement: Statement) throws -> Int32 {
        var binder = Binder(clearing: statement)
        try bind(columns, with: &binder)
        return binder.position
    }

    /// Binds `columns` with `binder`, from its next parameter on.
    private func bind(_ columns: [Columns], with binder: inout Binder) throws {
        for column in columns {
            switch column {
            case .key: try binder.bind(key)
            case .definition: try binder.bind(Self.encodeDefinition(definition))
            case .destination: try binder.bind(destination)
            case .priority: try binder.bind(Int64(priority))
            case .state: try binder.bind(state.rawValue)
            case .errorCode: try binder.bind(errorCode)
            case .errorMessage: try binder.bind(errorMessage)
            case .errorStatus: try binder.bind(errorStatus.map(Int64.init))
            case .bytes: try binder.bind(bytes)
            case .totalBytes: try binder.bind(totalBytes)
            case .bytesPerSecond: try binder.bind(bytesPerSecond)
            case .owner: try binder.bind(owner)
            case .hook: try binder.bind(hook)
            case .createdAt: try binder.bind(createdAt)
            case .startedAt: try binder.bind(startedAt)
            case .finishedAt: try binder.bind(finishedAt)
            case .updatedAt: try binder.bind(updatedAt)
            case .id, .request: continue
            }
        }
    }

    /// Inserts `records` as new rows (their own IDs are not written) and returns the IDs SQLite
    /// gave them, in order: ``rowsPerInsert`` rows a statement, then the rest one by one, with
    /// cached statements (adding many builds no SQL and encodes no record).
    ///
    /// The rows of one statement have consecutive IDs, ending at the last one inserted: the
    /// table's IDs are AUTOINCREMENT, so each row takes one more than the largest ID the table
    /// ever had, and nothing else writes the table while the statement runs.
    static func insertManagedColumns(of records: [StoredDownload], _ db: Database) throws -> [DownloadID] {
        var ids: [DownloadID] = []
        ids.reserveCapacity(records.count)
        var index = 0
        while index < records.count {
            let rows = records.count - index >= rowsPerInsert ? rowsPerInsert : 1
            let statement = try db.cachedStatement(
                sql: rows == 1 ? insertManagedColumnsSQL : insertManyManagedColumnsSQL)
            var binder = Binder(clearing: statement)
            for position in index..<index + rows {
                try records[position].bind(Columns.managed, with: &binder)
            }
            try statement.execute()
            guard db.changesCount == rows else {
                throw HaulError(.database, "the state database inserted \(db.changesCount) rows of \(rows)")
            }
            let last = db.lastInsertedRowID
            ids += (last - Int64(rows) + 1...last).map { DownloadID($0) }
            index += rows
        }
        return ids
    }

    /// Writes every managed column (see ``Columns/managed``), or only ``changingColumns`` when
    /// `keepingKeyAndDestination` (the caller read them unchanged), with one cached statement whose
    /// values are bound in place (a progress write of many downloads builds no SQL and encodes no
    /// record); throws `RecordError` when the row is gone.
    func updateManagedColumns(_ db: Database, keepingKeyAndDestination: Bool) throws {
        guard let id else { throw RecordError.recordNotFound(databaseTableName: Self.databaseTableName, key: [:]) }
        let columns = keepingKeyAndDestination ? Self.changingColumns : Columns.managed
        let statement = try db.cachedStatement(
            sql: keepingKeyAndDestination ? Self.updateChangingColumnsSQL : Self.updateManagedColumnsSQL)
        var binder = Binder(statement, at: try bind(columns, to: statement))
        try binder.bind(id)
        try statement.execute()
        if db.changesCount == 0 {
            throw RecordError.recordNotFound(databaseTableName: Self.databaseTableName, key: ["id": id.databaseValue])
        }
    }

}

/// Binds values to a statement's parameters one after another, through SQLite's own calls.
private struct Binder {
    private let statement: Statement
    /// The parameter the next value goes to, from 1.
    private(set) var position: Int32

    init(_ statement: Statement, at position: Int32) {
        self.statement = statement
        self.position = position
    }

    /// Binds from the first parameter on, once the statement's previous values are cleared (and
    /// its arguments marked as set).
    init(clearing statement: Statement) {
        statement.setUncheckedArguments(StatementArguments())
        self.init(statement, at: 1)
    }

    mutating func bind(_ value: String?) throws {
        guard var value else { return try next(sqlite3_bind_null(statement.sqliteStatement, position)) }
        // The bytes with their length; SQLite copies them.
        let code = value.withUTF8 { bytes in
            sqlite3_bind_text(
                statement.sqliteStatement, position, bytes.baseAddress.map { UnsafeRawPointer($0) } ?? Self.empty,
                Int32(bytes.count), Self.transient)
        }
        try next(code)
    }

    mutating func bind(_ value: Int64?) throws {
        guard let value else { return try next(sqlite3_bind_null(statement.sqliteStatement, position)) }
        try next(sqlite3_bind_int64(statement.sqliteStatement, position, value))
    }

    mutating func bind(_ value: Double?) throws {
        guard let value else { return try next(sqlite3_bind_null(statement.sqliteStatement, position)) }
        try next(sqlite3_bind_double(statement.sqliteStatement, position, value))
    }

    /// Moves to the next parameter once SQLite took the value.
    private mutating func next(_ code: Int32) throws {
        guard code == SQLITE_OK else {
            throw DatabaseError(
                resultCode: ResultCode(rawValue: code), message: String(cString: sqlite3_errstr(code)),
                sql: statement.sql)
        }
        position += 1
    }

    /// Where an empty text's bytes are: a text bound with no address would be NULL.
    private static var empty: UnsafeRawPointer { UnsafeRawPointer(StaticString("").utf8Start) }

    /// SQLITE_TRANSIENT: SQLite copies the value before the call returns.
    private static var transient: sqlite3_destructor_type { unsafeBitCast(-1, to: sqlite3_destructor_type.self) }
}
