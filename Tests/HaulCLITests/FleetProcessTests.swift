import AsyncHTTPClient
import Foundation
import HaulTestServer
import NIOCore
import NIOHTTP1
import Testing

/// Three `haul daemon --queue` processes as one fleet: one PostgreSQL queue (a server of the
/// test's own, which it stops and starts), their own state directories, one shared download root.
///
/// Run alone (`HAUL_FLEET_TESTS=1 swift test --filter FleetProcessTests`, as `.ci/run` does):
/// three daemons and their throttled downloads beside the rest of the suite on two cores slow the
/// tests that measure time enough to fail them.
@Suite(
    .timeLimit(.minutes(5)), .serialized,
    .enabled(
        if: ProcessInfo.processInfo.environment["HAUL_FLEET_TESTS"] == "1",
        "three daemons at once: run alone, with HAUL_FLEET_TESTS=1 (see .ci/run)"))
struct FleetProcessTests {
    /// How long a worker's lease lasts: long enough that a 5 s outage of the database does not
    /// stop its downloads (it stops writing two thirds into the lease), short enough that a killed
    /// worker's downloads are taken over soon.
    static let leaseTime = 9

    /// A worker of the fleet, which records each download it completes in `completed.log`.
    static func worker(_ number: Int, queue: String, directory: String) async throws
        -> DaemonProcessTests.RunningDaemon
    {
        let state = directory + "/state\(number)"
        return try await DaemonProcessTests.RunningDaemon.start(
            state: state, root: directory + "/files",
            options: [
                "--queue", queue, "--lease-time", "\(leaseTime)", "-j", "8", "--on-complete",
                directory + "/record.sh",
            ])
    }

    /// Lists the queue through `worker`, or `nil` while it cannot (the database is away).
    static func listed(_ worker: DaemonProcessTests.RunningDaemon, _ client: HTTPClient) async -> [[String: Any]]? {
        var all: [[String: Any]] = []
        while true {
            guard let page = try? await worker.call(client, .GET, "/downloads?limit=1000&offset=\(all.count)"),
                let items = page["downloads"] as? [[String: Any]]
            else { return nil }
            all += items
            if items.count < 1000 { return all }
        }
    }

    /// 300 downloads added through one worker run on all three, never two requests at once for
    /// one file. One worker is killed part-way: its downloads are taken over within the lease
    /// time and 5 s, and resumed from their stored bytes (`Range` with `If-Range`). Then
    /// PostgreSQL stops for 5 s and starts again. Every file ends byte-identical, none completed
    /// twice, and the queue records all 300 completed.
    @Test func threeWorkersShareTheQueueThroughAKillAndADatabaseOutage() async throws {
        try await PostgreSQLTestServer.withOwnServer { database in
            try await HaulTestServer.withRunning { server in
                let names = (1...300).map { "fleet\($0).bin" }
                var resources: [String: TestResource] = [:]
                for name in names {
                    let resource = TestResource(name: name, size: 96 << 10)
                    resources[name] = resource
                    server.add("/" + name, resource)
                    server.setStandingFaults("/" + name, [.throttle(bytesPerSecond: 48_000)])
                }
                let directory = try makeTemporaryDirectory()
                defer { try? FileManager.default.removeItem(atPath: directory) }
                try FileManager.default.createDirectory(
                    atPath: directory + "/files", withIntermediateDirectories: true)
                try "#!/bin/sh\necho \"$1\" >> '\(directory)/completed.log'\n".write(
                    toFile: directory + "/record.sh", atomically: true, encoding: .utf8)
                chmod(directory + "/record.sh", 0o755)
                let client = HTTPClient(eventLoopGroupProvider: .singleton)
                var workers: [DaemonProcessTests.RunningDaemon] = []
                do {
                    for number in 1...3 {
                        workers.append(
                            try await Self.worker(number, queue: database.database.url, directory: directory))
                    }
                    var workerNames: [String] = []
                    for worker in workers {
                        workerNames.append(try await worker.call(client, .GET, "/stats")["worker"] as? String ?? "none")
                    }
                    #expect(Set(workerNames).count == 3, "\(workerNames)")
                    let items = names.map { #"{"url": "\#(server.url("/" + $0))"}"# }.joined(separator: ",")
                    _ = try await workers[0].call(client, .POST, "/downloads", json: #"{"downloads": [\#(items)]}"#)

                    // Every worker runs some, and the second has checkpoints on disk: it is killed.
                    var runningOn: Set<String> = []
                    let deadline = ContinuousClock.now + .seconds(60)
                    while ContinuousClock.now < deadline {
                        try await Task.sleep(for: .milliseconds(200))
                        let listed = await Self.listed(workers[0], client) ?? []
                        let running = listed.filter { ($0["state"] as? String) == "running" }
                        runningOn = Set(running.compactMap { $0["worker"] as? String })
                        let second = running.filter { ($0["worker"] as? String) == workerNames[1] }
                        let stored = try Self.partialsWithCheckpoints(directory + "/files")
                        if runningOn.count == 3 && second.count >= 4
                            && second.contains(where: { stored.contains(($0["name"] as? String ?? "") + ".haul.part") })
                        {
                            break
                        }
                    }
                    #expect(runningOn == Set(workerNames), "\(runningOn) against \(workerNames)")
                    let checkpointed = try Self.partialsWithCheckpoints(directory + "/files")
                    let requestsAtKill = server.requests.count
                    workers[1].process.signal(SIGKILL)
                    _ = try await workers[1].process.finish(timeout: .seconds(30))
                    let killedAt = ContinuousClock.now

                    // Its downloads are taken over within the lease time and 5 s.
                    var takenOverAfter: Duration?
                    while ContinuousClock.now - killedAt < .seconds(Self.leaseTime + 20) {
                        let listed = await Self.listed(workers[0], client) ?? []
                        if !listed.isEmpty, !listed.contains(where: { ($0["worker"] as? String) == workerNames[1] }) {
                            takenOverAfter = ContinuousClock.now - killedAt
                            break
                        }
                        try await Task.sleep(for: .milliseconds(100))
                    }
                    let takeOver = try #require(takenOverAfter, "the killed worker's downloads were never taken over")
                    #expect(takeOver <= .seconds(Self.leaseTime + 5), "taken over after \(takeOver)")

                    // The database stops for 5 s, with downloads running, and starts again.
                    try await database.stop()
                    try await Task.sleep(for: .seconds(5))
                    try await database.start()

                    // The two left finish everything.
                    let finish = ContinuousClock.now + .seconds(120)
                    var listed: [[String: Any]] = []
                    while ContinuousClock.now < finish {
                        listed = await Self.listed(workers[0], client) ?? []
                        if listed.count == names.count,
                            listed.allSatisfy({ $0["state"] as? String == "completed" })
                        {
                            break
                        }
                        try await Task.sleep(for: .milliseconds(200))
                    }
                    let states = Dictionary(grouping: listed, by: { $0["state"] as? String ?? "?" }).mapValues(\.count)
                    let unfinished = listed.filter { $0["state"] as? String != "completed" }.map {
                        "\($0["name"] ?? "?"): \($0["state"] ?? "?") \($0["error"] ?? "")"
                    }
                    #expect(states == ["completed": names.count], "\(states) \(unfinished)")
                    for name in names {
                        let resource = try #require(resources[name])
                        let file = directory + "/files/" + name
                        #expect(FileManager.default.contents(atPath: file) == Data(resource.content), "\(name)")
                        #expect(server.maximumRequestsAnswering(for: "/" + name) == 1, "\(name) fetched twice at once")
                    }
                    // Each download's completion ran its hook at most once, on whichever worker.
                    let log = (try? String(contentsOfFile: directory + "/completed.log", encoding: .utf8)) ?? ""
                    let completions = Dictionary(grouping: log.split(separator: "\n"), by: { $0 }).mapValues(\.count)
                    // Exactly once each: a file the killed worker finished but did not record is told
                    // complete (and its program run) by the worker that takes it over.
                    #expect(completions.values.allSatisfy { $0 == 1 }, "\(completions.filter { $0.value > 1 })")
                    #expect(completions.count == names.count, "\(completions.count) completions")
                    // A file with stored bytes at the kill that was asked for again afterwards (the
                    // killed worker's) was resumed from them, never fetched from the start.
                    let after = server.requests.dropFirst(requestsAtKill)
                    var resumed = 0
                    for partial in checkpointed {
                        let name = String(partial.dropLast(".haul.part".count))
                        let resource = try #require(resources[name])
                        for request in after where request.path == "/" + name {
                            let range = request.header("range") ?? "none"
                            #expect(range.hasPrefix("bytes=") && range != "bytes=0-", "\(name) started over: \(range)")
                            #expect(request.header("if-range") == resource.entityTagValue, "\(name)")
                            resumed += 1
                        }
                    }
                    #expect(resumed >= 1, "the killed worker's downloads were taken over and resumed")
                    for worker in [workers[0], workers[2]] {
                        worker.process.signal(SIGTERM)
                        _ = try await worker.process.finish(timeout: .seconds(30))
                    }
                } catch {
                    for worker in workers {
                        worker.process.signal(SIGKILL)
                        let errors = (try? await worker.process.finish(timeout: .seconds(10)).errors) ?? ""
                        print("worker said: \(errors.suffix(3000))")
                    }
                    try? await client.shutdown()
                    throw error
                }
                try await client.shutdown()
            }
        }
    }

    /// The partial files in `root` that have a manifest beside them (a checkpoint was stored).
    static func partialsWithCheckpoints(_ root: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: root).filter { name in
            name.hasSuffix(".haul.part")
                && FileManager.default.fileExists(atPath: root + "/" + name.dropLast(".part".count) + ".json")
        }
    }
}
