import HaulTestServer
import Synchronization
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

@Suite("Download manager", .timeLimit(.minutes(3))) struct DownloadManagerTests {
    @Test("runs as many downloads from one host at once as its limit allows, past the HTTP client's default of 8")
    func concurrencyLimitOnOneHost() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let count = 12
                for index in 0..<count {
                    server.add("/h\(index)", TestResource(name: "h\(index)", size: 96 * 1024))
                    // Slow enough (1.5 s each) that all of them overlap even on a loaded machine.
                    server.setStandingFaults("/h\(index)", [.throttle(bytesPerSecond: 64 * 1024)])
                }
                try await withManager(directory + "/state", managerConfiguration(limit: count)) { manager in
                    let requests = (0..<count).map {
                        DownloadRequest(url: server.url("/h\($0)"), destination: .file(directory + "/h\($0)"))
                    }
                    let ids = try await manager.enqueue(requests)
                    await manager.runUntilIdle()
                    for (index, id) in ids.enumerated() {
                        #expect(await manager.download(id)?.state == .completed)
                        #expect(try readFile(directory + "/h\(index)") == server.resource("/h\(index)")!.content)
                    }
                }
                #expect(server.maximumOpenConnections == count)
            }
        }
    }

    @Test("a file's final name appears only once its record says the download started and names the file")
    func theRecordNamesTheFileBeforeTheRename() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                server.add("/named", TestResource(name: "named", size: 20_000))
                // No group commit and no progress write comes on its own while the test looks.
                var configuration = managerConfiguration()
                configuration.commitInterval = .seconds(3600)
                configuration.stateUpdateInterval = .seconds(3600)
                try await withManager(directory + "/state", configuration) { manager in
                    let id = try await manager.enqueue(
                        DownloadRequest(url: server.url("/named"), destination: .directory(directory)))
                    let reader = try SQLiteQueueStore(path: directory + "/state/" + DownloadManager.databaseName)
                    await manager.start()
                    let clock = ContinuousClock()
                    let deadline = clock.now + .seconds(20)
                    while !POSIX.exists(directory + "/named") && clock.now < deadline {
                        try await Task.sleep(for: .milliseconds(1))
                    }
                    #expect(try readFile(directory + "/named") == server.resource("/named")!.content)
                    // A process killed now would leave this record: it must say whose file that is.
                    let record = try #require(try reader.download(id))
                    #expect(record.startedAt != nil)
                    #expect(record.destination == directory + "/named")
                    #expect(record.totalBytes == 20_000)
                    await manager.stop()
                }
            }
        }
    }

    @Test("a reader of failures hears only them, beside one that hears every event")
    func aReaderHearsOnlyTheEventsItWants() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                server.add("/a", TestResource(name: "a", size: 20_000))
                try await withManager(directory + "/state", managerConfiguration(limit: 2)) { manager in
                    let failures = manager.events { kind, state in
                        guard case .stateChanged = kind else { return false }
                        return state == .failed
                    }
                    let all = manager.events()
                    let good = try await manager.enqueue(
                        DownloadRequest(url: server.url("/a"), destination: .file(directory + "/a")))
                    let bad = try await manager.enqueue(
                        DownloadRequest(url: server.url("/missing"), destination: .file(directory + "/b")))
                    await manager.runUntilIdle()
                    await manager.close()
                    var heard: [DownloadManagerEvent] = []
                    for await event in failures { heard.append(event) }
                    var transfers = 0
                    for await event in all where event.download.id == good {
                        if case .transfer = event.kind { transfers += 1 }
                    }
                    #expect(transfers >= 2)
                    #expect(heard.map(\.download.id) == [bad])
                    #expect(heard.first?.download.state == .failed)
                }
            }
        }
    }

    @Test("never transfers more than the limit at once; the next starts once one has all its bytes")
    func concurrencyLimit() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                for index in 0..<6 {
                    server.add("/f\(index)", TestResource(name: "f\(index)", size: 192 * 1024))
                    server.setStandingFaults("/f\(index)", [.throttle(bytesPerSecond: 512 * 1024)])
                }
                try await withManager(directory + "/state", managerConfiguration(limit: 2)) { manager in
                    let seen = Mutex<[DownloadManagerEvent]>([])
                    let events = manager.events()
                    let watcher = Task {
                        for await event in events { seen.withLock { $0.append(event) } }
                    }
                    var ids: [DownloadID] = []
                    for index in 0..<6 {
                        ids.append(
                            try await manager.enqueue(
                                DownloadRequest(
                                    url: server.url("/f\(index)"), destination: .file(directory + "/f\(index)"))
                            ))
                    }
                    await manager.runUntilIdle()
                    for (index, id) in ids.enumerated() {
                        let info = try #require(await manager.download(id))
                        #expect(info.state == .completed)
                        #expect(try readFile(directory + "/f\(index)") == server.resource("/f\(index)")!.content)
                    }
                    #expect(server.maximumOpenConnections == 2)
                    await manager.close()
                    await watcher.value
                    // Replaying the events: whenever one starts, at most two are still transferring (running
                    // with bytes to come), itself included; one whose bytes are all written is finishing and
                    // holds no place.
                    var latest: [DownloadID: DownloadInfo] = [:]
                    var peak = 0
                    var startsBesideAFinishingOne = 0
                    for event in seen.withLock({ $0 }) {
                        latest[event.download.id] = event.download
                        guard case .stateChanged = event.kind, event.download.state == .running else { continue }
                        let running = latest.values.filter { $0.state == .running }
                        let transferring = running.filter { $0.bytes < ($0.totalBytes ?? .max) }
                        peak = max(peak, transferring.count)
                        if running.count > transferring.count { startsBesideAFinishingOne += 1 }
                    }
                    #expect(peak == 2)
                    // Every start after the first two comes as another's bytes are all written, before
                    // its file is flushed and renamed.
                    #expect(startsBesideAFinishingOne == 4)
                }
            }
        }
    }

    @Test("higher priorities start first, FIFO within a priority")
    func priorities() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let plan: [(String, DownloadPriority)] = [
                    ("a", .low), ("b", .normal), ("c", .high), ("d", .normal), ("e", .high),
                    ("f", DownloadPriority(20)),
                ]
                for (name, _) in plan { server.add("/\(name)", TestResource(name: name, size: 4096)) }
                try await withManager(directory + "/state", managerConfiguration(limit: 1)) { manager in
                    for (name, priority) in plan {
                        try await manager.enqueue(
                            DownloadRequest(url: server.url("/\(name)"), destination: .file(directory + "/\(name)")),
                            priority: priority)
                    }
                    await manager.runUntilIdle()
                }
                #expect(server.requests.map(\.path) == ["/f", "/c", "/e", "/b", "/d", "/a"])
            }
        }
    }

    @Test("pause keeps the partial data and resume continues from it with Range and If-Range")
    func pauseAndResume() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "big", size: 3 << 20)
                server.add("/big", resource)
                server.setStandingFaults("/big", [.throttle(bytesPerSecond: 1 << 20)])
                let destination = directory + "/big"
                try await withManager(directory + "/state") { manager in
                    let id = try await manager.enqueue(
                        DownloadRequest(url: server.url("/big"), destination: .file(destination)))
                    let paused = try await whileRunning(manager) {
                        try await waitFor(manager, id) { $0.bytes >= 512 * 1024 }
                        try await manager.pause(id)
                        return try #require(await manager.download(id))
                    }
                    #expect(paused.state == .paused)
                    #expect(paused.totalBytes == resource.size)
                    let partial = try readFile(destination + ".haul.part")
                    #expect(Int64(partial.count) == paused.bytes)
                    #expect(partial == resource.bytes(0..<paused.bytes))
                    let manifest = try #require(try ManifestStore.load(DownloadPaths.open(destination)))
                    #expect(manifest.segments[0].durable == paused.bytes)

                    server.setStandingFaults("/big", [])
                    try await manager.resume(id)
                    await manager.runUntilIdle()
                    #expect(await manager.download(id)?.state == .completed)
                    #expect(try readFile(destination) == resource.content)
                    let last = try #require(server.requests(for: "/big").last)
                    #expect(last.header("Range") == "bytes=\(paused.bytes)-")
                    #expect(last.header("If-Range") == resource.entityTagValue)
                }
            }
        }
    }

    @Test("remove deletes the partial data, the manifest, the finished file when asked, and the record")
    func remove() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                server.add("/slow", TestResource(name: "slow", size: 4 << 20))
                server.setStandingFaults("/slow", [.throttle(bytesPerSecond: 1 << 20)])
                server.add("/done", TestResource(name: "done", size: 10_000))
                server.add("/kept", TestResource(name: "kept", size: 10_000))
                let state = directory + "/state"
                try await withManager(state) { manager in
                    let slow = try await manager.enqueue(
                        DownloadRequest(url: server.url("/slow"), destination: .file(directory + "/slow")))
                    let done = try await manager.enqueue(
                        DownloadRequest(url: server.url("/done"), destination: .file(directory + "/done")))
                    try await whileRunning(manager) {
                        try await waitFor(manager, done) { $0.state == .completed }
                        try await waitFor(manager, slow) { $0.bytes > 0 }
                        // Removing a running download stops it first.
                        try await manager.remove(slow)
                    }
                    #expect(await manager.download(slow) == nil)
                    #expect(listDirectory(directory) == ["done", "state"])

                    let kept = try await manager.enqueue(
                        DownloadRequest(url: server.url("/kept"), destination: .file(directory + "/kept")))
                    await manager.runUntilIdle()
                    try await manager.remove(done, deletingFiles: true)
                    try await manager.remove(kept)
                    #expect(listDirectory(directory) == ["kept", "state"])
                    #expect(await manager.downloads().isEmpty)
                    await expectHaulError(.unknownDownload) { try await manager.remove(done) }
                }
                // The records are gone from the database too.
                try await withManager(state) { manager in #expect(await manager.downloads().isEmpty) }
            }
        }
    }

    @Test("the same destination, or the same URL into the same directory, is one download")
    func sameDestinationTwice() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "one", size: 100_000)
                server.add("/one", resource)
                try await withManager(directory + "/state") { manager in
                    let first = try await manager.enqueue(
                        DownloadRequest(url: server.url("/one"), destination: .file(directory + "/one")))
                    let second = try await manager.enqueue(
                        DownloadRequest(url: server.url("/one"), destination: .file(directory + "/./one")))
                    #expect(first == second)
                    // Another URL for the file of a queued download is refused, naming that download.
                    let taken = await expectHaulError(.destinationExists) {
                        try await manager.enqueue(
                            DownloadRequest(url: server.url("/one?again"), destination: .file(directory + "/one")))
                    }
                    #expect(taken?.downloadID == first)
                    #expect(taken?.message.contains("--force") == true)
                    let third = try await manager.enqueue(
                        DownloadRequest(url: server.url("/one"), destination: .directory(directory + "/sub")))
                    let fourth = try await manager.enqueue(
                        DownloadRequest(url: server.url("/one"), destination: .directory(directory + "/sub/")))
                    #expect(third == fourth)
                    #expect(third != first)
                    try POSIX.makeDirectories(directory + "/sub")
                    await manager.runUntilIdle()
                    #expect(server.requests(for: "/one").count == 2)
                    #expect(try readFile(directory + "/one") == resource.content)
                    #expect(try readFile(directory + "/sub/one") == resource.content)
                    // A completed download whose file is in place is reported complete, not fetched again.
                    let again = try await manager.enqueue(
                        DownloadRequest(url: server.url("/one"), destination: .file(directory + "/one")))
                    #expect(again == first)
                    #expect(await manager.download(again)?.state == .completed)
                    let resolved = try await manager.enqueue(
                        DownloadRequest(url: server.url("/one"), destination: .file(directory + "/sub/one")))
                    #expect(resolved == third)
                    await manager.runUntilIdle()
                    #expect(server.requests(for: "/one").count == 2)
                    // A file Haul did not download is never taken over.
                    try writeFile(directory + "/other", [1, 2, 3])
                    await expectHaulError(.destinationExists) {
                        try await manager.enqueue(
                            DownloadRequest(url: server.url("/one"), destination: .file(directory + "/other")))
                    }
                    #expect(try readFile(directory + "/other") == [1, 2, 3])
                }
            }
        }
    }

    @Test("a download left queued by a process that is gone takes a refreshed URL, as a paused one does")
    func aDownloadLeftQueuedTakesARefreshedURL() async throws {
        try await withTemporaryDirectory { directory in
            let destination = directory + "/file.iso"
            let first = try await withManager(directory + "/state") { manager in
                try await manager.enqueue(
                    DownloadRequest(url: "http://127.0.0.1:9/signed?sig=old", destination: .file(destination)))
            }
            // The queue never ran: the download is left queued, and nobody's. A manager that leaves
            // such downloads alone (as haul get's does) takes the new link for it.
            var leaving = managerConfiguration()
            leaving.restoredDownloads = .leave
            try await withManager(directory + "/state", leaving) { manager in
                #expect(await manager.download(first)?.state == .queued)
                let again = try await manager.enqueue(
                    DownloadRequest(url: "http://127.0.0.1:9/signed?sig=new", destination: .file(destination)))
                #expect(again == first)
                #expect(await manager.download(first)?.url == "http://127.0.0.1:9/signed?sig=new")
            }
        }
    }

    @Test("a manager that does not claim what it queues leaves it to the manager that runs the queue")
    func aManagerThatOnlyAddsLeavesItsDownloadsToNobody() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "added", size: 50_000)
                server.add("/added", resource)
                let state = directory + "/state"
                var adding = managerConfiguration()
                adding.restoredDownloads = .leave
                adding.claimsQueuedDownloads = false
                try await withManager(state, adding) { adder in
                    let stored = try SQLiteQueueStore(path: state + "/" + DownloadManager.databaseName)
                    let id = try await adder.enqueue(
                        DownloadRequest(url: server.url("/added"), destination: .file(directory + "/added")))
                    // Stored as nobody's, so closing has nothing to let go of; this manager never
                    // runs it.
                    #expect(try stored.download(id)?.owner == nil)
                    #expect(await adder.heldCount == 0)
                    await adder.runUntilIdle()
                    #expect(server.requests(for: "/added").isEmpty)
                    // The manager that runs the queue takes it, while the adder is still open.
                    try await withManager(state) { runner in
                        await runner.runUntilIdle()
                        #expect(await runner.download(id)?.state == .completed)
                    }
                    #expect(try readFile(directory + "/added") == resource.content)
                    // A manager that runs what it queues owns it from the start.
                    let owned = try await withManager(state) { runner in
                        let other = try await runner.enqueue(
                            DownloadRequest(url: server.url("/added"), destination: .file(directory + "/owned")))
                        #expect(try stored.download(other)?.owner == runner.claim.name)
                        return other
                    }
                    // Let go of when that manager closed.
                    #expect(try stored.download(owned)?.owner == nil)
                }
            }
        }
    }

    @Test("a download another manager added after this one opened can be paused, resumed and removed here")
    func controlsADownloadAddedLater() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "later", size: 100_000)
                server.add("/later", resource)
                let state = directory + "/state"
                try await withManager(state) { first in
                    let id = try await withManager(state) { second in
                        try await second.enqueue(
                            DownloadRequest(url: server.url("/later"), destination: .file(directory + "/later")))
                    }
                    // Read from the database, though added after the first manager opened.
                    #expect(await first.download(id)?.state == .queued)
                    try await first.pause(id)
                    #expect(await first.download(id)?.state == .paused)
                    try await first.resume(id)
                    await first.runUntilIdle()
                    #expect(await first.download(id)?.state == .completed)
                    #expect(try readFile(directory + "/later") == resource.content)
                    try await first.remove(id, deletingFiles: true)
                    #expect(await first.download(id) == nil)
                    #expect(!POSIX.exists(directory + "/later"))
                    await expectHaulError(.unknownDownload) { try await first.pause(id) }
                }
            }
        }
    }

    @Test("resume with a refreshed URL keeps the partial data when the validator matches")
    func resumeWithNewURL() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "signed", size: 4 << 20)
                server.add("/old/signed", resource)
                server.add("/new/signed", resource)
                server.setStandingFaults("/old/signed", [.throttle(bytesPerSecond: 1 << 20)])
                let destination = directory + "/signed.bin"
                try await withManager(directory + "/state") { manager in
                    let id = try await manager.enqueue(
                        DownloadRequest(url: server.url("/old/signed"), destination: .file(destination)))
                    let paused = try await whileRunning(manager) {
                        try await waitFor(manager, id) { $0.bytes >= 256 * 1024 }
                        try await manager.pause(id)
                        return try #require(await manager.download(id))
                    }
                    // The old link has expired.
                    server.setStandingFaults("/old/signed", [.status(403)])
                    try await manager.resume(id, url: server.url("/new/signed"))
                    await manager.runUntilIdle()
                    let info = try #require(await manager.download(id))
                    #expect(info.state == .completed)
                    #expect(info.url == server.url("/new/signed"))
                    #expect(try readFile(destination) == resource.content)
                    let last = try #require(server.requests.last)
                    #expect(last.path == "/new/signed")
                    #expect(last.header("Range") == "bytes=\(paused.bytes)-")
                    #expect(last.header("If-Range") == resource.entityTagValue)
                }
            }
        }
    }

    @Test("stopping the manager checkpoints running downloads; a new manager continues them")
    func gracefulShutdownAndRestore() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "long", size: 4 << 20)
                server.add("/long", resource)
                server.setStandingFaults("/long", [.throttle(bytesPerSecond: 1 << 20)])
                let state = directory + "/state"
                let destination = directory + "/long"
                let stopped = try await withManager(state) { manager in
                    let id = try await manager.enqueue(
                        DownloadRequest(
                            url: server.url("/long"), destination: .file(destination),
                            headers: [("Authorization", "Bearer s3cret-token"), ("X-Trace", "kept")]))
                    return try await whileRunning(manager) {
                        try await waitFor(manager, id) { $0.bytes >= 256 * 1024 }
                        return id
                    }
                }
                let storedBytes = try #require(fileSize(destination + ".haul.part"))
                // No secret reaches the database.
                for file in listDirectory(state) where file.hasPrefix(DownloadManager.databaseName) {
                    let bytes = try readFile(state + "/" + file)
                    #expect(!String(decoding: bytes, as: UTF8.self).contains("s3cret-token"))
                }
                server.setStandingFaults("/long", [])
                try await withManager(state) { manager in
                    let info = try #require(await manager.download(stopped))
                    #expect(info.state == .queued)
                    #expect(info.bytes == storedBytes)
                    #expect(info.totalBytes == resource.size)
                    await manager.runUntilIdle()
                    #expect(await manager.download(stopped)?.state == .completed)
                }
                #expect(try readFile(destination) == resource.content)
                let last = try #require(server.requests(for: "/long").last)
                #expect(last.header("Range") == "bytes=\(storedBytes)-")
                #expect(last.header("X-Trace") == "kept")
                #expect(last.header("Authorization") == nil)
            }
        }
    }

    @Test("a download's own connection count is stored and used by the manager that runs it")
    func ownConnectionCountSurvivesAReopen() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "wide", size: 6 * 1024 * 1024 + 123)
                server.add("/wide", resource)
                server.setStandingFaults("/wide", [.throttle(bytesPerSecond: 2 << 20)])
                let state = directory + "/state"
                let id = try await withManager(state) { manager in
                    try await manager.enqueue(
                        DownloadRequest(
                            url: server.url("/wide"), destination: .file(directory + "/wide"), connections: 3))
                }
                // The next manager's downloader opens one connection by default: the stored count decides.
                try await withManager(state, downloader: segmentedConfiguration(connections: 1)) { manager in
                    #expect(await manager.download(id)?.request.connections == 3)
                    try await whileRunning(manager) {
                        let running = try await waitFor(manager, id) { $0.openConnections == 3 }
                        #expect(running.state == .running)
                        let done = try await waitFor(manager, id) { $0.state == .completed }
                        #expect(done.openConnections == nil && done.request.connections == 3)
                    }
                }
                #expect(try readFile(directory + "/wide") == resource.content)
                let ranges = server.requests(for: "/wide").compactMap { $0.header("Range") }
                #expect(Set(ranges.dropFirst().prefix(2)) == ["bytes=2097152-4194303", "bytes=4194304-6291578"])
            }
        }
    }

    @Test("a running download's progress reaches the database at each tick of the manager's clock")
    func progressIsStoredAtEachTick() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "ticks", size: 4 << 20)
                server.add("/ticks", resource)
                server.setStandingFaults("/ticks", [.throttle(bytesPerSecond: 1 << 20)])
                let clock = ManualClock()
                try await withManager(directory + "/state", clock: clock) { manager in
                    let id = try await manager.enqueue(
                        DownloadRequest(url: server.url("/ticks"), destination: .file(directory + "/ticks")))
                    // What another process sees: the database.
                    let database = try SQLiteQueueStore(path: directory + "/state/" + DownloadManager.databaseName)
                    let stored = { @Sendable () throws -> Int64 in
                        try database.allDownloads().first { $0.downloadID == id }?.bytes ?? -1
                    }
                    try await whileRunning(manager) {
                        let running = try await waitFor(manager, id) { $0.bytes >= 256 * 1024 }
                        // In memory the bytes move; in the database they wait for the manager's tick.
                        let before = try stored()
                        #expect(running.state == .running && before == 0)
                        clock.advance(by: managerConfiguration().stateUpdateInterval)
                        try await waitUntil("the tick stores the progress") { try stored() >= 256 * 1024 }
                        await manager.pauseAll()
                    }
                }
            }
        }
    }

    @Test("events of one download end when it completes; aggregate progress is weighted by bytes")
    func eventsAndAggregate() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                server.add("/small", TestResource(name: "small", size: 100_000))
                server.add("/large", TestResource(name: "large", size: 900_000))
                try await withManager(directory + "/state") { manager in
                    let small = try await manager.enqueue(
                        DownloadRequest(url: server.url("/small"), destination: .file(directory + "/small")))
                    let large = try await manager.enqueue(
                        DownloadRequest(url: server.url("/large"), destination: .file(directory + "/large")))
                    try await manager.pause(large)
                    let events = await manager.events(for: small)
                    let states = try await whileRunning(manager) {
                        var states: [DownloadState] = []
                        var sawProgress = false
                        for await event in events {
                            switch event.kind {
                            case .stateChanged: states.append(event.download.state)
                            case .transfer(.progress): sawProgress = true
                            default: break
                            }
                        }
                        #expect(sawProgress)
                        return states
                    }
                    #expect(states == [.queued, .running, .completed])
                    let total = await manager.aggregateProgress()
                    #expect(total.bytes == 100_000)
                    #expect(total.completed == 1)
                    #expect(total.downloadsWithUnknownTotal == 1)
                    try await manager.resume(large)
                    await manager.runUntilIdle()
                    let done = await manager.aggregateProgress(of: [small, large])
                    #expect(done.bytes == 1_000_000 && done.totalBytes == 1_000_000 && done.fraction == 1)
                }
            }
        }
    }

    @Test("a finished file that vanished is reported; a missing partial starts again from zero")
    func reconcilesWithDisk() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "r", size: 1 << 20)
                server.add("/r", resource)
                server.add("/p", TestResource(name: "p", size: 4 << 20))
                server.setStandingFaults("/p", [.throttle(bytesPerSecond: 1 << 20)])
                let state = directory + "/state"
                let (done, partial) = try await withManager(state) { manager in
                    let done = try await manager.enqueue(
                        DownloadRequest(url: server.url("/r"), destination: .file(directory + "/r")))
                    let partial = try await manager.enqueue(
                        DownloadRequest(url: server.url("/p"), destination: .file(directory + "/p")))
                    try await whileRunning(manager) {
                        try await waitFor(manager, done) { $0.state == .completed }
                        try await waitFor(manager, partial) { $0.bytes > 0 }
                        try await manager.pause(partial)
                    }
                    return (done, partial)
                }
                #expect(unlink(directory + "/r") == 0)
                #expect(unlink(directory + "/p.haul.part") == 0)
                #expect(unlink(directory + "/p.haul.json") == 0)
                server.setStandingFaults("/p", [])
                try await withManager(state) { manager in
                    let vanished = try #require(await manager.download(done))
                    #expect(vanished.state == .failed)
                    #expect(vanished.error?.message.contains("no longer on disk") == true)
                    #expect(await manager.download(partial)?.bytes == 0)
                    try await manager.retry(done)
                    try await manager.resume(partial)
                    await manager.runUntilIdle()
                    #expect(await manager.download(done)?.state == .completed)
                    #expect(await manager.download(partial)?.state == .completed)
                }
                #expect(try readFile(directory + "/r") == resource.content)
                #expect(server.requests(for: "/p").last?.header("Range") == nil)
            }
        }
    }
}
