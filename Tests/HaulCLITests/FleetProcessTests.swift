import AsyncHTTPClient
import Foundation
import HaulTestServer
import NIOCore
import NIOHTTP1
import Testing

/// Three `haul daemon --queue` processes as one fleet: one PostgreSQL queue (the tests' server),
/// their own state directories, one shared download root.
///
/// Run alone (`HAUL_FLEET_TESTS=1 swift test --filter FleetProcessTests`, as `.ci/run` does):
/// three daemons and their throttled downloads beside the rest of the suite on two cores slow the
/// tests that measure time enough to fail them.
@Suite(
    .timeLimit(.minutes(3)), .serialized,
    .enabled(
        if: ProcessInfo.processInfo.environment["HAUL_FLEET_TESTS"] == "1",
        "three daemons at once: run alone, with HAUL_FLEET_TESTS=1 (see .ci/run)"))
struct FleetProcessTests {
    /// A worker of the fleet, started with a short lease so a take-over comes soon.
    static func worker(_ number: Int, queue: String, directory: String) async throws
        -> DaemonProcessTests.RunningDaemon
    {
        let state = directory + "/state\(number)"
        return try await DaemonProcessTests.RunningDaemon.start(
            state: state, root: directory + "/files",
            options: ["--queue", queue, "--lease-time", "6", "-j", "2"])
    }

    /// 18 downloads added through one worker run on all three, never two at once of one file;
    /// the worker killed part-way has its downloads taken over and resumed from their stored bytes
    /// (`Range` with `If-Range`), and every file ends byte-identical, completed once.
    @Test func threeWorkersShareTheQueueAndTakeOverFromOneKilled() async throws {
        try await PostgreSQLTestServer.withDatabase { database in
            try await HaulTestServer.withRunning { server in
                let names = (1...18).map { "fleet\($0).bin" }
                var resources: [String: TestResource] = [:]
                for name in names {
                    let resource = TestResource(name: name, size: 256 << 10)
                    resources[name] = resource
                    server.add("/" + name, resource)
                    server.setStandingFaults("/" + name, [.throttle(bytesPerSecond: 64_000)])
                }
                let directory = try makeTemporaryDirectory()
                defer { try? FileManager.default.removeItem(atPath: directory) }
                try FileManager.default.createDirectory(
                    atPath: directory + "/files", withIntermediateDirectories: true)
                let client = HTTPClient(eventLoopGroupProvider: .singleton)
                var workers: [DaemonProcessTests.RunningDaemon] = []
                do {
                    for number in 1...3 {
                        workers.append(try await Self.worker(number, queue: database.url, directory: directory))
                    }
                    let items = names.map { #"{"url": "\#(server.url("/" + $0))"}"# }.joined(separator: ",")
                    _ = try await workers[0].call(client, .POST, "/downloads", json: #"{"downloads": [\#(items)]}"#)

                    // Every worker runs some, then the second is killed with bytes stored.
                    var checkpointed: [String] = []
                    var states: [String] = []
                    var runningOn: Set<String> = []
                    let deadline = ContinuousClock.now + .seconds(30)
                    while checkpointed.isEmpty && ContinuousClock.now < deadline {
                        try await Task.sleep(for: .milliseconds(100))
                        let listed = try await workers[0].downloads(client)
                        states = listed.values.map { $0["state"] as? String ?? "?" }
                        let running = listed.filter { ($0.value["state"] as? String) == "running" }
                        // Every worker runs two, each with a checkpoint on disk.
                        guard running.count >= 6 else { continue }
                        let stored = try Self.partialsWithCheckpoints(directory + "/files")
                        if stored.count >= 6 { checkpointed = stored }
                        runningOn = Set(running.values.compactMap { $0["worker"] as? String })
                    }
                    try #require(
                        !checkpointed.isEmpty,
                        "downloads ran with checkpoints before the kill: \(states.sorted()), \(server.requests.map { "\($0.path) \($0.header("range") ?? "-") \($0.header("user-agent") ?? "")" })"
                    )
                    // One worker's list shows each running download's worker: all three, by the
                    // names their own stats give.
                    var workerNames: Set<String> = []
                    for worker in workers {
                        workerNames.insert(try await worker.call(client, .GET, "/stats")["worker"] as? String ?? "none")
                    }
                    #expect(workerNames.count == 3 && runningOn == workerNames, "\(runningOn) against \(workerNames)")
                    let requestsAtKill = server.requests.count
                    workers[1].process.signal(SIGKILL)
                    _ = try await workers[1].process.finish(timeout: .seconds(30))
                    let killedAt = ContinuousClock.now

                    // The others finish everything, the killed worker's downloads too.
                    let finish = ContinuousClock.now + .seconds(90)
                    var listed: [String: [String: Any]] = [:]
                    while ContinuousClock.now < finish {
                        listed = try await workers[0].downloads(client)
                        if listed.count == names.count,
                            listed.values.allSatisfy({ $0["state"] as? String == "completed" })
                        {
                            break
                        }
                        try await Task.sleep(for: .milliseconds(100))
                    }
                    #expect(listed.values.allSatisfy { $0["state"] as? String == "completed" }, "\(listed)")
                    #expect(ContinuousClock.now - killedAt < .seconds(60))
                    for name in names {
                        let resource = try #require(resources[name])
                        let file = directory + "/files/" + name
                        #expect(FileManager.default.contents(atPath: file) == Data(resource.content), "\(name)")
                        #expect(server.maximumRequestsAnswering(for: "/" + name) == 1, "\(name) fetched twice at once")
                    }
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
