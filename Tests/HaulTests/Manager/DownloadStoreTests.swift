import GRDB
import Testing

@testable import Haul

@Suite struct DownloadStoreTests {
    /// The manager's update statement lists its columns by hand; every managed column must land in
    /// its own place, and `request` (another process's word) must stay as it is.
    @Test func anUpdateWritesEveryManagedColumnAndKeepsTheRequest() async throws {
        try await withTemporaryDirectory { directory in
            let store = try DownloadStore(path: directory + "/downloads.sqlite")
            var record = StoredDownload(
                key: "file:/a", url: "http://x/a", directory: nil, destination: "/a", overwrite: false,
                checksum: nil, rateLimit: nil, priority: 0, state: DownloadState.queued.rawValue, bytes: 0,
                owner: nil, createdAt: 1, updatedAt: 1
            )
            try store.write { db in try record.insert(db) }
            try store.write { db in
                try db.execute(sql: "UPDATE download SET request = 'pause' WHERE id = ?", arguments: [record.id])
            }
            record.key = "url:/d\nhttp://x/b"
            record.url = "http://x/b"
            record.directory = "/d"
            record.destination = "/d/b"
            record.overwrite = true
            record.checksum = "sha-256=00"
            record.rateLimit = 7
            record.priority = 3
            record.state = DownloadState.failed.rawValue
            record.errorCode = "network"
            record.errorMessage = "gone"
            record.errorStatus = 503
            record.bytes = 11
            record.totalBytes = 13
            record.bytesPerSecond = 17.5
            record.owner = "42.1"
            record.createdAt = 19
            record.startedAt = 23
            record.finishedAt = 29
            record.updatedAt = 31
            try store.write { db in try record.updateManagedColumns(db) }
            let stored = try #require(try store.read { db in try StoredDownload.fetchOne(db, key: record.id) })
            var expected = record
            expected.request = "pause"
            #expect(stored == expected)

            // A record that is gone is reported, not silently skipped.
            var missing = record
            missing.id = 999
            let error = #expect(throws: HaulError.self) {
                try store.write { db in try missing.updateManagedColumns(db) }
            }
            #expect(error?.message.contains("not found") == true)
        }
    }
}
