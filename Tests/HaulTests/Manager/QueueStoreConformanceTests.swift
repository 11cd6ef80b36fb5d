import HaulPostgreSQL
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One fresh, empty storage a conformance test runs on, opened as often as the test likes.
struct QueueStoreStorage {
    /// Opens another store on this storage, as another process would.
    let open: () throws -> any QueueStore
    /// Damages the storage as a failing disk (or a hand that edits it) might; no store is open on
    /// it meanwhile.
    let damage: () async throws -> Void
    /// What the error about damaged storage must tell the user to do.
    let advice: String
}

/// A kind of ``QueueStore`` the conformance suite checks: how to make fresh storage for it.
struct QueueStoreKind: Sendable, CustomTestStringConvertible {
    /// The store's name, as the test results show it.
    let name: String
    /// Runs `body` with fresh storage, and removes that storage afterwards.
    let withStorage: @Sendable (_ body: (QueueStoreStorage) async throws -> Void) async throws -> Void

    /// The name, for the test results.
    var testDescription: String { name }

    /// Every store Haul has: each must pass the whole suite.
    static let all: [QueueStoreKind] = [.sqlite, .postgresql]

    /// ``SQLiteQueueStore``, in a file of a temporary directory.
    static let sqlite = QueueStoreKind(name: "SQLite") { body in
        try await withTemporaryDirectory { directory in
            let path = directory + "/" + DownloadManager.databaseName
            try await body(
                QueueStoreStorage(
                    open: { try SQLiteQueueStore(path: path) },
                    damage: {
                        let size = try readFile(path).count
                        try writeFile(path, [UInt8](repeating: 0x5A, count: size))
                        for file in [path + "-wal", path + "-shm"] { _ = unlink(file) }
                    }, advice: "move it aside"))
        }
    }

    /// ``PostgreSQLQueueStore``, in a database of its own on the tests' PostgreSQL server (see
    /// ``PostgreSQLTestServer``).
    static let postgresql = QueueStoreKind(name: "PostgreSQL") { body in
        try await PostgreSQLTesting.withDatabase { location in
            try await body(
                QueueStoreStorage(
                    open: { try PostgreSQLQueueStore(location: location) },
                    damage: {
                        try await PostgreSQLTesting.sql("ALTER TABLE download DROP COLUMN definition", in: location)
                    },
                    advice: "restore it from a backup"))
        }
    }
}

/// What every ``QueueStore`` must do, whatever keeps its records: written once against the
/// protocol and run on every store of ``QueueStoreKind/all``, on real storage.
@Suite struct QueueStoreConformanceTests {
    /// A new record, queued, with a plain request for `key`.
    static func record(_ key: String, owner: String? = nil, now: Double = 1) -> StoredDownload {
        StoredDownload(
            key: "file:/d/" + key, definition: DownloadRequest(url: "http://x/" + key, destination: .file("/d/" + key)),
            destination: "/d/" + key, priority: 0, owner: owner, now: now)
    }

    /// The record `store` holds for `id`, failing the test when there is none.
    static func stored(_ store: any QueueStore, _ id: DownloadID, sourceLocation: SourceLocation = #_sourceLocation)
        throws -> StoredDownload
    {
        try #require(try store.download(id), sourceLocation: sourceLocation)
    }

    /// Every field reads back as it was written, on insert and on update; the request reads back
    /// without its secrets (headers that look secret or were marked so, credentials, cookies).
    @Test(arguments: QueueStoreKind.all)
    func aRecordReadsBackAsWrittenWithoutItsSecrets(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            var request = DownloadRequest(
                url: "http://user:pw@x/a", destination: .file("/d/a"),
                headers: [("X-Trace", "5"), ("X-Api-Key", "k"), ("Authorization", "Bearer t"), ("X-Own", "s")],
                overwrite: true, checksum: try Checksum(parsing: "sha-256=" + String(repeating: "ab", count: 32)),
                bytesPerSecondLimit: 500, connections: 4,
                cookies: CookieJar(cookies: [CookieJar.Cookie(domain: "x", path: "/", name: "s", value: "1")]),
                mirrors: ["http://m1/a", "http://m2/a"], label: "the a file")
            request.secretHeaders = ["X-Own"]
            var record = StoredDownload(
                key: "file:/d/a", definition: request, destination: "/d/a", priority: 10, owner: "7.1", now: 2)
            record.bytes = 3
            record.totalBytes = 9
            record.hook = "on-complete exited 0"
            let id = try #require(try store.insert([record]).first)
            record.id = id.rawValue

            // What a secret-free request is: the same request with only its plain headers.
            func withoutSecrets(_ record: StoredDownload) -> StoredDownload {
                var expected = record
                let given = record.definition
                expected.definition.headers = given.headers.filter { !given.isSecret($0.name) }
                expected.definition.secretHeaders = []
                expected.definition.cookies = nil
                return expected
            }
            let inserted = try Self.stored(store, id)
            #expect(inserted == withoutSecrets(record))
            #expect(inserted.definition.headers.map(\.name) == ["X-Trace"])
            #expect(inserted.definition.credentials == nil && inserted.definition.cookies == nil)
            #expect(try store.allDownloads() == [withoutSecrets(record)])

            record.key = "url:/e\nhttp://x/b"
            record.definition = DownloadRequest(
                url: "http://x/b", destination: .directory("/e"), headers: [("Accept", "*/*"), ("Cookie", "c=1")],
                connections: 2, label: "b")
            record.destination = "/e/b.iso"
            record.priority = -5
            try record.move(to: .running, at: 3)
            try record.move(to: .failed, at: 4, error: HaulError(.network, "gone", status: 503))
            record.bytes = 11
            record.totalBytes = 13
            record.bytesPerSecond = 17.5
            record.owner = "42.1"
            record.hook = nil
            record.createdAt = 19
            record.startedAt = 23
            record.finishedAt = 29
            record.updatedAt = 31
            try store.update([record])
            let updated = try Self.stored(store, id)
            #expect(updated == withoutSecrets(record))
            #expect(updated.definition.headers.map(\.name) == ["Accept"])
            #expect(updated.state == .failed && updated.storedError?.code == .network && updated.errorStatus == 503)
            #expect(updated.storedError?.message == "gone")

            // An empty text stays empty (not NULL); any text keeps its exact characters. The key and
            // the file stay as they are, the request and the rest change.
            try record.move(to: .queued, at: 37)
            record.hook = ""
            record.errorMessage = "gone: \"é\" ✓"
            record.url = "http://x/c"
            record.definition.label = "c"
            record.bytes = 12
            record.owner = nil
            try store.update([record])
            let again = try Self.stored(store, id)
            #expect(again.hook == "" && again.errorMessage == "gone: \"é\" ✓")
            #expect(again == withoutSecrets(record))
        }
    }

    /// The manager's writes never touch a record's request: one another store has just set stays,
    /// whether the record is updated outright or as a change that waited.
    @Test(arguments: QueueStoreKind.all)
    func anUpdateKeepsTheRequestAnotherStoreSet(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let mine = try storage.open()
            let other = try storage.open()
            var first = Self.record("a", owner: "1.1")
            var second = Self.record("b", owner: "1.1")
            let ids = try mine.insert([first, second])
            first.id = ids[0].rawValue
            second.id = ids[1].rawValue
            #expect(try other.setRequest(.pause, for: ids[0], ifOwnedBy: "1.1"))
            #expect(try other.setRequest(.removeFiles, for: ids[1], ifOwnedBy: "1.1"))
            first.bytes = 100
            second.bytes = 200
            try mine.commit(QueueChanges(updatesIfPresent: [second], updates: [first]))
            let a = try Self.stored(other, ids[0])
            let b = try Self.stored(other, ids[1])
            #expect(a.bytes == 100 && a.request == .pause)
            #expect(b.bytes == 200 && b.request == .removeFiles)
        }
    }

    /// An update of a record that is gone fails the whole transaction with a ``HaulError/Code/database``
    /// error and writes nothing; as a change that waited it is skipped and the rest is written.
    @Test(arguments: QueueStoreKind.all)
    func anUpdateOfARecordThatIsGoneFailsUnlessItMayBe(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            var present = Self.record("a")
            present.id = try store.insert([present])[0].rawValue
            var missing = Self.record("b")
            missing.id = 999
            present.bytes = 5
            let error = await expectHaulError(.database) {
                try store.commit(QueueChanges(updates: [present, missing], inserts: [Self.record("c")]))
            }
            #expect(error?.message.contains("not found") == true, "\(error?.message ?? "")")
            #expect(try store.allDownloads().map(\.bytes) == [0])

            try store.commit(QueueChanges(updatesIfPresent: [missing, present]))
            #expect(try store.allDownloads().map(\.bytes) == [5])
            #expect(try store.download(DownloadID(999)) == nil)
        }
    }

    /// A batch is added all together or not at all: a key taken twice in it, or by a stored record,
    /// adds nothing (and changes nothing else the transaction held) and throws.
    @Test(arguments: QueueStoreKind.all)
    func aBatchWithATakenKeyAddsNothing(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            await expectHaulError(.database) {
                try store.insert([Self.record("a"), Self.record("b"), Self.record("a", now: 2)])
            }
            #expect(try store.allDownloads().isEmpty)

            var kept = Self.record("k")
            kept.id = try store.insert([kept])[0].rawValue
            kept.bytes = 7
            await expectHaulError(.database) {
                try store.commit(QueueChanges(updates: [kept], inserts: [Self.record("n"), Self.record("k")]))
            }
            let all = try store.allDownloads()
            #expect(all.map(\.key) == ["file:/d/k"] && all[0].bytes == 0)

            // The IDs a batch is given come in its order.
            let ids = try store.insert([Self.record("x"), Self.record("y"), Self.record("z")])
            #expect(ids.count == 3 && ids == ids.sorted() && Set(ids).count == 3)
            #expect(try ids.map { try Self.stored(store, $0).key } == ["file:/d/x", "file:/d/y", "file:/d/z"])
        }
    }

    /// IDs grow and are never given out again, not even the last one after it is deleted; a delete
    /// removes only its record, and deleting what is gone is no error.
    @Test(arguments: QueueStoreKind.all)
    func idsGrowAndAreNotReusedAfterADelete(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            let first = try store.insert([Self.record("a"), Self.record("b")])
            let third = try store.insert([Self.record("c")])[0]
            #expect(first[0] < first[1] && first[1] < third)
            try store.delete(third)
            try store.delete(first[0])
            try store.delete(third)
            #expect(try store.download(third) == nil && store.download(first[0]) == nil)
            #expect(try store.allDownloads().map(\.downloadID) == [first[1]])
            let next = try store.insert([Self.record("c")])[0]
            #expect(next > third)
            // Deletes go in a transaction with the rest.
            try store.commit(QueueChanges(inserts: [Self.record("d")], deletes: [next]))
            #expect(try store.allDownloads().map(\.key) == ["file:/d/b", "file:/d/d"])
            // Another store on the same storage goes on from there.
            let reopened = try storage.open()
            #expect(try reopened.insert([Self.record("e")])[0] > next)
        }
    }

    /// A request is written only while the named process owns the download; clearing it works
    /// whoever owns the download, and on a download that is gone.
    @Test(arguments: QueueStoreKind.all)
    func aRequestIsSetOnlyWhileTheOwnerMatches(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            let ids = try store.insert([Self.record("a", owner: "1.1"), Self.record("b")])
            #expect(try !store.setRequest(.cancel, for: ids[0], ifOwnedBy: "2.1"))
            #expect(try Self.stored(store, ids[0]).request == nil)
            #expect(try !store.setRequest(.cancel, for: ids[1], ifOwnedBy: "1.1"))
            #expect(try !store.setRequest(.cancel, for: DownloadID(999), ifOwnedBy: "1.1"))
            #expect(try store.setRequest(.cancel, for: ids[0], ifOwnedBy: "1.1"))
            #expect(try Self.stored(store, ids[0]).request == .cancel)
            // A later request replaces an earlier one.
            #expect(try store.setRequest(.remove, for: ids[0], ifOwnedBy: "1.1"))
            #expect(try Self.stored(store, ids[0]).request == .remove)
            try store.clearRequest(for: ids[0])
            #expect(try Self.stored(store, ids[0]).request == nil)
            try store.clearRequest(for: DownloadID(999))
        }
    }

    /// Each owner is told only what was asked of its own downloads, in ID order.
    @Test(arguments: QueueStoreKind.all)
    func pendingRequestsAreListedPerOwner(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            let ids = try store.insert([
                Self.record("a", owner: "1.1"), Self.record("b", owner: "2.1"), Self.record("c", owner: "1.1"),
                Self.record("d", owner: "1.1"), Self.record("e"),
            ])
            #expect(try store.setRequest(.removeFiles, for: ids[3], ifOwnedBy: "1.1"))
            #expect(try store.setRequest(.pause, for: ids[0], ifOwnedBy: "1.1"))
            #expect(try store.setRequest(.cancel, for: ids[1], ifOwnedBy: "2.1"))
            func pending(_ owner: String) throws -> [String] {
                try store.pendingRequests(for: owner).map { "\($0.id) \($0.request.rawValue)" }
            }
            #expect(try pending("1.1") == ["\(ids[0]) pause", "\(ids[3]) remove-files"])
            #expect(try pending("2.1") == ["\(ids[1]) cancel"])
            #expect(try pending("3.1").isEmpty)
            try store.clearRequest(for: ids[0])
            #expect(try pending("1.1") == ["\(ids[3]) remove-files"])
            try store.delete(ids[3])
            #expect(try pending("1.1").isEmpty)
        }
    }

    /// Two stores on the same storage (two processes) writing at once lose nothing: every update,
    /// every new record and every request of either is there afterwards, and each store reads what
    /// the other committed.
    @Test(arguments: QueueStoreKind.all)
    func twoStoresWritingAtOnceLoseNoUpdates(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let stores = [try storage.open(), try storage.open()]
            let ids = try stores[0].insert([Self.record("0", owner: "1.1"), Self.record("1", owner: "2.1")])
            var records = try ids.map { try Self.stored(stores[1], $0) }
            let rounds = 60
            let added = try await withThrowingTaskGroup(of: [DownloadID].self) { group in
                for side in 0..<2 {
                    let store = stores[side]
                    var record = records[side]
                    let otherID = ids[1 - side]
                    let otherOwner = side == 0 ? "2.1" : "1.1"
                    group.addTask {
                        var added: [DownloadID] = []
                        for round in 1...rounds {
                            record.bytes = Int64(round)
                            try store.update([record])
                            if round % 10 == 0 {
                                added += try store.insert([
                                    Self.record("\(side)-\(round)"), Self.record("\(side)+\(round)"),
                                ])
                            }
                            if round == rounds / 2 {
                                #expect(try store.setRequest(.pause, for: otherID, ifOwnedBy: otherOwner))
                            }
                        }
                        return added
                    }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
            #expect(added.count == 2 * 2 * rounds / 10 && Set(added).count == added.count)
            for store in stores {
                let all = try store.allDownloads()
                #expect(all.count == 2 + added.count)
                #expect(Set(all.map(\.downloadID)) == Set(ids + added))
                let both = all.filter { ids.contains($0.downloadID) }
                #expect(both.map(\.bytes) == [Int64(rounds), Int64(rounds)])
                #expect(both.map(\.request) == [.pause, .pause])
            }
            // What one store commits, the other reads at once.
            records[0].hook = "seen"
            try stores[0].update([records[0]])
            #expect(try Self.stored(stores[1], ids[0]).hook == "seen")
        }
    }

    /// Storage found damaged gives one ``HaulError/Code/database`` error that says so and what to
    /// do (the store's advice), in one line, whether opening or the first read meets the damage.
    @Test(arguments: QueueStoreKind.all)
    func damagedStorageSaysToMoveItAside(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            do {
                let store = try storage.open()
                try store.insert((0..<50).map { Self.record("\($0)") })
            }
            try await storage.damage()
            let error = await expectHaulError(.database) {
                let store = try storage.open()
                _ = try store.allDownloads()
            }
            let message = error?.message ?? ""
            #expect(message.contains("is damaged") && message.contains(storage.advice), "\(message)")
            #expect(!message.contains("\n"))
        }
    }

    /// `count` records, key `0`… in order, each moved to the state `states` gives it by position
    /// (cycling), stored in one batch; returns them with their IDs.
    static func stored(
        _ store: any QueueStore, count: Int, states: [DownloadState] = [.queued],
        owner: (Int) -> String? = { _ in nil },
        priority: (Int) -> Int = { _ in 0 }
    ) throws -> [StoredDownload] {
        var records = try (0..<count).map { position in
            var record = Self.record("\(position)", owner: owner(position))
            record.priority = priority(position)
            switch states[position % states.count] {
            case .queued: break
            case .running: try record.move(to: .running, at: 2)
            case .paused: try record.move(to: .paused, at: 2)
            case .completed: try record.move(to: .completed, at: 2)
            case .failed:
                try record.move(to: .running, at: 2)
                try record.move(to: .failed, at: 3, error: HaulError(.network, "gone"))
            case .cancelled: try record.move(to: .cancelled, at: 2)
            }
            return record
        }
        for (position, id) in try store.insert(records).enumerated() { records[position].id = id.rawValue }
        return records
    }

    /// Pages by ID and by offset read records in ID order, only those of the states asked for,
    /// never past the end; a record deleted before a keyset page's place moves nothing.
    @Test(arguments: QueueStoreKind.all)
    func pagesReadRecordsInIDOrderByStates(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            let records = try Self.stored(store, count: 30, states: [.queued, .paused, .failed])
            let ids = records.map(\.downloadID)
            #expect(try store.downloads(in: nil, after: nil, limit: 7).map(\.downloadID) == Array(ids[0..<7]))
            #expect(try store.downloads(in: nil, after: ids[6], limit: 7).map(\.downloadID) == Array(ids[7..<14]))
            #expect(try store.downloads(in: nil, after: ids[27], limit: 7).map(\.downloadID) == Array(ids[28...]))
            #expect(try store.downloads(in: nil, after: ids[29], limit: 7).isEmpty)
            #expect(try store.downloads(in: nil, after: nil, limit: 0).isEmpty)
            let failed = records.filter { $0.state == .failed }.map(\.downloadID)
            #expect(try store.downloads(in: [.failed], after: nil, limit: 100).map(\.downloadID) == failed)
            #expect(
                try store.downloads(in: [.failed], after: failed[2], limit: 2).map(\.downloadID) == [
                    failed[3], failed[4],
                ])
            let some = records.filter { $0.state != .paused }.map(\.downloadID)
            #expect(try store.downloads(in: [.queued, .failed], after: nil, limit: 100).map(\.downloadID) == some)
            #expect(try store.downloads(in: [], after: nil, limit: 100).isEmpty)
            #expect(try store.downloads(in: [.completed], after: nil, limit: 100).isEmpty)
            // Records read back whole.
            #expect(try store.downloads(in: nil, after: nil, limit: 100) == records)

            #expect(try store.downloads(in: nil, offset: 0, limit: 5).map(\.downloadID) == Array(ids[0..<5]))
            #expect(try store.downloads(in: nil, offset: 12, limit: 5).map(\.downloadID) == Array(ids[12..<17]))
            #expect(try store.downloads(in: nil, offset: 28, limit: 5).map(\.downloadID) == Array(ids[28...]))
            #expect(try store.downloads(in: nil, offset: 30, limit: 5).isEmpty)
            #expect(try store.downloads(in: nil, offset: 3, limit: 0).isEmpty)
            #expect(try store.downloads(in: [.failed], offset: 3, limit: 4).map(\.downloadID) == Array(failed[3..<7]))
            #expect(
                try store.downloads(in: [.queued, .failed], offset: 15, limit: 9).map(\.downloadID)
                    == Array(some[15...]))

            try store.delete(ids[3])
            #expect(try store.downloads(in: nil, after: ids[6], limit: 2).map(\.downloadID) == [ids[7], ids[8]])
            #expect(try store.downloads(in: nil, offset: 6, limit: 2).map(\.downloadID) == [ids[7], ids[8]])
        }
    }

    /// The line in the order downloads start: higher priority first, then older; only the states
    /// asked for, a page at an offset.
    @Test(arguments: QueueStoreKind.all)
    func pagesReadTheLineInTheOrderItStarts(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            let priorities = [0, 5, 0, -3, 5, 0, 9, 0, -3, 0, 5, 0]
            let records = try Self.stored(
                store, count: priorities.count, states: [.queued, .paused, .failed], priority: { priorities[$0] })
            let line = records.filter { $0.state != .failed }
                .sorted { $0.priority != $1.priority ? $0.priority > $1.priority : $0.downloadID < $1.downloadID }
                .map(\.downloadID)
            #expect(line.count == 8)
            #expect(
                try store.downloadsInStartOrder(in: [.queued, .paused], offset: 0, limit: 100).map(\.downloadID) == line
            )
            #expect(
                try store.downloadsInStartOrder(in: [.queued, .paused], offset: 3, limit: 4).map(\.downloadID)
                    == Array(line[3..<7]))
            #expect(try store.downloadsInStartOrder(in: [.queued, .paused], offset: 8, limit: 4).isEmpty)
            #expect(try store.downloadsInStartOrder(in: [.queued, .paused], offset: 0, limit: 0).isEmpty)
            let queued = records.filter { $0.state == .queued }
                .sorted { $0.priority != $1.priority ? $0.priority > $1.priority : $0.downloadID < $1.downloadID }
            #expect(try store.downloadsInStartOrder(in: [.queued], offset: 0, limit: 100) == queued)
        }
    }

    /// Counts come per state in one read; states without records are absent.
    @Test(arguments: QueueStoreKind.all)
    func countsArePerState(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            #expect(try store.counts().isEmpty)
            #expect(try store.newestID() == nil)
            let records = try Self.stored(
                store, count: 10, states: [.queued, .queued, .running, .completed, .cancelled])
            #expect(try store.counts() == [.queued: 4, .running: 2, .completed: 2, .cancelled: 2])
            try store.delete(records[2].downloadID)
            #expect(try store.counts() == [.queued: 4, .running: 1, .completed: 2, .cancelled: 2])
            #expect(try store.newestID() == records[9].downloadID)
            // A change of state moves a record from one count to the other; other changes move none.
            var started = try Self.stored(store, records[0].downloadID)
            try started.move(to: .running, at: 40)
            var unchanged = try Self.stored(store, records[3].downloadID)
            unchanged.bytes = 1
            try store.update([started, unchanged])
            #expect(try store.counts() == [.queued: 3, .running: 2, .completed: 2, .cancelled: 2])
            try started.move(to: .queued, at: 41)
            try store.update([started])
            var sized = try Self.stored(store, records[0].downloadID)
            sized.bytes = 5
            sized.totalBytes = 9
            var other = try Self.stored(store, records[1].downloadID)
            other.bytes = 3
            try store.update([sized, other])
            let totals = try store.totals()
            #expect(totals[.queued] == QueueTotals(count: 4, bytes: 8, totalBytes: 9, unknownTotals: 3))
            #expect(totals[.running] == QueueTotals(count: 1, bytes: 0, totalBytes: 0, unknownTotals: 1))
            #expect(totals[.failed] == nil && totals.count == 4)
        }
    }

    /// A record is found by its key and by its file; lookups of what is not stored find nothing.
    @Test(arguments: QueueStoreKind.all)
    func recordsAreFoundByKeyAndDestination(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            let records = try Self.stored(store, count: 3)
            #expect(try store.download(key: "file:/d/1") == records[1])
            #expect(try store.download(key: "file:/d/9") == nil)
            // With no download into a directory stored, none is found by file.
            #expect(try store.downloadsIntoDirectories(destinations: ["/d/1"]).isEmpty)
            var inDirectory = StoredDownload(
                key: "url:/d\nhttp://x/y",
                definition: DownloadRequest(url: "http://x/y", destination: .directory("/d")),
                destination: nil, priority: 0, owner: nil, now: 1)
            inDirectory.id = try store.insert([inDirectory])[0].rawValue
            #expect(try store.download(key: "url:/d\nhttp://x/y") == inDirectory)
            // A download into a directory learns its file later; two records may name one file.
            inDirectory.destination = "/d/2"
            try store.update([inDirectory])
            #expect(try store.downloads(destination: "/d/2") == [records[2], inDirectory])
            #expect(try store.downloads(destination: "/d/0") == [records[0]])
            #expect(try store.downloads(destination: "/d/none").isEmpty)
            // Many at once, each found once, in ID order.
            #expect(
                try store.downloads(keys: ["file:/d/2", "file:/d/0", "file:/d/9", "file:/d/0"]) == [
                    records[0], records[2],
                ])
            #expect(try store.downloads(keys: []).isEmpty)
            #expect(
                try store.downloads(ids: [
                    records[2].downloadID, records[0].downloadID, DownloadID(999), records[0].downloadID,
                ])
                    == [records[0], records[2]])
            #expect(try store.downloads(ids: []).isEmpty)
            // Only those in the states asked for (an IN list padded with its last ID included).
            var failed = records[1]
            try failed.move(to: .running, at: 2)
            try failed.move(to: .failed, at: 2)
            try store.update([failed])
            let asked = [records[2].downloadID, records[1].downloadID, records[0].downloadID]
            #expect(try store.downloads(ids: asked, in: [.failed]) == [failed])
            #expect(try store.downloads(ids: asked, in: [.queued, .paused]) == [records[0], records[2]])
            #expect(try store.downloads(ids: asked, in: []).isEmpty)
            #expect(try store.downloads(ids: asked, in: nil) == [records[0], failed, records[2]])
            #expect(try store.newestID() == inDirectory.downloadID)
            #expect(
                try store.downloadsIntoDirectories(destinations: ["/d/2", "/d/1", "/d/x"]) == [inDirectory])
            #expect(try store.downloadsIntoDirectories(destinations: ["/d/1"]).isEmpty)
            let many = (0..<1_200).map { "file:/d/\($0)" }
            #expect(try store.downloads(keys: many).count == 3)
        }
    }

    /// An owner's next queued records come best first: higher priority, then lower ID; other
    /// owners', ownerless and not queued records are left out.
    @Test(arguments: QueueStoreKind.all)
    func nextQueuedComeByPriorityThenID(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            let records = try Self.stored(
                store, count: 12, states: [.queued, .queued, .queued, .paused],
                owner: { [nil, "1.1", "1.1", "2.1"][$0 % 4] }, priority: { [0, 5, -5][$0 % 3] })
            let mine = records.filter { $0.owner == "1.1" && $0.state == .queued }
            let best = mine.sorted { ($0.priority, -$0.id!) > ($1.priority, -$1.id!) }.map(\.downloadID)
            #expect(try store.nextQueued(ownedBy: "1.1", limit: 100).map(\.downloadID) == best)
            #expect(try store.nextQueued(ownedBy: "1.1", limit: 2).map(\.downloadID) == Array(best.prefix(2)))
            #expect(try store.nextQueued(ownedBy: "2.1", limit: 100).isEmpty)
            #expect(try store.nextQueued(ownedBy: "3.1", limit: 100).isEmpty)
        }
    }

    /// Owners are listed once each; an owner's records (or the ownerless ones) page by ID and
    /// state; queued records change owner all at once, and an owner lets go of all but those it
    /// keeps.
    @Test(arguments: QueueStoreKind.all)
    func ownersRecordsAreReadAndReassignedTogether(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            let records = try Self.stored(
                store, count: 12, states: [.queued, .running, .paused], owner: { [nil, "1.1", "2.1"][$0 % 3] })
            #expect(try Set(store.owners()) == ["1.1", "2.1"])
            #expect(try store.owners().count == 2)
            func ids(_ selected: [StoredDownload]) -> [DownloadID] { selected.map(\.downloadID) }
            let ones = records.filter { $0.owner == "1.1" }
            #expect(try ids(store.downloads(ownedBy: "1.1", in: nil, after: nil, limit: 100)) == ids(ones))
            #expect(
                try ids(store.downloads(ownedBy: "1.1", in: nil, after: ones[0].downloadID, limit: 2))
                    == ids(Array(ones[1...2])))
            let unowned = records.filter { $0.owner == nil && $0.state == .queued }
            #expect(try ids(store.downloads(ownedBy: nil, in: [.queued], after: nil, limit: 100)) == ids(unowned))
            #expect(try store.downloads(ownedBy: "2.1", in: [.completed], after: nil, limit: 100).isEmpty)

            // Only queued records move: those of the owners named, and the ownerless when asked.
            let queuedOfTwo = records.filter { $0.owner == "2.1" && $0.state == .queued }.count
            let queuedOfNobody = records.filter { $0.owner == nil && $0.state == .queued }.count
            #expect(try store.reassignQueued(from: ["2.1"], includingUnowned: false, to: "3.1", now: 9) == queuedOfTwo)
            #expect(try store.reassignQueued(from: [], includingUnowned: true, to: "3.1", now: 9) == queuedOfNobody)
            #expect(try store.reassignQueued(from: [], includingUnowned: false, to: "3.1", now: 9) == 0)
            for record in records {
                let now = try Self.stored(store, record.downloadID)
                if record.state == .queued && record.owner != "1.1" {
                    #expect(now.owner == "3.1" && now.updatedAt == 9)
                } else {
                    #expect(now == record)
                }
            }
            #expect(try Set(store.owners()) == ["1.1", "2.1", "3.1"])

            let kept = ones[1].downloadID
            #expect(try store.release(ownedBy: "1.1", keeping: [kept], now: 10) == ones.count - 1)
            #expect(try store.owners().contains("1.1"))
            #expect(try store.download(kept)?.owner == "1.1")
            #expect(try store.release(ownedBy: "1.1", keeping: [], now: 10) == 1)
            #expect(try !store.owners().contains("1.1"))
            #expect(try ones.allSatisfy { try Self.stored(store, $0.downloadID).owner == nil })
        }
    }

    /// Two stores claiming queued records nobody owns at the same time never get the same one;
    /// each claim takes the best first, and never a record someone owns or that is not queued.
    @Test(arguments: QueueStoreKind.all)
    func claimsOfQueuedRecordsNeverOverlap(_ kind: QueueStoreKind) async throws {
        try await kind.withStorage { storage in
            let store = try storage.open()
            // 3 owned, 2 paused: never claimed; 3 of the rest have a higher priority.
            let records = try Self.stored(
                store, count: 205, states: [.queued],
                owner: { $0 < 3 ? "1.1" : nil }, priority: { [10, 11, 12].contains($0) ? 5 : 0 })
            try store.update(
                try records[3...4].map { record in
                    var record = record
                    try record.move(to: .paused, at: 3)
                    return record
                })
            let first = try store.claimQueued(for: "9.1", limit: 4, now: 7)
            #expect(first.map(\.key) == ["file:/d/10", "file:/d/11", "file:/d/12", "file:/d/5"])
            #expect(first.allSatisfy { $0.owner == "9.1" && $0.updatedAt == 7 && $0.state == .queued })
            let stores = [try storage.open(), try storage.open()]
            let claimed = try await withThrowingTaskGroup(of: [StoredDownload].self) { group in
                for (side, store) in stores.enumerated() {
                    group.addTask {
                        var mine: [StoredDownload] = []
                        while true {
                            let batch = try store.claimQueued(for: "\(side).2", limit: 7, now: 8)
                            guard !batch.isEmpty else { return mine }
                            mine += batch
                        }
                    }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
            let ids = (first + claimed).map(\.downloadID)
            #expect(ids.count == 200 && Set(ids).count == 200)
            #expect(Set(ids) == Set(records[5...].map(\.downloadID)))
            for record in try store.allDownloads() {
                let position = records.firstIndex { $0.downloadID == record.downloadID } ?? -1
                if position < 3 { #expect(record.owner == "1.1") }
                if position == 3 || position == 4 { #expect(record.owner == nil && record.state == .paused) }
            }
            #expect(try store.claimQueued(for: "9.1", limit: 4, now: 9).isEmpty)
        }
    }
}
