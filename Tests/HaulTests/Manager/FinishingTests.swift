import Dispatch
import HaulTestServer
import Synchronization
import Testing

@testable import Haul

/// A download whose file is complete and being made durable holds no place of the manager's limit.
/// One test at a time: held flushes take threads of the finisher's shared pool of 16.
@Suite("Finishing downloads", .serialized, .timeLimit(.minutes(1))) struct FinishingTests {
    /// Holds the data flush of the finished files whose name `holds` accepts until `release()`.
    final class HeldFlushes: Sendable {
        private let gate = DispatchSemaphore(value: 0)
        private let holds: @Sendable (String) -> Bool
        /// How many flushes are being held now.
        let waiting = Atomic<Int>(0)

        init(_ holds: @escaping @Sendable (String) -> Bool) { self.holds = holds }

        /// A downloader configuration whose finished files are flushed through here.
        func configuration() -> DownloaderConfiguration {
            var configuration = testConfiguration()
            configuration.flushFinishedData = { file in
                if self.holds(file.path) {
                    self.waiting.add(1, ordering: .relaxed)
                    // Never forever: a test that fails still ends.
                    _ = self.gate.wait(timeout: .now() + .seconds(30))
                    self.waiting.subtract(1, ordering: .relaxed)
                }
                try file.syncDataNow()
            }
            return configuration
        }

        /// Lets every held flush go on (and any later one that would be held).
        func release() {
            for _ in 0..<64 { gate.signal() }
        }
    }

    @Test func theNextDownloadStartsWhileTheLastIsFlushedAndRenamed() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resources = ["a", "b"].map { TestResource(name: $0, size: 4096) }
                for resource in resources { server.add("/\(resource.name)", resource) }
                let flushes = HeldFlushes { $0.hasSuffix("/a.haul.part") }
                defer { flushes.release() }
                try await withManager(
                    directory + "/state", managerConfiguration(limit: 1), downloader: flushes.configuration()
                ) { manager in
                    let ids = try await manager.enqueue(
                        ["a", "b"].map {
                            DownloadRequest(url: server.url("/\($0)"), destination: .file(directory + "/" + $0))
                        })
                    try await whileRunning(manager) {
                        // Let go before the manager stops, on a failure too (it waits for its flushes).
                        defer { flushes.release() }
                        // One place, taken by a until its bytes were all written: b is asked for while a's
                        // flush is held, a still running and not under its final name.
                        try await waitUntil("b is asked for", timeout: .seconds(20)) {
                            !server.requests(for: "/b").isEmpty
                        }
                        try await waitUntil("a's flush is held", timeout: .seconds(20)) {
                            flushes.waiting.load(ordering: .relaxed) == 1
                        }
                        #expect(await manager.download(ids[0])?.state == .running)
                        #expect(!POSIX.exists(directory + "/a"))
                        _ = try await waitFor(manager, ids[1], timeout: .seconds(20)) { $0.state == .completed }
                        flushes.release()
                        _ = try await waitFor(manager, ids[0], timeout: .seconds(20)) { $0.state == .completed }
                    }
                }
                #expect(try readFile(directory + "/a") == resources[0].content)
                #expect(try readFile(directory + "/b") == resources[1].content)
                #expect(server.requests.map(\.path) == ["/a", "/b"])
            }
        }
    }

    /// Twice the transfers (up to 64), a sixteenth of the files the process may open, from 8 to 256.
    @Test func howManyMayBeFinishingFollowsTheFileLimit() {
        #expect(DownloadManager.finishingLimit(transfers: 1, openFiles: 128) == 8)
        #expect(DownloadManager.finishingLimit(transfers: 16, openFiles: 128) == 32)
        #expect(DownloadManager.finishingLimit(transfers: 100, openFiles: 128) == 64)
        #expect(DownloadManager.finishingLimit(transfers: 3, openFiles: 1_024) == 64)
        #expect(DownloadManager.finishingLimit(transfers: 16, openFiles: 8_192) == 256)
        #expect(DownloadManager.finishingLimit(transfers: 16, openFiles: .max) == 256)
        // Without a limit given, the manager plans for the process's own, as the kernel tells it.
        if let soft = Self.softFileLimit() { #expect(POSIX.openFileLimit() == soft) }
    }

    /// A manager plans for the files it is told it may open, else for the process's limit, and
    /// for its limit on transfers as it is now.
    @Test func aManagerPlansForItsFilesAndItsTransfers() async throws {
        try await withTemporaryDirectory { directory in
            var configuration = managerConfiguration(limit: 3)
            configuration.openFileLimit = 256
            try await withManager(directory + "/given", configuration) { manager in
                #expect(await manager.finishingLimit == 16)
                await manager.setMaxConcurrentDownloads(20)
                #expect(await manager.finishingLimit == 40)
            }
            try await withManager(directory + "/own", managerConfiguration(limit: 3)) { manager in
                let expected = DownloadManager.finishingLimit(transfers: 3, openFiles: POSIX.openFileLimit())
                #expect(await manager.finishingLimit == expected)
            }
        }
    }

    /// The soft limit of open files as `/proc/self/limits` tells it (`Int.max` for unlimited);
    /// `nil` where there is no such file.
    static func softFileLimit() -> Int? {
        #if os(Linux)
            guard let text = try? String(contentsOfFile: "/proc/self/limits", encoding: .utf8),
                let line = text.split(separator: "\n").first(where: { $0.hasPrefix("Max open files") })
            else { return nil }
            let fields = line.dropFirst("Max open files".count).split(separator: " ")
            guard let soft = fields.first else { return nil }
            return soft == "unlimited" ? .max : Int(soft)
        #else
            return nil
        #endif
    }

    @Test func noMoreStartOnceManyAreFinishing() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                var configuration = managerConfiguration(limit: 1)
                // With one place and 128 files to open, 8 may be finishing at once.
                configuration.openFileLimit = 128
                let limit = 8
                let names = (0...limit).map { "f\($0)" }
                for name in names { server.add("/\(name)", TestResource(name: name, size: 1024)) }
                let flushes = HeldFlushes { _ in true }
                defer { flushes.release() }
                try await withManager(directory + "/state", configuration, downloader: flushes.configuration()) {
                    manager in
                    let ids = try await manager.enqueue(
                        names.map {
                            DownloadRequest(url: server.url("/\($0)"), destination: .file(directory + "/" + $0))
                        })
                    try await whileRunning(manager) {
                        // Let go before the manager stops, on a failure too (it waits for its flushes).
                        defer { flushes.release() }
                        // Each flush is held after its download was handed over and the manager looked for
                        // the next one to start.
                        try await waitUntil("\(limit) files are being finished", timeout: .seconds(20)) {
                            flushes.waiting.load(ordering: .relaxed) == limit
                        }
                        let states = await manager.downloads(ids: ids).map(\.state)
                        #expect(states == Array(repeating: .running, count: limit) + [.queued])
                        #expect(server.requests.count == limit)
                        flushes.release()
                        _ = try await waitFor(manager, ids[limit], timeout: .seconds(20)) { $0.state == .completed }
                    }
                    #expect(await manager.downloads(ids: ids).allSatisfy { $0.state == .completed })
                }
                #expect(server.requests.count == limit + 1)
                for name in names { #expect(POSIX.exists(directory + "/" + name)) }
            }
        }
    }

    /// A download that finds its file complete in the partial file another process left (with no
    /// `started` event, nothing being fetched) has its file's name recorded before the file takes
    /// it: a process killed right after the rename leaves a record that owns the file. (Without the
    /// name, the next run asked again, found the name taken, and failed the download.)
    @Test func aFileFoundCompleteHasItsNameRecordedBeforeTheRename() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "f", size: 100_000)
                server.add("/f", resource)
                let request = DownloadRequest(url: server.url("/f"), destination: .directory(directory + "/files"))
                // Another process's download: every byte written, kept in the partial file for a
                // checksum it did not match.
                var wrong = request
                wrong.checksum = try Checksum(parsing: "sha256=" + String(repeating: "0", count: 64))
                try await withDownloader { downloader in
                    await expectHaulError(.checksumMismatch) { try await downloader.download(wrong) }
                }
                #expect(POSIX.exists(directory + "/files/f.haul.part"))
                // This queue's download of the file, in a state of its own: what its record says as
                // the file is about to take its name.
                let state = directory + "/state"
                let queued = Mutex<DownloadID?>(nil)
                let recorded = Mutex<[String?]>([])
                var configuration = testConfiguration()
                configuration.writePermit = {
                    let store = try? SQLiteQueueStore(path: state + "/" + DownloadManager.databaseName)
                    if let id = queued.withLock({ $0 }), let record = try? store?.download(id) {
                        recorded.withLock { $0.append(record.destination) }
                    }
                    return true
                }
                try await withManager(state, managerConfiguration(limit: 1), downloader: configuration) { manager in
                    let id = try await manager.enqueue(request)
                    queued.withLock { $0 = id }
                    try await whileRunning(manager) {
                        _ = try await waitFor(manager, id, timeout: .seconds(20)) { $0.state == .completed }
                    }
                }
                // The permit is asked before each write; the last, before the rename.
                #expect(recorded.withLock { $0.last } == directory + "/files/f")
                #expect(try readFile(directory + "/files/f") == resource.content)
                #expect(server.requests(for: "/f").count == 1, "the second download fetched nothing")
            }
        }
    }
}
