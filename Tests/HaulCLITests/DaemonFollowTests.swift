import AsyncHTTPClient
import Foundation
import HaulTestServer
import Testing

/// `haul get`, `resume` and `retry` while a `haul daemon` runs on the state directory: the daemon
/// runs the downloads, the command follows them and prints what it prints without a daemon.
@Suite(.timeLimit(.minutes(3)), .serialized)
struct DaemonFollowTests {
    /// A daemon over a new directory (`files` is its download root) for `body`, stopped afterwards.
    func withDaemonProcess(
        _ body: (DaemonProcessTests.RunningDaemon, HTTPClient, _ directory: String, _ state: String) async throws ->
            Void
    ) async throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let state = directory + "/state"
        try FileManager.default.createDirectory(atPath: directory + "/files", withIntermediateDirectories: true)
        let daemon = try await DaemonProcessTests.RunningDaemon.start(state: state, root: directory + "/files")
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        do {
            try await body(daemon, client, directory, state)
            try await client.shutdown()
        } catch {
            try? await client.shutdown()
            daemon.process.signal(SIGKILL)
            throw error
        }
        daemon.process.signal(SIGTERM)
        #expect(try await daemon.process.finish(timeout: .seconds(30)).status == 0)
    }

    @Test func getQueuesInTheDaemonAndPrintsWhatItPrintsWithout() async throws {
        try await HaulTestServer.withRunning { server in
            let plain = TestResource(name: "plain.bin", size: 700_000)
            let scripted = TestResource(name: "scripted.bin", size: 400_000)
            server.add("/plain.bin", plain)
            server.add("/scripted.bin", scripted)
            try await withDaemonProcess { daemon, client, directory, state in
                let get = try await HaulProcess.run(
                    ["get", server.url("/plain.bin"), "-d", "files", "--state-dir", state], directory: directory)
                #expect(get.status == 0, "\(get.errors)")
                #expect(
                    try Data(contentsOf: URL(fileURLWithPath: directory + "/files/plain.bin")) == Data(plain.content))
                let lines = get.errors.split(separator: "\n")
                #expect(lines.first == "haul: \(directory)/files/plain.bin (683.6 KiB)", "\(get.errors)")
                #expect(lines.last?.hasPrefix("haul: saved \(directory)/files/plain.bin (683.6 KiB) in ") == true)
                // The daemon ran it: its API lists it, completed.
                let listed = try await daemon.downloads(client)
                #expect(listed["plain.bin"]?["state"] as? String == "completed", "\(listed)")

                // --json prints the same events as a download in this process, the last one its result.
                let json = try await HaulProcess.run(
                    ["get", "--json", server.url("/scripted.bin"), "-o", "files/scripted.bin", "--state-dir", state],
                    directory: directory)
                #expect(json.status == 0, "\(json.errors)")
                let events = json.output.split(separator: "\n").compactMap {
                    try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
                }
                #expect(events.first?["event"] as? String == "started", "\(json.output)")
                #expect(events.first?["totalBytes"] as? Int == 400_000)
                let last = try #require(events.last)
                #expect(last["event"] as? String == "completed" && last["bytes"] as? Int == 400_000, "\(last)")
                #expect(last["destination"] as? String == directory + "/files/scripted.bin")
                #expect(events.dropFirst().dropLast().allSatisfy { $0["event"] as? String == "progress" })

                // Settings of the process that runs the queue are the daemon's: refused, nothing queued.
                let refused = try await HaulProcess.run(
                    ["get", "--retries", "3", server.url("/plain.bin"), "-o", "files/other.bin", "--state-dir", state],
                    directory: directory)
                #expect(refused.status == 2, "\(refused.errors)")
                #expect(refused.errors.contains("--retries") && refused.errors.contains("--no-daemon"))
                #expect(refused.errors.split(separator: "\n").count == 1, "\(refused.errors)")
                // Outside the daemon's download root: refused with a hint, exit 2.
                let outside = try await HaulProcess.run(
                    ["get", server.url("/plain.bin"), "-d", directory, "--state-dir", state], directory: directory)
                #expect(outside.status == 2 && outside.errors.contains("--no-daemon"), "\(outside.errors)")
                #expect(try await daemon.downloads(client).count == 2)
                // --no-daemon downloads in this process, where the daemon's root does not matter.
                let here = try await HaulProcess.run(
                    ["get", "-q", "--no-daemon", server.url("/plain.bin"), "-d", directory, "--state-dir", state],
                    directory: directory)
                #expect(here.status == 0, "\(here.errors)")
                #expect(try Data(contentsOf: URL(fileURLWithPath: directory + "/plain.bin")) == Data(plain.content))
            }
        }
    }

    @Test func ctrlCLeavesTheDownloadRunningAndResumeFollowsItAgain() async throws {
        try await HaulTestServer.withRunning { server in
            let slow = TestResource(name: "slow.bin", size: 3_000_000)
            server.add("/slow.bin", slow)
            server.setStandingFaults("/slow.bin", [.throttle(bytesPerSecond: 300_000)])
            try await withDaemonProcess { daemon, client, directory, state in
                let get = try HaulProcess(
                    ["get", "-x", "2", server.url("/slow.bin"), "-d", "files", "--state-dir", state],
                    directory: directory)
                var running: [String: Any]?
                let deadline = ContinuousClock.now + .seconds(30)
                while ContinuousClock.now < deadline {
                    running = try await daemon.downloads(client)["slow.bin"]
                    if running?["state"] as? String == "running", (running?["bytes"] as? Int ?? 0) > 0 { break }
                    try await Task.sleep(for: .milliseconds(50))
                }
                #expect(running?["connections"] as? Int == 2, "-x reaches the daemon: \(running ?? [:])")
                let id = try #require(running?["id"] as? Int)
                get.signal(SIGINT)
                let stopped = try await get.finish(timeout: .seconds(20))
                #expect(stopped.status == 130, "\(stopped.errors)")
                #expect(stopped.errors.contains("left running in the haul daemon"), "\(stopped.errors)")
                #expect(stopped.errors.contains("haul pause \(id)"))
                #expect(try await daemon.downloads(client)["slow.bin"]?["state"] as? String == "running")

                // Paused, then resumed by `haul resume`, which follows it to its end.
                let paused = try await HaulProcess.run(["pause", "\(id)", "--state-dir", state])
                #expect(paused.status == 0, "\(paused.errors)")
                // What the pause stored, by the daemon's record (the partial file is as long as the whole).
                let kept = try #require(try await daemon.downloads(client)["slow.bin"]?["bytes"] as? Int)
                #expect(kept > 0 && kept < 3_000_000)
                server.setStandingFaults("/slow.bin", [])
                let before = server.requests(for: "/slow.bin").count
                let sentBefore = server.bodyBytesSent
                let resumed = try await HaulProcess.run(["resume", "\(id)", "--state-dir", state])
                #expect(resumed.status == 0, "\(resumed.errors)")
                #expect(resumed.errors.contains("haul: saved \(directory)/files/slow.bin"), "\(resumed.errors)")
                #expect(try Data(contentsOf: URL(fileURLWithPath: directory + "/files/slow.bin")) == Data(slow.content))
                // The daemon asked for exactly what the pause left out, from the same version.
                let after = server.requests(for: "/slow.bin").dropFirst(before)
                #expect(!after.isEmpty && after.allSatisfy { $0.header("if-range") == slow.entityTagValue })
                #expect(after.allSatisfy { $0.header("range") != nil && $0.header("range") != "bytes=0-" })
                // The server counts a chunk once its write returns, which may be just after the client
                // has it: wait (a little) for the count to settle before comparing.
                let expected = Int64(3_000_000 - kept)
                let settle = ContinuousClock.now + .seconds(5)
                while server.bodyBytesSent - sentBefore < expected && ContinuousClock.now < settle {
                    try await Task.sleep(for: .milliseconds(20))
                }
                #expect(server.bodyBytesSent - sentBefore == expected, "\(kept) kept")
            }
        }
    }

    @Test func aFailureExitsWithItsCodeAndRetryFollowsTheNextAttempt() async throws {
        try await HaulTestServer.withRunning { server in
            let late = TestResource(name: "late.bin", size: 200_000)
            try await withDaemonProcess { daemon, client, directory, state in
                let failed = try await HaulProcess.run(
                    ["get", server.url("/late.bin"), "-d", "files", "--state-dir", state], directory: directory)
                #expect(failed.status == 4, "HTTP status: \(failed.errors)")
                #expect(
                    failed.errors.split(separator: "\n").last?.hasPrefix("haul: error: ") == true, "\(failed.errors)")
                let id = try #require(try await daemon.downloads(client)["late.bin"]?["id"] as? Int)
                server.add("/late.bin", late)
                let retried = try await HaulProcess.run(["retry", "\(id)", "-q", "--state-dir", state])
                #expect(retried.status == 0 && retried.errors.isEmpty, "\(retried.errors)")
                #expect(try Data(contentsOf: URL(fileURLWithPath: directory + "/files/late.bin")) == Data(late.content))
                let again = try await HaulProcess.run(["retry", "\(id)", "--state-dir", state])
                #expect(again.status == 18 && again.errors.contains("completed"), "\(again.errors)")
            }
        }
    }

    @Test func aDaemonThatDiesEndsTheCommandWithAClearErrorAndKeepsTheData() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/slow.bin", TestResource(name: "slow.bin", size: 3_000_000))
            server.setStandingFaults("/slow.bin", [.throttle(bytesPerSecond: 300_000)])
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            try FileManager.default.createDirectory(atPath: directory + "/files", withIntermediateDirectories: true)
            let daemon = try await DaemonProcessTests.RunningDaemon.start(state: state, root: directory + "/files")
            let get = try HaulProcess(
                ["get", server.url("/slow.bin"), "-d", "files", "--state-dir", state], directory: directory)
            try await waitForFile(directory + "/files/slow.bin.haul.part")
            daemon.process.signal(SIGKILL)
            _ = try await daemon.process.finish(timeout: .seconds(10))
            let ended = try await get.finish(timeout: .seconds(60))
            #expect(ended.status == 5, "\(ended.errors)")
            #expect(
                ended.errors.split(separator: "\n").last?.hasPrefix("haul: error: lost the haul daemon") == true,
                "\(ended.errors)")
            #expect(ended.errors.contains("`haul ls`"), "\(ended.errors)")
            #expect(FileManager.default.fileExists(atPath: directory + "/files/slow.bin.haul.part"))
        }
    }

    @Test func aDownloadThatEndsBeforeTheAnswerIsShownToItsEnd() async throws {
        try await HaulTestServer.withRunning { server in
            try await withDaemonProcess { daemon, client, directory, state in
                // Ten bytes: done before the daemon has answered the command that queued them.
                for index in 0..<3 {
                    let tiny = TestResource(name: "tiny\(index)", size: 10)
                    server.add("/tiny\(index)", tiny)
                    let get = try await HaulProcess.run(
                        ["get", server.url("/tiny\(index)"), "-d", "files", "--state-dir", state], directory: directory)
                    #expect(get.status == 0, "\(get.errors)")
                    #expect(
                        get.errors.contains("haul: saved \(directory)/files/tiny\(index) (10 B) in "), "\(get.errors)")
                    let json = try await HaulProcess.run(
                        [
                            "get", "--json", server.url("/tiny\(index)"), "-o", "files/json\(index)", "--state-dir",
                            state,
                        ],
                        directory: directory)
                    #expect(json.status == 0, "\(json.errors)")
                    let events = json.output.split(separator: "\n").map { String($0) }
                    #expect(events.first?.contains(#""event":"started""#) == true, "\(json.output)")
                    #expect(events.last?.contains(#""event":"completed""#) == true, "\(json.output)")
                }
                // Asked again: already complete, said so, nothing fetched.
                let before = server.requests(for: "/tiny0").count
                let again = try await HaulProcess.run(
                    ["get", server.url("/tiny0"), "-d", "files", "--state-dir", state], directory: directory)
                #expect(again.status == 0, "\(again.errors)")
                #expect(again.errors.contains("tiny0 is already complete"), "\(again.errors)")
                #expect(server.requests(for: "/tiny0").count == before)
                #expect(try await daemon.downloads(client).count == 6)
            }
        }
    }

    @Test func aRemovedDownloadEndsTheCommandWithItsOwnCode() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/gone.bin", TestResource(name: "gone.bin", size: 3_000_000))
            server.setStandingFaults("/gone.bin", [.throttle(bytesPerSecond: 200_000)])
            try await withDaemonProcess { daemon, client, directory, state in
                let get = try HaulProcess(
                    ["get", "--json", server.url("/gone.bin"), "-d", "files", "--state-dir", state],
                    directory: directory)
                var id: Int?
                let deadline = ContinuousClock.now + .seconds(30)
                while id == nil && ContinuousClock.now < deadline {
                    id = try await daemon.downloads(client)["gone.bin"]?["id"] as? Int
                    if id == nil { try await Task.sleep(for: .milliseconds(20)) }
                }
                let removed = try await HaulProcess.run(["rm", "\(try #require(id))", "--state-dir", state])
                #expect(removed.status == 0, "\(removed.errors)")
                let ended = try await get.finish(timeout: .seconds(30))
                #expect(ended.status == 17, "\(ended.errors)")
                let last = ended.output.split(separator: "\n").last.map(String.init) ?? ""
                #expect(last.contains(#""event":"failed""#) && last.contains("removed from the haul daemon"), "\(last)")
            }
        }
    }

    @Test func resumeWithoutIDsResumesWhatIsPausedAndPassesHeaders() async throws {
        try await HaulTestServer.withRunning { server in
            let resources = ["one.bin", "two.bin"].map { TestResource(name: $0, size: 1_500_000) }
            for resource in resources {
                server.add("/\(resource.name)", resource)
                server.setStandingFaults("/\(resource.name)", [.throttle(bytesPerSecond: 200_000)])
            }
            try await withDaemonProcess { daemon, client, directory, state in
                for resource in resources {
                    let added = try await HaulProcess.run(
                        ["add", server.url("/\(resource.name)"), "-d", "files", "--state-dir", state],
                        directory: directory)
                    #expect(added.status == 0, "\(added.errors)")
                }
                // Paused once each has bytes stored.
                let deadline = ContinuousClock.now + .seconds(30)
                var listed: [String: [String: Any]] = [:]
                while ContinuousClock.now < deadline {
                    listed = try await daemon.downloads(client)
                    if listed.count == 2, listed.values.allSatisfy({ ($0["bytes"] as? Int ?? 0) > 0 }) { break }
                    try await Task.sleep(for: .milliseconds(20))
                }
                let ids = listed.values.compactMap { $0["id"] as? Int }.map(String.init)
                #expect(try await HaulProcess.run(["pause"] + ids + ["--state-dir", state]).status == 0)
                for resource in resources { server.setStandingFaults("/\(resource.name)", []) }
                let refused = try await HaulProcess.run(["resume", "-x", "2", "--state-dir", state])
                #expect(refused.status == 2 && refused.errors.contains("--no-daemon"), "\(refused.errors)")
                let resumed = try await HaulProcess.run(["resume", "-H", "X-Trace: again", "--state-dir", state])
                #expect(resumed.status == 0, "\(resumed.errors)")
                #expect(resumed.errors.contains("haul: 2 of 2 saved"), "\(resumed.errors)")
                for resource in resources {
                    let file = directory + "/files/\(resource.name)"
                    #expect(try Data(contentsOf: URL(fileURLWithPath: file)) == Data(resource.content))
                    let last = try #require(server.requests(for: "/\(resource.name)").last)
                    #expect(last.header("x-trace") == "again" && last.header("range") != nil)
                }
            }
        }
    }

    @Test func aDaemonRestartedWhileFollowedIsFollowedToTheEnd() async throws {
        try await HaulTestServer.withRunning { server in
            let slow = TestResource(name: "long.bin", size: 2_000_000)
            server.add("/long.bin", slow)
            server.setStandingFaults("/long.bin", [.throttle(bytesPerSecond: 300_000)])
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            let root = directory + "/files"
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            let first = try await DaemonProcessTests.RunningDaemon.start(state: state, root: root)
            let listen = String(first.url.dropFirst("http://".count))
            let get = try HaulProcess(
                ["get", server.url("/long.bin"), "-d", "files", "--state-dir", state], directory: directory)
            try await waitForFile(root + "/long.bin.haul.part")
            first.process.signal(SIGTERM)
            #expect(try await first.process.finish(timeout: .seconds(30)).status == 0)
            // Back on the same address within the follower's reconnections: it reads the download anew
            // (another run's events mean nothing) and follows it to the end.
            server.setStandingFaults("/long.bin", [])
            let second = try await DaemonProcessTests.RunningDaemon.start(state: state, root: root, listen: listen)
            let ended = try await get.finish(timeout: .seconds(60))
            #expect(ended.status == 0, "\(ended.errors)")
            #expect(try Data(contentsOf: URL(fileURLWithPath: root + "/long.bin")) == Data(slow.content))
            second.process.signal(SIGTERM)
            #expect(try await second.process.finish(timeout: .seconds(30)).status == 0)
        }
    }

    private func waitForFile(_ path: String) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while !FileManager.default.fileExists(atPath: path) {
            guard ContinuousClock.now < deadline else { throw CLITestFailure("\(path) did not appear") }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}
