import Foundation
import HaulPostgreSQL
import HaulTestServer
import Synchronization
import Testing

@testable import Haul

/// Download managers as workers of one queue in PostgreSQL (on the tests' server), writing into
/// one shared download root: each download runs on one worker at a time, whichever claims it.
/// One test at a time: each runs two or three workers, and all at once beside the rest of the
/// suite load two cores enough to fail the tests that measure time.
@Suite(.timeLimit(.minutes(2)), .serialized) struct FleetManagerTests {
    /// A worker of the queue at `location`: its own state directory, a lease on `clock`, and a
    /// `User-Agent` that names it, so the server tells the workers apart.
    /// `hostLimit`: a cap on connections to one host over every worker, when given; `netrc`:
    /// the worker's own credentials by host.
    static func worker(
        _ label: String, location: PostgreSQLLocation, root: String, state: String,
        clock: FleetLeaseTests.TestClock, limit: Int = 2, hostLimit: Int? = nil, netrc: Netrc? = nil,
        managerClock: any Clock<Duration> = ContinuousClock()
    ) throws -> DownloadManager {
        let store = try PostgreSQLQueueStore(location: location)
        let lease = try FleetLease(store: store, duration: 30, clock: clock.read)
        var transfer = testConfiguration()
        transfer.downloadRoots = [root]
        transfer.userAgent = "haul-\(label)"
        if let hostLimit {
            transfer.maxConnectionsPerHost = hostLimit
            transfer.sharedHostSlots = PostgreSQLHostSlots(
                store: try PostgreSQLQueueStore(location: location), lease: lease, limit: hostLimit,
                idleTimeout: .milliseconds(200), margin: .seconds(1),
                pollInterval: .milliseconds(20))
        }
        try POSIX.makePrivateDirectory(state + "/" + label, marker: ".")
        var configuration = managerConfiguration(limit: limit)
        configuration.netrc = netrc
        return try DownloadManager(
            store: store, ownership: lease, stateDirectory: state + "/" + label, configuration: configuration,
            downloaderConfiguration: transfer, logger: nil, clock: managerClock)
    }

    /// Runs `body` with a queue database of its own, the test server, and a temporary directory
    /// holding the download root the workers share.
    static func withFleet(
        _ body:
            @escaping @Sendable (PostgreSQLLocation, HaulTestServer, _ directory: String, _ root: String) async throws
            -> Void
    ) async throws {
        try await PostgreSQLTesting.withDatabase { location in
            try await HaulTestServer.withRunning { server in
                try await withTemporaryDirectory { directory in
                    let root = directory + "/root"
                    try POSIX.makePrivateDirectory(root, marker: ".")
                    try await body(location, server, directory, root)
                }
            }
        }
    }

    /// Waits until `condition` holds, at most 30 s.
    static func waitUntil(_ what: String, _ condition: () async throws -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while try await !condition() {
            guard ContinuousClock.now < deadline else { throw TestFailure("timed out waiting until \(what)") }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Downloads queued through one worker are run by both, each exactly once, into files that
    /// are byte for byte the server's; the queue ends with every one completed and nobody's.
    @Test func aSharedQueueRunsEachDownloadOnceOnEitherWorker() async throws {
        try await Self.withFleet { location, server, directory, root in
            let names = (1...12).map { "f\($0)" }
            for name in names { server.add("/" + name, TestResource(name: name, size: 256 << 10)) }
            // Slow enough that the second worker claims some while the first runs.
            server.limitBandwidth(bytesPerSecond: 4 << 20)
            let clock = FleetLeaseTests.TestClock()
            let a = try Self.worker("a", location: location, root: root, state: directory, clock: clock)
            let b = try Self.worker("b", location: location, root: root, state: directory, clock: clock)
            _ = try await a.enqueue(
                names.map { DownloadRequest(url: server.url("/" + $0), destination: .directory(root)) })
            async let first: Void = a.runUntilIdle()
            async let second: Void = b.runUntilIdle()
            _ = await (first, second)
            await a.close()
            await b.close()

            for name in names {
                let requests = server.requests(for: "/" + name)
                #expect(requests.count == 1, "\(name) was asked for \(requests.count) times")
                let expected = try #require(server.resource("/" + name)).bytes(0..<(256 << 10))
                #expect(try readFile(root + "/" + name) == expected, "\(name)")
            }
            let agents = Set(server.requests.compactMap { $0.header("User-Agent") })
            #expect(agents == ["haul-a", "haul-b"], "both workers ran downloads: \(agents)")
            let store = try PostgreSQLQueueStore(location: location)
            let records = try store.allDownloads()
            #expect(records.count == 12 && records.allSatisfy { $0.state == .completed && $0.owner == nil })
            #expect(try store.counts() == [.completed: 12])
        }
    }

    /// A worker whose lease ran out (cut off from the database longer than the lease) stops its
    /// downloads without writing them, gives them back when it joins again, and the download
    /// then resumes from its stored bytes (`Range` with `If-Range`) into the same file.
    @Test func aWorkerThatLostItsLeaseGivesItsDownloadsBackAndTheyResume() async throws {
        try await Self.withFleet { location, server, directory, root in
            let size: Int64 = 4 << 20
            server.add("/big", TestResource(name: "big", size: size))
            server.limitBandwidth(bytesPerSecond: 2 << 20)
            let clock = FleetLeaseTests.TestClock()
            let a = try Self.worker("a", location: location, root: root, state: directory, clock: clock)
            let id = try await a.enqueue(
                DownloadRequest(url: server.url("/big"), destination: .directory(root)))
            let run = Task { await a.run() }
            // Under way, with a checkpoint on disk.
            try await Self.waitUntil("the download wrote a checkpoint") {
                (await a.download(id)?.bytes ?? 0) > 256 << 10 && fileExists(root + "/big.haul.json")
            }
            // The worker is cut off for longer than its lease: it must stop writing.
            clock.advance(31)
            let reader = try PostgreSQLQueueStore(location: location)
            try await Self.waitUntil("the download completed after the lease was lost") {
                (try? reader.download(id))?.state == .completed
            }
            run.cancel()
            await run.value
            await a.close()
            let requests = server.requests(for: "/big")
            #expect(requests.count >= 2, "\(requests.count) requests")
            let resumed = try #require(requests.last)
            #expect(
                resumed.header("Range")?.hasPrefix("bytes=") == true && resumed.header("Range") != "bytes=0-")
            #expect(resumed.header("If-Range") != nil)
            let expected = try #require(server.resource("/big")).bytes(0..<size)
            #expect(try readFile(root + "/big") == expected)
            let record = try #require(try PostgreSQLQueueStore(location: location).download(id))
            #expect(record.owner == nil && record.errorCode == nil)
        }
    }

    /// Any worker shows which worker runs a download, and controls it: a pause asked of the
    /// other worker stops it there with its bytes kept, a resume through the other worker
    /// continues it from them (`Range` with `If-Range`), a remove asked while it runs again
    /// takes its record and partial data away, and pausing everything pauses what the other
    /// worker runs.
    @Test func anyWorkerShowsAndControlsADownloadAnotherWorkerRuns() async throws {
        try await Self.withFleet { location, server, directory, root in
            let size: Int64 = 4 << 20
            server.add("/big", TestResource(name: "big", size: size))
            server.add("/other", TestResource(name: "other", size: size))
            server.limitBandwidth(bytesPerSecond: 1 << 20)
            let clock = FleetLeaseTests.TestClock()
            let a = try Self.worker("a", location: location, root: root, state: directory, clock: clock)
            let b = try Self.worker("b", location: location, root: root, state: directory, clock: clock)
            let id = try await b.enqueue(DownloadRequest(url: server.url("/big"), destination: .directory(root)))
            // Only `a` runs downloads; `b` only answers, as a worker's API would.
            let run = Task { await a.run() }
            try await Self.waitUntil("a runs the download with a checkpoint on disk") {
                (await b.download(id)?.bytes ?? 0) > 256 << 10 && fileExists(root + "/big.haul.json")
            }
            #expect(a.workerName != nil && b.workerName != nil && a.workerName != b.workerName)
            #expect(await b.download(id)?.worker == a.workerName)
            #expect(try await b.downloads(in: [.running], after: nil, limit: 10).map(\.worker) == [a.workerName])

            let paused = try await b.pause(id)
            #expect(paused.state == .paused && paused.worker == nil)
            #expect(await a.download(id)?.state == .paused)
            let stored = try #require(try PostgreSQLQueueStore(location: location).download(id))
            #expect(stored.state == .paused && stored.owner == nil)
            #expect(fileExists(root + "/big.haul.part") && !fileExists(root + "/big"))

            try await b.resume(id)
            try await Self.waitUntil("the download completed after its resume") {
                await b.download(id)?.state == .completed
            }
            let requests = server.requests(for: "/big")
            let resumed = try #require(requests.last)
            #expect(requests.count == 2, "\(requests.count) requests")
            #expect(resumed.header("Range")?.hasPrefix("bytes=") == true && resumed.header("Range") != "bytes=0-")
            #expect(resumed.header("If-Range") != nil)
            #expect(try readFile(root + "/big") == (try #require(server.resource("/big")).bytes(0..<size)))

            let other = try await b.enqueue(
                DownloadRequest(url: server.url("/other"), destination: .directory(root)))
            try await Self.waitUntil("a runs the second download") {
                await b.download(other)?.worker == a.workerName && fileExists(root + "/other.haul.part")
            }
            try await b.remove(other, deletingFiles: true)
            #expect(await b.download(other) == nil)
            #expect(try PostgreSQLQueueStore(location: location).download(other) == nil)
            #expect(!fileExists(root + "/other.haul.part") && !fileExists(root + "/other.haul.json"))

            // Pausing everything through `b` pauses what `a` runs, and what waits.
            let more = try await b.enqueue(
                (1...3).map { DownloadRequest(url: server.url("/big"), destination: .file(root + "/copy\($0)")) })
            try await Self.waitUntil("a runs two downloads") {
                try await b.downloads(in: [.running], after: nil, limit: 10).count == 2
            }
            await b.pauseAll()
            let after = try PostgreSQLQueueStore(location: location).downloads(ids: more)
            #expect(after.map(\.state) == [.paused, .paused, .paused] && after.allSatisfy { $0.owner == nil })
            #expect(await a.downloads(ids: more).map(\.state) == [.paused, .paused, .paused])
            run.cancel()
            await run.value
            await a.close()
            await b.close()
        }
    }

    /// A worker's event stream tells what the other worker does: the downloads it adds, runs (with
    /// its name and its progress) and completes, and those it removes.
    @Test func aWorkersEventsShowWhatTheOtherWorkerDoes() async throws {
        try await Self.withFleet { location, server, directory, root in
            let names = (1...4).map { "e\($0)" }
            for name in names { server.add("/" + name, TestResource(name: name, size: 1 << 20)) }
            // Each worker runs two at once. Slow enough that b, its two slots full, cannot finish
            // them and take the other two before a claims some, even on a loaded machine (at 2 MiB/s
            // a CI run once saw b run all four).
            server.limitBandwidth(bytesPerSecond: 512 << 10)
            let clock = FleetLeaseTests.TestClock()
            let a = try Self.worker("a", location: location, root: root, state: directory, clock: clock)
            let b = try Self.worker("b", location: location, root: root, state: directory, clock: clock)
            let seen = Heard()
            let events = b.events()
            let reading = Task { for await event in events { seen.events.withLock { $0.append(event) } } }
            let runs = [Task { await a.run() }, Task { await b.run() }]
            // b listens before a adds what the test follows: a's probes (a missing file, which
            // fails at once) until b is told one was added.
            var probes = 0
            try await Self.waitUntil("b hears of a's probe") {
                probes += 1
                let probe = try await a.enqueue(
                    DownloadRequest(url: server.url("/probe\(probes)"), destination: .directory(root)))
                try await Task.sleep(for: .milliseconds(200))
                // Told as added: only a's notice says that (b's own events of a probe it claimed do not).
                return seen.events.withLock { events in
                    events.contains { event in
                        if case .added = event.kind { event.download.id == probe } else { false }
                    }
                }
            }
            let ids = try await a.enqueue(
                names.map { DownloadRequest(url: server.url("/" + $0), destination: .directory(root)) })
            let reader = try PostgreSQLQueueStore(location: location)
            try await Self.waitUntil("every download completed") {
                try reader.counts() == [.completed: 4, .failed: probes]
            }
            try await a.remove(ids[0])
            func kinds(of id: DownloadID) -> [String] {
                seen.events.withLock { events in
                    events.filter { $0.download.id == id }.map { event in
                        switch event.kind {
                        case .added: "added"
                        case .stateChanged: "\(event.download.state) \(event.download.worker ?? "-")"
                        case .transfer(.progress): "progress \(event.download.worker ?? "-")"
                        case .transfer: "transfer"
                        case .removed: "removed"
                        }
                    }
                }
            }
            try await Self.waitUntil("b heard of the removal") { kinds(of: ids[0]).last == "removed" }
            let worker = try #require(a.workerName)
            var ranOnA = 0
            for id in ids {
                let heard = kinds(of: id)
                // Added by a, told to b as such, unless b claimed it first.
                #expect(heard.first == "added" || heard.first?.hasPrefix("running ") == true, "\(id): \(heard)")
                #expect(heard.contains("completed -"), "\(id): \(heard)")
                guard heard.contains("running \(worker)") else { continue }
                // Every event of it (its completion too) told to b as a's doing, so that b runs no
                // hook and counts nothing of it.
                guard !heard.contains(where: { $0.hasPrefix("running ") && $0 != "running \(worker)" }) else {
                    continue
                }
                let told = seen.events.withLock { $0.filter { $0.download.id == id } }
                #expect(!told.isEmpty && told.allSatisfy { $0.isFromAnotherWorker }, "\(id)")
                ranOnA += 1
                #expect(heard.contains("progress \(worker)"), "\(id): \(heard)")
            }
            #expect(ranOnA >= 1, "a ran some of the downloads: \(ids.map { kinds(of: $0) })")
            for run in runs { run.cancel() }
            for run in runs { await run.value }
            await a.close()
            await b.close()
            await reading.value
        }
    }

    /// PostgreSQL stopped for 5 s while a worker runs downloads: they go on to their final files,
    /// but nothing is told complete until the database has recorded it; once it is back, the
    /// completions are written and told, and what waited in the queue runs too.
    @Test func aDatabaseOutageDelaysWhatIsToldNotTheDownloads() async throws {
        try await PostgreSQLTestServer.withOwnServer { database in
            try await HaulTestServer.withRunning { server in
                try await withTemporaryDirectory { directory in
                    let root = directory + "/root"
                    try POSIX.makePrivateDirectory(root, marker: ".")
                    let location = try PostgreSQLLocation(parsing: database.database.url)
                    let names = ["o1", "o2", "o3"]
                    for name in names { server.add("/" + name, TestResource(name: name, size: 2 << 20)) }
                    server.limitBandwidth(bytesPerSecond: 2 << 20)
                    let a = try Self.worker(
                        "a", location: location, root: root, state: directory, clock: FleetLeaseTests.TestClock())
                    let heard = Heard()
                    let events = a.events()
                    let reading = Task { for await event in events { heard.events.withLock { $0.append(event) } } }
                    func completions() -> [DownloadID] {
                        heard.events.withLock { events in
                            events.compactMap { event in
                                switch event.kind {
                                case .transfer(.completed): event.download.id
                                case .stateChanged where event.download.state == .completed: event.download.id
                                default: nil
                                }
                            }
                        }
                    }
                    let ids = try await a.enqueue(
                        names.map { DownloadRequest(url: server.url("/" + $0), destination: .directory(root)) })
                    let run = Task { await a.run() }
                    try await Self.waitUntil("two downloads run with checkpoints") {
                        fileExists(root + "/o1.haul.json") && fileExists(root + "/o2.haul.json")
                    }
                    let stopped = ContinuousClock.now
                    try await database.stop()
                    // The two running downloads finish their files while the database is away.
                    try await Self.waitUntil("the running downloads finished their files") {
                        fileExists(root + "/o1") && fileExists(root + "/o2")
                    }
                    try await Task.sleep(until: stopped + .seconds(5))
                    #expect(completions().isEmpty, "told complete before the database recorded it")
                    #expect(!fileExists(root + "/o3"))
                    try await database.start()

                    let reader = try PostgreSQLQueueStore(location: location)
                    try await Self.waitUntil("the queue records every download completed") {
                        (try? reader.counts()) == [.completed: 3]
                    }
                    try await Self.waitUntil("every completion is told") {
                        Set(completions()) == Set(ids) && completions().count == 6
                    }
                    for name in names {
                        let expected = try #require(server.resource("/" + name)).bytes(0..<(2 << 20))
                        #expect(try readFile(root + "/" + name) == expected, "\(name)")
                        #expect(server.requests(for: "/" + name).count == 1, "\(name)")
                    }
                    run.cancel()
                    await run.value
                    await a.close()
                    await reading.value
                }
            }
        }
    }

    /// A cap on connections to one host holds over every worker: three workers that could each
    /// open three never have more than two open at once between them, and every file is whole.
    /// Without the shared places they open more.
    @Test(arguments: [true, false])
    func aHostCapHoldsAcrossTheFleet(shared: Bool) async throws {
        try await Self.withFleet { location, server, directory, root in
            let names = (1...12).map { "h\($0)" }
            for name in names { server.add("/" + name, TestResource(name: name, size: 256 << 10)) }
            server.limitBandwidth(bytesPerSecond: 2 << 20)
            let clock = FleetLeaseTests.TestClock()
            let workers = try ["a", "b", "c"].map { label in
                try Self.worker(
                    label, location: location, root: root, state: directory, clock: clock, limit: 3,
                    hostLimit: shared ? 2 : nil)
            }
            _ = try await workers[0].enqueue(
                names.map { DownloadRequest(url: server.url("/" + $0), destination: .directory(root)) })
            await withDiscardingTaskGroup { group in
                for worker in workers { group.addTask { await worker.runUntilIdle() } }
            }
            // The places kept after the last requests go back to the queue once their connections closed.
            let host = try DownloadURL(server.url("/")).origin
            let reader = try PostgreSQLQueueStore(location: location)
            if shared { try await Self.waitUntil("every place is given back") { try reader.hostSlotsTaken(host) == 0 } }
            for worker in workers { await worker.close() }
            for name in names {
                let expected = try #require(server.resource("/" + name)).bytes(0..<(256 << 10))
                #expect(try readFile(root + "/" + name) == expected, "\(name)")
            }
            if shared {
                #expect(server.maximumOpenConnections <= 2, "\(server.maximumOpenConnections) connections at once")
            } else {
                #expect(server.maximumOpenConnections > 2, "the test would not see a cap missing")
            }
        }
    }

    /// The total rate is the fleet's: the workers that run downloads share it equally, one left
    /// running alone has it all again, and a rate set through one worker reaches the others.
    @Test func theFleetsRateIsSharedByTheWorkersThatDownload() async throws {
        try await Self.withFleet { location, server, directory, root in
            let names = (1...4).map { "r\($0)" }
            for name in names { server.add("/" + name, TestResource(name: name, size: 2 << 20)) }
            server.limitBandwidth(bytesPerSecond: 4 << 20)
            let clock = FleetLeaseTests.TestClock()
            let a = try Self.worker("a", location: location, root: root, state: directory, clock: clock)
            let b = try Self.worker("b", location: location, root: root, state: directory, clock: clock)
            let total: Int64 = 8 << 20
            await a.setBytesPerSecondLimit(total)
            await b.setBytesPerSecondLimit(total)
            #expect(a.rateLimiter.bytesPerSecond == total)
            let ids = try await a.enqueue(
                names.map { DownloadRequest(url: server.url("/" + $0), destination: .directory(root)) })
            let runs = [Task { await a.run() }, Task { await b.run() }]
            try await Self.waitUntil("both workers run downloads and share the rate") {
                let running = try await a.downloads(in: [.running], after: nil, limit: 10)
                return Set(running.compactMap(\.worker)).count == 2
                    && a.rateLimiter.bytesPerSecond == total / 2 && b.rateLimiter.bytesPerSecond == total / 2
            }
            // Set through b, the fleet's rate reaches a too.
            await b.setBytesPerSecondLimit(2 * total)
            try await Self.waitUntil("a follows the rate set through b") {
                await a.configuration.bytesPerSecondLimit == 2 * total
            }
            try await Self.waitUntil("every download completed") {
                await a.downloads(ids: ids).allSatisfy { $0.state == .completed }
            }
            try await Self.waitUntil("the rate is whole again once nobody shares it") {
                a.rateLimiter.bytesPerSecond == 2 * total && b.rateLimiter.bytesPerSecond == 2 * total
            }
            for run in runs { run.cancel() }
            for run in runs { await run.value }
            await a.close()
            await b.close()
        }
    }

    /// A download added without credentials through one worker is run by another with them from
    /// its own netrc, looked up when it starts; the queue never holds them, and a `default` entry
    /// is sent nowhere.
    @Test func aWorkerTakesCredentialsFromItsOwnNetrcWhenADownloadStarts() async throws {
        try await Self.withFleet { location, server, directory, root in
            var resource = TestResource(name: "private", size: 64 << 10)
            let credentials = BasicCredentials(user: "worker", password: "pass word")
            resource.requiredAuthorization = credentials.authorization
            server.add("/private", resource)
            let clock = FleetLeaseTests.TestClock()
            let netrc = try Netrc(parsing: "machine 127.0.0.1 login worker password \"pass word\"\n")
            let a = try Self.worker("a", location: location, root: root, state: directory, clock: clock)
            let b = try Self.worker("b", location: location, root: root, state: directory, clock: clock, netrc: netrc)
            let id = try await a.enqueue(DownloadRequest(url: server.url("/private"), destination: .directory(root)))
            // Only b runs downloads.
            await b.runUntilIdle()
            #expect(await a.download(id)?.state == .completed)
            #expect(try readFile(root + "/private") == resource.content)
            #expect(server.requests(for: "/private").map { $0.header("Authorization") } == [credentials.authorization])
            let stored = try #require(try PostgreSQLQueueStore(location: location).download(id))
            #expect(stored.definition.credentials == nil)
            #expect(!stored.definition.headers.contains { $0.name.lowercased() == "authorization" })
            await a.close()
            await b.close()

            // A netrc's `default` entry goes to no host: a client may name any URL to a worker.
            let c = try Self.worker(
                "c", location: location, root: root, state: directory, clock: clock,
                netrc: try Netrc(parsing: "default login worker password \"pass word\"\n"))
            let other = try await c.enqueue(
                DownloadRequest(url: server.url("/private"), destination: .file(root + "/again")))
            await c.runUntilIdle()
            #expect(await c.download(other)?.error?.status == 401)
            #expect(server.requests(for: "/private").last?.header("Authorization") == nil)
            await c.close()
        }
    }

    /// Another process holding a file's lock, as a worker whose manager has not yet noticed that
    /// its lease ran out holds the file of a download taken over from it. It lets go when
    /// ``release()`` ends it. (Told by a signal, not by the end of its input: a pipe's end never
    /// comes while any other process the test run started holds a copy of it.)
    final class FileLockHolder: Sendable {
        let process: Process

        init(_ path: String) throws {
            process = Process()
            let output = Pipe()
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", #"exec 9>>"$1" && flock -n 9 && echo held && exec sleep 600"#, "sh", path]
            process.standardInput = FileHandle.nullDevice
            process.standardOutput = output
            try process.run()
            // One line once it holds the lock; the end of its output when it could not.
            let said = output.fileHandleForReading.readData(ofLength: 5)
            guard String(decoding: said, as: UTF8.self) == "held\n" else {
                release()
                throw TestFailure("flock(1) could not lock \(path)")
            }
        }

        /// Lets go of the lock (once; again does nothing) and waits until the process has ended.
        func release() {
            // SIGKILL: the signal no mask passed down from the spawning thread can block.
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
    }

    /// A download taken over while the worker it was taken from still holds its file (that
    /// worker's manager has not noticed yet that its lease ran out) waits for the file: it tries
    /// again every second of the manager's clock and runs once the file is let go. One whose file
    /// stays held for longer than a lease fails with `locked`, saying who holds it.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/flock")))
    func aTakenOverDownloadWaitsForTheFileItsLastWorkerStillHolds() async throws {
        try await Self.withFleet { location, server, directory, root in
            let size: Int64 = 64 << 10
            for name in ["held", "kept"] { server.add("/" + name, TestResource(name: name, size: size)) }
            let clock = ManualClock()
            let b = try Self.worker(
                "b", location: location, root: root, state: directory, clock: FleetLeaseTests.TestClock(),
                managerClock: clock)
            let seen = Heard()
            let events = b.events()
            let reading = Task { for await event in events { seen.events.withLock { $0.append(event) } } }
            let run = Task { await b.run() }
            let holder = try FileLockHolder(root + "/held.haul.part")
            defer { holder.release() }
            let id = try await b.enqueue(DownloadRequest(url: server.url("/held"), destination: .file(root + "/held")))
            // Refused, it waits a second of the manager's clock; nothing was asked of the server.
            try await clock.waitForSleep(until: .seconds(1))
            #expect(await b.download(id)?.state == .running)
            #expect(server.requests(for: "/held").isEmpty)
            holder.release()
            clock.advance(by: .seconds(1))
            try await Self.waitUntil("the download completed once the file was let go") {
                await b.download(id)?.state == .completed
            }
            let expected = try #require(server.resource("/held")).bytes(0..<size)
            #expect(try readFile(root + "/held") == expected)
            // The failures told of a download.
            func failures(of download: DownloadID) -> [HaulError] {
                seen.events.withLock { events in
                    events.compactMap { event in
                        guard case .transfer(.failed(let error)) = event.kind, event.download.id == download else {
                            return nil
                        }
                        return error
                    }
                }
            }
            // The refused attempt was told to nobody: the download did not fail. (Events arrive in
            // order: once its completion is heard, any failure before it would have been.)
            try await Self.waitUntil("the completion is heard") {
                seen.events.withLock { events in
                    events.contains { $0.download.id == id && $0.download.state == .completed }
                }
            }
            #expect(failures(of: id).isEmpty, "\(failures(of: id))")

            // Held for longer than the lease (30 s): the download fails.
            let keeper = try FileLockHolder(root + "/kept.haul.part")
            defer { keeper.release() }
            let kept = try await b.enqueue(
                DownloadRequest(url: server.url("/kept"), destination: .file(root + "/kept")))
            try await clock.waitForSleep(until: .seconds(2))
            // A pause while it waits stops it at once, told as a stop; resumed, it waits again.
            #expect(try await b.pause(kept).state == .paused)
            try await Self.waitUntil("the pause is heard") { !failures(of: kept).isEmpty }
            #expect(failures(of: kept).map(\.code) == [.cancelled], "\(failures(of: kept))")
            try await b.resume(kept)
            try await clock.waitForSleep(until: .seconds(2))
            clock.advance(by: .seconds(31))
            try await Self.waitUntil("the download failed") { await b.download(kept)?.state == .failed }
            let error = await b.download(kept)?.error
            #expect(error?.code == .locked)
            #expect(
                error?.message.contains("is being downloaded by another process") == true, "\(error?.message ?? "")")
            #expect(server.requests(for: "/kept").isEmpty)
            run.cancel()
            await run.value
            await b.close()
            reading.cancel()
        }
    }

    /// Once the write permit says no (a worker's lease may have run out), the download writes
    /// nothing more: no checkpoint, no final file; it stops with `locked`.
    @Test func aDownloadWritesNothingOnceThePermitSaysNo() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let size: Int64 = 4 << 20
                server.add("/big", TestResource(name: "big", size: size))
                server.limitBandwidth(bytesPerSecond: 2 << 20)
                let permitted = Atomic(true)
                var configuration = testConfiguration(retries: 0)
                configuration.writePermit = { permitted.load(ordering: .relaxed) }
                let destination = directory + "/big"
                let log = EventLog()
                try await withDownloader(configuration) { downloader in
                    let task = Task {
                        try await downloader.download(
                            DownloadRequest(url: server.url("/big"), destination: .file(destination)),
                            observing: log.record)
                    }
                    try await Self.waitUntil("a checkpoint is on disk") {
                        fileExists(destination + ".haul.json") && (fileSize(destination + ".haul.part") ?? 0) > 0
                    }
                    permitted.store(false, ordering: .relaxed)
                    let manifest = try readFile(destination + ".haul.json")
                    let error = await expectHaulError(.locked) { try await task.value }
                    #expect(error?.message.contains("lease") == true, "\(error?.message ?? "")")
                    #expect(try readFile(destination + ".haul.json") == manifest, "no checkpoint after the refusal")
                    #expect(!fileExists(destination))
                }
            }
        }
    }

    /// A checkpoint begun while writes were allowed asks once more right before its manifest
    /// replaces the last (its flush and piece hashing may take long): refused then, it replaces
    /// nothing and the download stops with `locked`. The permit here says no only at that last
    /// question (while a new manifest waits in its temporary file) once a first one is stored, so
    /// only that check can stop the download.
    @Test func aCheckpointAsksForThePermitBeforeItsManifestReplacesTheLast() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                server.add("/big", TestResource(name: "big", size: 4 << 20))
                server.limitBandwidth(bytesPerSecond: 2 << 20)
                let destination = directory + "/big"
                var configuration = testConfiguration(retries: 0)
                configuration.writePermit = {
                    !(fileExists(destination + ".haul.json") && fileExists(destination + ".haul.json.tmp"))
                }
                try await withDownloader(configuration) { downloader in
                    let task = Task {
                        try await downloader.download(
                            DownloadRequest(url: server.url("/big"), destination: .file(destination)))
                    }
                    let error = await expectHaulError(.locked) { try await task.value }
                    #expect(error?.message.contains("lease") == true, "\(error?.message ?? "")")
                    #expect(!fileExists(destination) && !fileExists(destination + ".haul.json.tmp"))
                    #expect(fileExists(destination + ".haul.json"))
                }
            }
        }
    }

    /// The events a test heard.
    final class Heard: Sendable {
        let events = Mutex<[DownloadManagerEvent]>([])
    }
}

/// What a worker tells of another worker's downloads, from the notices of its commits, whatever
/// the moment it reads them at.
@Suite(.timeLimit(.minutes(1))) struct OthersChangedTests {
    /// A download another worker added and started before this one read the notice of its
    /// addition is told as added, then as running on that worker: a listener hears of the start
    /// even though no notice of it came apart from the addition's.
    @Test func anAddedDownloadReadRunningIsToldAddedThenRunning() async throws {
        try await withTemporaryDirectory { directory in
            try await withManager(directory + "/state") { manager in
                let url = "http://127.0.0.1:1/f"
                var record = StoredDownload(
                    key: "url:" + url, definition: DownloadRequest(url: url, destination: .directory(directory)),
                    destination: nil, priority: 0, owner: "other.1", now: 1)
                try record.move(to: .running, at: 2)
                let store = await manager.store
                let id = try #require(try store.commit(QueueChanges(inserts: [record])).first)
                let events = manager.events()
                await manager.othersChanged(QueueNotice(sender: "other.1", added: [id]))
                // Closing ends the stream: what it holds is what was told.
                await manager.close()
                var told: [String] = []
                for await event in events {
                    switch event.kind {
                    case .added: told.append("added")
                    case .stateChanged: told.append("\(event.download.state) \(event.download.worker ?? "-")")
                    default: told.append("other")
                    }
                    #expect(event.isFromAnotherWorker)
                }
                #expect(told == ["added", "running other.1"])
            }
        }
    }
}
