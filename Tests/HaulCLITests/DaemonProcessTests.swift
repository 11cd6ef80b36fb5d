import AsyncHTTPClient
import Foundation
import HaulTestServer
import NIOCore
import NIOHTTP1
import Testing

/// The built `haul daemon` as users run it: killed or stopped mid-transfer and started again.
@Suite(.timeLimit(.minutes(3)), .serialized)
struct DaemonProcessTests {
    static let names = (1...5).map { "part\($0).bin" }

    /// A daemon process on a free port over `state`, with its address and token once it listens.
    struct RunningDaemon {
        let process: HaulProcess
        let url: String
        let token: String

        static func start(
            state: String, root: String, listen: String = "127.0.0.1:0", options: [String] = ["-j", "5"]
        ) async throws -> RunningDaemon {
            try? FileManager.default.removeItem(atPath: state + "/daemon.address")
            let process = try HaulProcess(
                ["daemon", "--listen", listen, "--state-dir", state, "--download-root", root, "-x", "1"] + options)
            let deadline = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < deadline {
                if let address = try? String(contentsOfFile: state + "/daemon.address", encoding: .utf8),
                    let token = try? String(contentsOfFile: state + "/daemon.token", encoding: .utf8)
                {
                    let url = String(address.split(separator: " ")[0])
                    return RunningDaemon(
                        process: process, url: url, token: token.trimmingCharacters(in: .whitespacesAndNewlines))
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            process.signal(SIGKILL)
            throw CLITestFailure("the daemon did not start: \(try await process.finish().errors)")
        }

        func call(_ client: HTTPClient, _ method: HTTPMethod, _ path: String, json: String? = nil) async throws
            -> [String: Any]
        {
            var request = HTTPClientRequest(url: url + "/api/v1" + path)
            request.method = method
            request.headers.add(name: "Authorization", value: "Bearer \(token)")
            if let json {
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(string: json))
            }
            let response = try await client.execute(request, timeout: .seconds(10))
            let body = try await response.body.collect(upTo: 1 << 20)
            guard (200..<300).contains(response.status.code) else {
                throw CLITestFailure("\(method) \(path): \(response.status.code) \(String(buffer: body))")
            }
            return (try JSONSerialization.jsonObject(with: Data(String(buffer: body).utf8)) as? [String: Any]) ?? [:]
        }

        /// Every download as the API lists it, by name.
        func downloads(_ client: HTTPClient) async throws -> [String: [String: Any]] {
            let list = try await call(client, .GET, "/downloads")
            let items = list["downloads"] as? [[String: Any]] ?? []
            let names = items.map { $0["name"] as? String ?? "" }
            // Two of one name is a failure of the test that asks, not a crash of the whole run.
            #expect(Set(names).count == names.count, "two downloads of one name: \(names)")
            return Dictionary(zip(names, items), uniquingKeysWith: { first, _ in first })
        }
    }

    @Test func theQueueCommandsUseARunningDaemon() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "via-daemon.bin", size: 300_000)
            server.add("/via-daemon.bin", resource)
            server.add("/slow.bin", TestResource(name: "slow.bin", size: 5_000_000))
            server.setStandingFaults("/slow.bin", [.throttle(bytesPerSecond: 200_000)])
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            let root = directory + "/files"
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            let daemon = try await RunningDaemon.start(state: state, root: root)
            // `haul add` queues in the daemon, which runs it: nothing else is running here.
            let added = try await HaulProcess.run(
                ["add", server.url("/via-daemon.bin"), "-d", "files", "--state-dir", state], directory: directory)
            #expect(added.status == 0, "\(added.errors)")
            let id = added.output.trimmingCharacters(in: .whitespacesAndNewlines)
            var listed: [[String: Any]] = []
            let deadline = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < deadline {
                let ls = try await HaulProcess.run(["ls", "--json", "--state-dir", state])
                listed = (try JSONSerialization.jsonObject(with: Data(ls.output.utf8)) as? [[String: Any]]) ?? []
                if listed.first?["state"] as? String == "completed" { break }
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(listed.count == 1 && "\(listed.first?["id"] ?? "")" == id)
            #expect(listed.first?["state"] as? String == "completed")
            #expect(try Data(contentsOf: URL(fileURLWithPath: root + "/via-daemon.bin")) == Data(resource.content))
            // `haul pause` and `haul rm` act on the daemon's download.
            let slow = try await HaulProcess.run(["add", server.url("/slow.bin"), "-d", root, "--state-dir", state])
            let slowID = slow.output.trimmingCharacters(in: .whitespacesAndNewlines)
            let paused = try await HaulProcess.run(["pause", slowID, "--state-dir", state])
            #expect(paused.status == 0 && paused.output == "paused \(slowID)\n", "\(paused.errors)")
            let removed = try await HaulProcess.run(["rm", slowID, "--delete-files", "--state-dir", state])
            #expect(removed.status == 0 && removed.output == "removed \(slowID)\n", "\(removed.errors)")
            // One that another haul process runs beside the daemon is paused as without a daemon.
            let local = try HaulProcess([
                "get", server.url("/slow.bin"), "-d", directory, "--state-dir", state, "-q", "--no-daemon",
            ])
            var localID = ""
            let started = ContinuousClock.now + .seconds(20)
            while localID.isEmpty && ContinuousClock.now < started {
                let ls = try await HaulProcess.run(["ls", "--json", "--state-dir", state])
                let all = (try JSONSerialization.jsonObject(with: Data(ls.output.utf8)) as? [[String: Any]]) ?? []
                if let entry = all.first(where: { $0["state"] as? String == "running" }) {
                    localID = "\(entry["id"] ?? "")"
                }
                if localID.isEmpty { try await Task.sleep(for: .milliseconds(50)) }
            }
            let pausedLocal = try await HaulProcess.run(["pause", localID, "--state-dir", state])
            #expect(pausedLocal.status == 0 && pausedLocal.output == "paused \(localID)\n", "\(pausedLocal.errors)")
            _ = try await local.finish(timeout: .seconds(30))
            let afterPause = try await HaulProcess.run(["ls", "--json", "--state-dir", state])
            #expect(afterPause.output.contains(#""state":"paused""#), "\(afterPause.output)")
            // A download the daemon does not know is the same error as without a daemon.
            let unknown = try await HaulProcess.run(["pause", "999", "--state-dir", state])
            #expect(unknown.status == 17 && unknown.errors.contains("999"), "\(unknown.errors)")
            daemon.process.signal(SIGTERM)
            #expect(try await daemon.process.finish(timeout: .seconds(30)).status == 0)
        }
    }

    @Test(arguments: [SIGKILL, SIGTERM])
    func aDaemonStoppedMidTransferFinishesEveryDownloadWhenStartedAgain(signal: Int32) async throws {
        try await HaulTestServer.withRunning { server in
            var resources: [String: TestResource] = [:]
            for (index, name) in Self.names.enumerated() {
                // About 8 s each at this rate: none finishes before the stop, even on a loaded machine.
                let resource = TestResource(name: name, size: 2_500_000 + Int64(index) * 1000)
                resources[name] = resource
                server.add("/\(name)", resource)
                server.setStandingFaults("/\(name)", [.throttle(bytesPerSecond: 300 * 1024)])
            }
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            let root = directory + "/files"
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            do {
                let first = try await RunningDaemon.start(state: state, root: root)
                let items = Self.names.map { name in #"{"url": "\#(server.url("/" + name))"}"# }.joined(separator: ",")
                _ = try await first.call(client, .POST, "/downloads", json: #"{"downloads": [\#(items)]}"#)
                // Every download has bytes stored (a checkpoint in the database) before the stop.
                let deadline = ContinuousClock.now + .seconds(30)
                var stored = false
                while !stored && ContinuousClock.now < deadline {
                    let listed = try await first.downloads(client)
                    stored = listed.count == 5 && listed.values.allSatisfy { ($0["bytes"] as? Int ?? 0) > 200_000 }
                    if !stored { try await Task.sleep(for: .milliseconds(50)) }
                }
                try #require(stored, "every download stored bytes before the stop")
                first.process.signal(signal)
                let (status, _, errors) = try await first.process.finish(timeout: .seconds(30))
                if signal == SIGTERM {
                    #expect(status == 0, "a graceful stop exits 0: \(errors)")
                } else {
                    #expect(first.process.endedBySignal && status == SIGKILL)
                }
                let requestsBefore = server.requests.count
                let bytesBefore = server.bodyBytesSent
                var kept: [String: Int64] = [:]
                for name in Self.names {
                    let partial = directory + "/files/\(name).haul.part"
                    kept[name] = (try? FileManager.default.attributesOfItem(atPath: partial)[.size] as? Int64) ?? nil
                    #expect((kept[name] ?? 0) > 0, "\(name) kept its partial data")
                }

                // Started again, it resumes every one where it was.
                for name in Self.names { server.setStandingFaults("/\(name)", []) }
                let second = try await RunningDaemon.start(state: state, root: root)
                let finish = ContinuousClock.now + .seconds(60)
                var listed: [String: [String: Any]] = [:]
                while ContinuousClock.now < finish {
                    listed = try await second.downloads(client)
                    if listed.count == 5, listed.values.allSatisfy({ $0["state"] as? String == "completed" }) { break }
                    try await Task.sleep(for: .milliseconds(50))
                }
                #expect(listed.values.allSatisfy { $0["state"] as? String == "completed" }, "\(listed)")
                for name in Self.names {
                    let resource = try #require(resources[name])
                    #expect(try Data(contentsOf: URL(fileURLWithPath: root + "/" + name)) == Data(resource.content))
                    // Its first request after the restart asked for the rest, if the file is unchanged.
                    let after = server.requests.dropFirst(requestsBefore).filter { $0.path == "/\(name)" }
                    let resume = try #require(after.first)
                    let range = try #require(resume.header("range"), "\(name) was resumed with a range")
                    let offset = Int64(range.dropFirst("bytes=".count).prefix { $0 != "-" }) ?? -1
                    #expect(offset > 0 && offset <= (kept[name] ?? 0), "\(name): \(range), \(kept[name] ?? 0) kept")
                    #expect(resume.header("if-range") == resource.entityTagValue)
                    if signal == SIGTERM {
                        // A graceful stop stored every byte written: the resume starts at the partial's end.
                        #expect(offset == kept[name], "\(name): \(range), \(kept[name] ?? 0) kept")
                    }
                }
                let total = resources.values.reduce(0) { $0 + $1.size }
                let missing = total - kept.values.reduce(0, +)
                if signal == SIGTERM {
                    // Nothing stored is fetched again: after the restart the server sent exactly the rest.
                    #expect(server.bodyBytesSent - bytesBefore == missing, "\(server.bodyBytesSent - bytesBefore)")
                } else {
                    // After a kill, at most what was written since the last durable checkpoint comes again.
                    #expect(server.bodyBytesSent - bytesBefore >= missing)
                }
                second.process.signal(SIGTERM)
                let (stopped, _, stopErrors) = try await second.process.finish(timeout: .seconds(30))
                #expect(stopped == 0, "\(stopErrors)")
                try await client.shutdown()
            } catch {
                try? await client.shutdown()
                throw error
            }
        }
    }
}
