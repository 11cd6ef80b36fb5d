import GRDB
import Testing

@testable import Haul

/// What only the SQLite store does (its migrations), and the records' lifecycle; what every store
/// does is in ``QueueStoreConformanceTests``.
@Suite struct SQLiteQueueStoreTests {
    /// Makes a database at `path` as the migrations up to `last` leave it, and runs `setUp` on it.
    static func database(at path: String, upTo last: String, _ setUp: (Database) throws -> Void) throws {
        let database = try DatabaseQueue(path: path)
        try SQLiteQueueStore.migrator.migrate(database, upTo: last)
        try database.write(setUp)
    }

    /// A state database written before requests were stored as JSON keeps every download: its URL,
    /// destination, headers, checksum, limits and mirrors move into the request, its IDs stay, and an
    /// ID of a removed download is not given out again.
    @Test func migrationSixMovesWhatWasAskedForIntoTheRequest() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory + "/downloads.sqlite"
            let checksum = "sha-256=" + String(repeating: "ab", count: 32)
            try Self.database(at: path, upTo: "5: a download's mirrors") { db in
                try db.execute(
                    sql: """
                        INSERT INTO download (id, key, url, directory, destination, overwrite, checksum,
                            rateLimit, connections, mirrors, priority, state, bytes, createdAt, updatedAt)
                        VALUES (1, 'file:/d/a', 'http://x/a', NULL, '/d/a', 1, ?, 500, 3,
                                'http://m1/a' || char(10) || 'http://m2/a', 10, 'paused', 7, 1, 2),
                               (2, 'url:/d' || char(10) || 'http://x/b', 'http://x/b', '/d', '/d/b.iso', 0,
                                NULL, NULL, NULL, NULL, 0, 'completed', 9, 1, 2),
                               (5, 'file:/d/c', 'http://x/c', NULL, '/d/c', 0, NULL, NULL, NULL, NULL, 0,
                                'queued', 0, 1, 2);
                        INSERT INTO header (downloadId, position, name, value)
                        VALUES (1, 0, 'X-Trace', '7'), (1, 1, 'Accept', 'text/plain');
                        DELETE FROM download WHERE id = 5;
                        """, arguments: [checksum])
            }
            let store = try SQLiteQueueStore(path: path)
            let records = try store.allDownloads()
            #expect(records.map(\.downloadID) == [DownloadID(1), DownloadID(2)])
            let first = records[0].definition
            #expect(first.url == "http://x/a" && first.destination == .file("/d/a") && first.overwrite)
            #expect(
                first.headers.map(\.name) == ["X-Trace", "Accept"] && first.headers.map(\.value) == ["7", "text/plain"])
            #expect(first.checksum?.description == (try Checksum(parsing: checksum)).description)
            #expect(first.bytesPerSecondLimit == 500 && first.connections == 3)
            #expect(first.mirrors == ["http://m1/a", "http://m2/a"])
            #expect(records[0].state == .paused && records[0].bytes == 7 && records[0].priority == 10)
            let second = records[1]
            #expect(second.definition.destination == .directory("/d") && second.destination == "/d/b.iso")
            #expect(second.key == "url:/d\nhttp://x/b" && second.state == .completed)
            var next = StoredDownload(
                key: "file:/d/e", definition: DownloadRequest(url: "http://x/e", destination: .file("/d/e")),
                destination: "/d/e", priority: 0, owner: nil, now: 3)
            // Migration 8 counted the records there were; its triggers count the new one.
            #expect(try store.counts() == [.paused: 1, .completed: 1])
            next.id = try store.insert([next])[0].rawValue
            #expect(next.downloadID == DownloadID(6))
            #expect(try store.counts() == [.paused: 1, .completed: 1, .queued: 1])
            let tables = try store.database.read { db in
                try String.fetchAll(db, sql: "SELECT name FROM sqlite_master")
            }
            #expect(!tables.contains("header") && !tables.contains("download6"))
        }
    }

    /// A database from a build that kept the per-state counts by triggers: migration 8 drops the
    /// triggers (the store keeps the counts) and counts again.
    @Test func migrationEightReplacesTheCountTriggers() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory + "/downloads.sqlite"
            try Self.database(at: path, upTo: "7: indexes for reading a queue of any size by pages") { db in
                try db.execute(
                    sql: """
                        CREATE TABLE download_count (state TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
                        CREATE TRIGGER download_count_insert AFTER INSERT ON download BEGIN
                            INSERT INTO download_count (state, n) VALUES (NEW.state, 1)
                                ON CONFLICT (state) DO UPDATE SET n = n + 1;
                        END;
                        INSERT INTO download (key, definition, state, createdAt, updatedAt)
                        VALUES ('file:/d/a', '{"url":"http://x/a","destination":{"file":"/d/a"}}', 'paused', 1, 1),
                               ('file:/d/b', '{"url":"http://x/b","destination":{"file":"/d/b"}}', 'failed', 1, 1);
                        """)
            }
            let store = try SQLiteQueueStore(path: path)
            #expect(try store.counts() == [.paused: 1, .failed: 1])
            let next = StoredDownload(
                key: "file:/d/c", definition: DownloadRequest(url: "http://x/c", destination: .file("/d/c")),
                destination: "/d/c", priority: 0, owner: nil, now: 3)
            _ = try store.insert([next])
            // Counted once, by the store: no trigger is left to count it again.
            #expect(try store.counts() == [.paused: 1, .failed: 1, .queued: 1])
            let triggers = try store.database.read { db in
                try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'trigger'")
            }
            #expect(triggers.isEmpty)
        }
    }

    /// A database from before migration 9 keeps its rows, IDs and ID sequence; its checks still
    /// refuse a state or request the queue does not know, and writing a row builds no temporary
    /// table (SQLite built one per `IN` list, each time a row was written).
    @Test func migrationNineChecksWithoutTemporaryTables() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory + "/downloads.sqlite"
            try Self.database(at: path, upTo: "8: the count of each state") { db in
                try db.execute(
                    sql: """
                        INSERT INTO download (id, key, definition, destination, state, request, bytes,
                            createdAt, updatedAt)
                        VALUES (1, 'file:/d/a', '{"url":"http://x/a","destination":"/d/a"}', '/d/a',
                                'paused', 'cancel', 7, 1, 2),
                               (3, 'file:/d/b', '{"url":"http://x/b","destination":"/d/b"}', '/d/b',
                                'queued', NULL, 0, 1, 2);
                        INSERT INTO download_count (state, n) VALUES ('paused', 1), ('queued', 1);
                        DELETE FROM download WHERE id = 3;
                        UPDATE download_count SET n = 0 WHERE state = 'queued';
                        """)
            }
            let store = try SQLiteQueueStore(path: path)
            let records = try store.allDownloads()
            #expect(records.map(\.downloadID) == [DownloadID(1)])
            #expect(records[0].state == .paused && records[0].request == .cancel && records[0].bytes == 7)
            #expect(records[0].destination == "/d/a" && records[0].definition.url == "http://x/a")
            let next = StoredDownload(
                key: "file:/d/c", definition: DownloadRequest(url: "http://x/c", destination: .file("/d/c")),
                destination: "/d/c", priority: 0, owner: nil, now: 3)
            // The ID of the removed download is not given out again.
            #expect(try store.insert([next]) == [DownloadID(4)])
            try store.database.write { db in
                for (column, value) in [("state", "done"), ("request", "stop")] {
                    #expect(throws: DatabaseError.self, "\(column) = \(value)") {
                        try db.execute(sql: "UPDATE download SET \(column) = ? WHERE id = 1", arguments: [value])
                    }
                }
                for sql in [
                    StoredDownload.insertManagedColumnsSQL, StoredDownload.insertManyManagedColumnsSQL,
                    StoredDownload.updateManagedColumnsSQL,
                    StoredDownload.updateChangingColumnsSQL,
                    "UPDATE download SET request = ? WHERE id = ?",
                ] {
                    let parameters = [DatabaseValue](repeating: .null, count: sql.count { $0 == "?" })
                    let steps = try Row.fetchAll(db, sql: "EXPLAIN " + sql, arguments: StatementArguments(parameters))
                        .map { $0["opcode"] as String }
                    #expect(!steps.contains("OpenEphemeral"), "\(sql)")
                }
            }
        }
    }

    /// Migration 10 leaves four indexes besides the key's, and each query still reads one: a page
    /// of one state in ID order and the sums per state read the index on the state and ID (no
    /// sort, no record), a lookup of the files directories' downloads learnt reads the partial
    /// index of those, and a download to a named file is found by its key.
    @Test func migrationTenIndexesLess() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory + "/downloads.sqlite"
            try Self.database(at: path, upTo: "9: checks that need no temporary table") { db in
                try db.execute(
                    sql: """
                        INSERT INTO download (id, key, definition, destination, state, bytes, createdAt, updatedAt)
                        VALUES (1, 'file:/d/a', '{"url":"http://x/a","destination":"/d/a"}', '/d/a',
                                'paused', 7, 1, 2),
                               (2, 'url:/d\nhttp://x/b', '{"url":"http://x/b","directory":"/d"}', '/d/b',
                                'queued', 0, 1, 2);
                        INSERT INTO download_count (state, n) VALUES ('paused', 1), ('queued', 1);
                        """)
                // Some builds made migration 9 without the index on state alone.
                try db.execute(sql: "DROP INDEX download_on_state")
            }
            let store = try SQLiteQueueStore(path: path)
            #expect(try store.downloads(destination: "/d/a").map(\.id) == [1])
            #expect(try store.downloads(destination: "/d/b").map(\.id) == [2])
            #expect(try store.downloadsIntoDirectories(destinations: ["/d/a", "/d/b"]).map(\.id) == [2])
            #expect(try store.totals()[.paused] == QueueTotals(count: 1, bytes: 7, totalBytes: 0, unknownTotals: 1))
            let indexes = try store.database.read { db in
                try String.fetchAll(
                    db, sql: "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name")
            }
            #expect(
                indexes == [
                    "download_on_destination", "download_on_id_state", "download_on_owner_state_priority",
                    "download_on_state_id",
                ])
            try store.database.read { db in
                func plan(_ sql: String, _ arguments: StatementArguments) throws -> [String] {
                    try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN " + sql, arguments: arguments).map { $0["detail"] }
                }
                let page = try plan(
                    "SELECT * FROM download WHERE state IN (?) AND id > ? ORDER BY id LIMIT ?", ["queued", 0, 100])
                #expect(page.contains { $0.contains("download_on_state_id") }, "\(page)")
                #expect(!page.contains { $0.contains("TEMP B-TREE") }, "\(page)")
                let sums = try plan(
                    "SELECT state, count(*), total(bytes), total(totalBytes) FROM download GROUP BY state", [])
                #expect(sums.contains { $0.contains("COVERING INDEX download_on_state_id") }, "\(sums)")
                let learnt = try plan(
                    "SELECT * FROM download WHERE destination IN (?) AND \(SQLiteQueueStore.intoDirectory)", ["/d/b"])
                #expect(learnt.contains { $0.contains("download_on_destination") }, "\(learnt)")
            }
        }
    }

    /// The version of others' changes moves with another store's commit on the same file, and not
    /// with the store's own: an add that sees it unchanged skips its second lookups.
    @Test func othersChangesMoveTheVersionOwnOnesDoNot() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory + "/downloads.sqlite"
            let store = try SQLiteQueueStore(path: path)
            let other = try SQLiteQueueStore(path: path)
            let record = { (name: String) in
                StoredDownload(
                    key: "file:/d/\(name)",
                    definition: DownloadRequest(url: "http://x/\(name)", destination: .file("/d/\(name)")),
                    destination: "/d/\(name)", priority: 0, owner: nil, now: 1)
            }
            let first = try #require(try store.othersChangeVersion())
            try store.insert([record("a")])
            #expect(try store.othersChangeVersion() == first)
            try other.insert([record("b")])
            let second = try #require(try store.othersChangeVersion())
            #expect(second != first)
            #expect(try store.othersChangeVersion() == second)
        }
    }

    /// A commit of many new records inserts them several rows a statement: each record keeps its
    /// own request and the ID it is given, across the statements and the rows inserted one by one
    /// after them. The IDs follow the largest ever given, past a removed record.
    @Test(arguments: [3, StoredDownload.rowsPerInsert, 3 * StoredDownload.rowsPerInsert + 5])
    func everyInsertedRecordKeepsItsOwnRequest(count: Int) async throws {
        try await withTemporaryDirectory { directory in
            let store = try SQLiteQueueStore(path: directory + "/downloads.sqlite")
            let removed = StoredDownload(
                key: "file:/d/removed",
                definition: DownloadRequest(url: "http://x/r", destination: .file("/d/removed")),
                destination: "/d/removed", priority: 0, owner: nil, now: 1)
            var second = removed
            second.key = "file:/d/removed2"
            let removedIDs = try store.insert([removed, second])
            try store.delete(removedIDs[1])
            let records = (0..<count).map { index in
                StoredDownload(
                    key: "file:/d/\(index)",
                    definition: DownloadRequest(
                        url: "http://x/\(index)?n=\(index)", destination: .file("/d/\(index)"),
                        headers: [(name: "X-Index", value: "\(index)")]),
                    destination: "/d/\(index)", priority: index % 3, owner: nil, now: 1)
            }
            let ids = try store.insert(records)
            #expect(ids == (3...Int64(count + 2)).map { DownloadID($0) })
            let stored = try store.allDownloads().filter { $0.key != removed.key }
            #expect(stored.map(\.downloadID) == ids)
            for (index, record) in stored.enumerated() {
                #expect(record.key == "file:/d/\(index)" && record.definition.url == "http://x/\(index)?n=\(index)")
                #expect(record.definition.headers.map(\.value) == ["\(index)"])
            }
        }
    }

    /// A lookup of any number of records finds each once: its `IN` list, padded to a length whose
    /// statement is kept, matches nothing more than the records asked for.
    @Test(arguments: [1, 3, 5, 200, 501])
    func aLookupFindsEachRecordAskedForOnce(count: Int) async throws {
        try await withTemporaryDirectory { directory in
            let store = try SQLiteQueueStore(path: directory + "/downloads.sqlite")
            let records = (0..<(count + 40)).map { index in
                StoredDownload(
                    key: "file:/d/\(index)",
                    definition: DownloadRequest(url: "http://x/\(index)", destination: .file("/d/\(index)")),
                    destination: "/d/\(index)", priority: 0, owner: nil, now: 1)
            }
            let ids = try store.insert(records)
            let asked = Array(ids.dropFirst(20).prefix(count))
            #expect(try store.downloads(ids: asked).map(\.downloadID) == asked)
            let keys = asked.map { "file:/d/\($0.rawValue - 1)" }
            #expect(try store.downloads(keys: keys).map(\.downloadID) == asked)
            var changed = try store.downloads(ids: asked)
            for index in changed.indices { try changed[index].move(to: .paused, at: 2) }
            _ = try store.commit(QueueChanges(updates: changed))
            #expect(try store.downloads(ids: ids).filter { $0.state == .paused }.map(\.downloadID) == asked)
            #expect(try store.counts()[.paused] == count)
        }
    }

    /// `IN` lists are padded to powers of two up to the longest list, so few statements serve them.
    @Test func inListsArePaddedToPowersOfTwo() {
        let lengths = [0, 1, 2, 3, 4, 5, 17, 256, 257, 499, 500, 501].map { SQLiteQueueStore.listLength(for: $0) }
        #expect(lengths == [1, 1, 2, 4, 4, 8, 32, 256, 500, 500, 500, 500])
    }

    /// Every pair of states: the allowed transitions go through and set what their state records; every
    /// other one is refused and changes nothing.
    @Test(arguments: DownloadState.allCases)
    func theLifecycleAllowsOnlyItsTransitions(from start: DownloadState) throws {
        let allowed: [DownloadState: Set<DownloadState>] = [
            .queued: [.queued, .running, .paused, .cancelled, .completed],
            .running: [.running, .queued, .paused, .completed, .failed, .cancelled],
            .paused: [.paused, .queued, .cancelled],
            .completed: [.completed, .queued, .failed],
            .failed: [.failed, .queued, .cancelled],
            .cancelled: [.cancelled, .queued],
        ]
        for next in DownloadState.allCases {
            var record = try Self.record(in: start)
            let before = record
            let error = HaulError(.network, "reset")
            if allowed[start]?.contains(next) == true {
                try record.move(to: next, at: 100, error: error)
                #expect(record.state == next && record.updatedAt == 100)
                #expect(record.bytesPerSecond == nil)
                switch next {
                case .queued: #expect(record.finishedAt == nil && record.storedError == nil)
                case .running: #expect(record.startedAt == 100 && record.storedError == nil)
                case .paused: #expect(record.storedError?.code == .network)
                case .completed: #expect(record.finishedAt == 100 && record.storedError == nil)
                case .failed: #expect(record.finishedAt == 100 && record.storedError?.code == .network)
                case .cancelled: #expect(record.finishedAt == 100 && record.bytes == 0)
                }
            } else {
                #expect(throws: HaulError.self, "\(start) → \(next)") { try record.move(to: next, at: 100) }
                #expect(record == before)
            }
        }
    }

    /// A record in `state`, reached through allowed transitions.
    static func record(in state: DownloadState) throws -> StoredDownload {
        var record = StoredDownload(
            key: "file:/a", definition: DownloadRequest(url: "http://x/a", destination: .file("/a")),
            destination: "/a", priority: 0, owner: nil, now: 1)
        record.bytes = 5
        record.bytesPerSecond = 9
        let path: [DownloadState] =
            switch state {
            case .queued: []
            case .running: [.running]
            case .paused: [.paused]
            case .completed: [.running, .completed]
            case .failed: [.running, .failed]
            case .cancelled: [.cancelled]
            }
        for step in path { try record.move(to: step, at: 2) }
        record.bytesPerSecond = 9
        return record
    }

    /// A database damaged where a listing does not look (its indexes) lists, and the first operation
    /// that meets the damage says what to do, in one line.
    @Test func aDamagedDatabaseSaysWhatToDo() async throws {
        try await withTemporaryDirectory { directory in
            let state = directory + "/state"
            let ids = try await withManager(state) { manager in
                try await manager.enqueue(
                    (0..<300).map {
                        DownloadRequest(url: "http://127.0.0.1:9/f\($0)", destination: .file(directory + "/f\($0)"))
                    })
            }
            let path = state + "/" + DownloadManager.databaseName
            // The closed manager's last connection may still be checkpointing as it goes: the reader
            // waits for its lock, as the store itself does, rather than failing at once. Its own
            // checkpoint moves every page out of the write-ahead log, so that the indexes' pages are
            // in the database file, and are read from there once damaged.
            var waiting = Configuration()
            waiting.busyMode = .timeout(10)
            let roots = try await DatabaseQueue(path: path, configuration: waiting).writeWithoutTransaction { db in
                try db.checkpoint(.truncate)
                return try Int.fetchAll(db, sql: "SELECT rootpage FROM sqlite_master WHERE type = 'index'")
            }
            #expect(!roots.isEmpty)
            var bytes = try readFile(path)
            #expect(((try? readFile(path + "-wal")) ?? []).isEmpty)
            for root in roots {
                try #require(root * 4096 <= bytes.count, "index page \(root) is past the file's \(bytes.count) bytes")
                bytes.replaceSubrange((root - 1) * 4096..<root * 4096, with: repeatElement(0x5A, count: 4096))
            }
            try writeFile(path, bytes)
            let error = await expectHaulError(.database) {
                try await withManager(state) { manager in
                    #expect(await manager.downloads().count == 300)
                    try await manager.remove(ids[150])
                }
            }
            let message = error?.message ?? ""
            #expect(message.contains("is damaged") && message.contains("stop every haul process"), "\(message)")
            #expect(
                message.contains("(cd '\(state)' && mkdir -p damaged && mv 'downloads.sqlite'* damaged/)"), "\(message)"
            )
            #expect(!message.contains("\n"))
        }
    }

    /// An update writes a file's path whose bytes changed, even when Swift reads the two as the
    /// same string (an accented letter in one piece, or as a letter and its accent): SQLite and the
    /// file system compare bytes.
    @Test func anUpdateWritesAPathWhoseBytesChanged() async throws {
        try await withTemporaryDirectory { directory in
            let store = try SQLiteQueueStore(path: directory + "/" + DownloadManager.databaseName)
            var record = QueueStoreConformanceTests.record("a")
            record.destination = "/d/caf\u{E9}"
            record.id = try #require(try store.insert([record]).first).rawValue
            record.destination = "/d/cafe\u{301}"
            #expect(record.destination == "/d/caf\u{E9}")
            try store.update([record])
            let stored = try #require(try store.download(record.downloadID))
            #expect(stored.destination.map { Array($0.utf8) } == Array("/d/cafe\u{301}".utf8))
        }
    }
}
