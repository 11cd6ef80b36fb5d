import Foundation
import HaulTestServer
import Testing

/// `haul ls --json` parsed.
private func listDownloads(_ state: String) async throws -> [[String: Any]] {
    let (status, output, errors) = try await HaulProcess.run(["ls", "--json", "--state-dir", state])
    #expect(status == 0, "\(errors)")
    let parsed = try JSONSerialization.jsonObject(with: Data(output.utf8))
    return try #require(parsed as? [[String: Any]])
}

@Suite(.timeLimit(.minutes(3)))
struct QueueCommandTests {
    @Test func manyDownloadsKilledThenListedAndResumedAreByteIdentical() async throws {
        try await HaulTestServer.withRunning { server in try await killManyThenResume(server) }
    }

    private func killManyThenResume(_ server: HaulTestServer) async throws {
        let names = (1...8).map { "file\($0).bin" }
        for (index, name) in names.enumerated() {
            // Each takes about 10 s at this rate: none can finish before the kill, even on a loaded machine.
            server.add("/\(name)", TestResource(name: name, size: 4_194_304 + Int64(index) * 1000))
            server.setStandingFaults("/\(name)", [.throttle(bytesPerSecond: 400 * 1024)])
        }
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let state = directory + "/state"
        let haul = try HaulProcess(
            ["get", "-j", "3", "-x", "1", "-d", directory, "--state-dir", state, "-q"]
                + names.map { server.url("/\($0)") })

        // While it runs, another process sees three downloads running and five queued.
        var partials: [String] = []
        let deadline = ContinuousClock.now + .seconds(20)
        while partials.count < 3 && ContinuousClock.now < deadline {
            partials = names.filter { (size(directory + "/\($0).haul.part") ?? 0) > 100_000 }
            try await Task.sleep(for: .milliseconds(20))
        }
        // The running process records each download's rate at its next progress tick: ask until it has.
        var live = try await listDownloads(state)
        while live.filter({ ($0["bytesPerSecond"] as? Int ?? 0) > 0 }).count < 3 && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
            live = try await listDownloads(state)
        }
        #expect(live.count == 8)
        #expect(live.filter { $0["state"] as? String == "running" }.count == 3)
        #expect(live.filter { $0["state"] as? String == "queued" }.count == 5)
        #expect(live.filter { ($0["bytesPerSecond"] as? Int ?? 0) > 0 }.count == 3)

        haul.signal(SIGKILL)
        let (status, _, _) = try await haul.finish()
        #expect(haul.endedBySignal && status == SIGKILL)
        var stored: [String: Int64] = [:]
        for name in names { stored[name] = size(directory + "/\(name).haul.part") }
        #expect(stored.count == 3)

        // After the kill: nothing is running any more; progress comes from the records and the disk.
        let listed = try await listDownloads(state)
        #expect(listed.count == 8)
        #expect(listed.allSatisfy { $0["state"] as? String == "queued" })
        for entry in listed {
            let name = try #require(entry["name"] as? String)
            #expect(entry["bytes"] as? Int64 ?? Int64(entry["bytes"] as? Int ?? -1) == stored[name] ?? 0)
        }
        let table = try await HaulProcess.run(["ls", "--state-dir", state])
        let lines = table.output.split(separator: "\n")
        #expect(lines.count == 9)
        #expect(lines.first?.hasPrefix("ID  STATE") == true)
        for (name, bytes) in stored {
            let line = try #require(lines.first { $0.hasSuffix(name) })
            #expect(line.contains("queued"))
            #expect(
                line.contains(
                    "\(Int(Double(bytes) / Double(4_194_304 + 1000 * Int64(names.firstIndex(of: name)!)) * 100))%"))
            #expect(line.contains(" / 4.0 MiB"))
        }

        for name in names { server.setStandingFaults("/\(name)", []) }
        let resumed = try await HaulProcess.run(["resume", "--state-dir", state, "-x", "1"])
        #expect(resumed.status == 0, "\(resumed.errors)")
        for name in names {
            #expect(contents(directory + "/\(name)") == server.resource("/\(name)")!.content, "\(name)")
            let requests = server.requests(for: "/\(name)")
            if let bytes = stored[name] {
                // Continued from the stored offset, with the validator.
                #expect(requests.last?.header("range") == "bytes=\(bytes)-")
                #expect(requests.last?.header("if-range") == server.resource("/\(name)")!.entityTagValue)
            }
        }
        let done = try await listDownloads(state)
        #expect(done.allSatisfy { $0["state"] as? String == "completed" })
        let again = try await HaulProcess.run(["resume", "--state-dir", state])
        #expect(again.status == 0)
        #expect(again.errors.contains("nothing to resume"))
    }

    @Test func manySmallFilesWithTheShellsOpenFileLimitLowered() async throws {
        try await HaulTestServer.withRunning { server in
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let names = (0..<200).map { "s\($0)" }
            for name in names { server.add("/\(name)", TestResource(name: name, size: 2048)) }
            try names.map { server.url("/\($0)") }.joined(separator: "\n")
                .write(toFile: directory + "/list.txt", atomically: true, encoding: .utf8)
            // Sixteen transfers and the files being finished beside them hold more than 64 files: haul
            // raises the soft limit the shell set to the hard one.
            let result = try await HaulProcess.run(
                [
                    "get", "-i", directory + "/list.txt", "-d", directory + "/files", "-j", "16", "-q", "--no-daemon",
                    "--state-dir", directory + "/state",
                ],
                launcher: ["/bin/sh", "-c", "ulimit -Sn 64 && exec \"$@\"", "sh"])
            #expect(result.status == 0, "\(result.errors.prefix(500))")
            let wrong = names.filter { contents(directory + "/files/" + $0) != server.resource("/\($0)")?.content }
            #expect(wrong.isEmpty, "\(wrong.count) files missing or different, \(wrong.prefix(3)) first")
        }
    }

    @Test func quietlyAListTellsOnlyItsFailureAndExitsWithItsCode() async throws {
        try await HaulTestServer.withRunning { server in
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let names = ["a", "b", "c"]
            for name in names { server.add("/\(name)", TestResource(name: name, size: 3000)) }
            let urls = names.map { server.url("/\($0)") } + [server.url("/missing")]
            try urls.joined(separator: "\n").write(toFile: directory + "/list.txt", atomically: true, encoding: .utf8)
            let result = try await HaulProcess.run([
                "get", "-i", directory + "/list.txt", "-d", directory + "/files", "-q", "--no-daemon",
                "--state-dir", directory + "/state",
            ])
            // The documented code of an HTTP error.
            #expect(result.status == 4, "\(result.errors)")
            let lines = result.errors.split(separator: "\n")
            #expect(lines.count == 1, "\(result.errors)")
            #expect(lines.first?.hasPrefix("haul: error: missing: ") == true, "\(result.errors)")
            for name in names {
                #expect(contents(directory + "/files/" + name) == server.resource("/\(name)")?.content)
            }
        }
    }

    @Test func inputFileWithPerLineOptions() async throws {
        try await HaulTestServer.withRunning { server in
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            server.add("/a.bin", TestResource(name: "a", size: 50_000))
            server.add("/b.bin", TestResource(name: "b", size: 60_000))
            server.add("/c.bin", TestResource(name: "c", size: 70_000))
            let a = server.resource("/a.bin")!
            let list = """
                # three files
                \(server.url("/a.bin"))
                  out=renamed.bin
                  checksum=sha-256=\(sha256Hex(a.content))

                \(server.url("/b.bin"))
                  dir=sub
                  header=X-Trace: from-list
                \(server.url("/c.bin"))
                """
            try list.write(toFile: directory + "/list.txt", atomically: true, encoding: .utf8)
            let result = try await HaulProcess.run(
                ["get", "-i", directory + "/list.txt", "-d", directory, "-j", "2", "--state-dir", state])
            #expect(result.status == 0, "\(result.errors)")
            #expect(contents(directory + "/renamed.bin") == a.content)
            #expect(contents(directory + "/sub/b.bin") == server.resource("/b.bin")!.content)
            #expect(contents(directory + "/c.bin") == server.resource("/c.bin")!.content)
            #expect(server.requests(for: "/b.bin").last?.header("x-trace") == "from-list")
            #expect(result.errors.contains("3 of 3 saved"))

            // A wrong checksum on a line fails that download only, with the checksum exit code.
            let bad =
                "\(server.url("/a.bin"))\n  out=bad.bin\n  checksum=sha-256=\(String(repeating: "0", count: 64))\n"
                + "\(server.url("/c.bin"))\n  out=c2.bin\n"
            try bad.write(toFile: directory + "/bad.txt", atomically: true, encoding: .utf8)
            let failed = try await HaulProcess.run(
                ["get", "-i", directory + "/bad.txt", "-d", directory, "--state-dir", state])
            #expect(failed.status == 16)
            #expect(!FileManager.default.fileExists(atPath: directory + "/bad.bin"))
            #expect(contents(directory + "/c2.bin") == server.resource("/c.bin")!.content)

            // Windows line ends, tabs and blanks around a line's text are not part of it.
            let spaced =
                "\t# a comment after a tab\r\n\(server.url("/b.bin"))  \r\n\tout=tabbed.bin \t\r\n"
                + "   \r\n\(server.url("/c.bin"))\r\n \t dir=crlf\r\n"
            try spaced.write(toFile: directory + "/spaced.txt", atomically: true, encoding: .utf8)
            let read = try await HaulProcess.run(
                ["get", "-i", directory + "/spaced.txt", "-d", directory, "--state-dir", state])
            #expect(read.status == 0, "\(read.errors)")
            #expect(contents(directory + "/tabbed.bin") == server.resource("/b.bin")!.content)
            #expect(contents(directory + "/crlf/c.bin") == server.resource("/c.bin")!.content)

            // Errors in the file name the line, and nothing is downloaded.
            for (text, message) in [
                ("\(server.url("/a.bin"))\n  colour=blue\n", "list2.txt:2: unknown option 'colour'"),
                ("  out=x\n", "list2.txt:1: an option line must follow a URL line"),
                ("\(server.url("/a.bin")) out=x\n", "list2.txt:1: one URL per line"),
                ("\(server.url("/a.bin"))\n  checksum=sha-256=12\n", "list2.txt:2:"),
                ("ftp://example.com/x\n", "unsupported scheme ftp"),
                (
                    "\(server.url("/a.bin"))\n  header=X-A: 1\n\(server.url("/b.bin"))\n  secret-header=X-A\n",
                    "list2.txt:3: secret-header=X-A names no header of this URL"
                ),
                ("\(server.url("/a.bin"))\n  limit-rate=fast\n", "list2.txt:2:"),
                ("\(server.url("/a.bin"))\n  dir=d\n  out=/abs\n", "list2.txt:3: out= cannot be an absolute path"),
                ("\(server.url("/a.bin"))\n  mirror=ftp://m/a\n", "list2.txt:2: mirror=:"),
            ] {
                try text.write(toFile: directory + "/list2.txt", atomically: true, encoding: .utf8)
                let refused = try await HaulProcess.run(
                    ["get", "-i", directory + "/list2.txt", "-d", directory + "/none", "--state-dir", state])
                #expect(refused.status != 0)
                #expect(refused.errors.contains(message), "\(refused.errors)")
                #expect(refused.errors.split(separator: "\n").count == 1, "\(refused.errors)")
                #expect(!FileManager.default.fileExists(atPath: directory + "/none"))
            }
        }
    }

    @Test func pauseAndRemoveADownloadAnotherProcessRuns() async throws {
        try await HaulTestServer.withRunning { server in
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            for name in ["kept", "dropped"] {
                server.add("/\(name).bin", TestResource(name: name, size: 8 << 20))
                server.setStandingFaults("/\(name).bin", [.throttle(bytesPerSecond: 512 * 1024)])
            }
            let haul = try HaulProcess(
                [
                    "get", server.url("/kept.bin"), server.url("/dropped.bin"), "-d", directory, "--state-dir", state,
                    "-x", "1",
                ])
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline,
                (size(directory + "/kept.bin.haul.part") ?? 0) < 100_000
                    || (size(directory + "/dropped.bin.haul.part") ?? 0) < 100_000
            {
                try await Task.sleep(for: .milliseconds(20))
            }
            let ids = Dictionary(
                uniqueKeysWithValues: try await listDownloads(state).map { ($0["name"] as! String, $0["id"] as! Int) })
            let kept = try #require(ids["kept.bin"])
            let dropped = try #require(ids["dropped.bin"])

            let paused = try await HaulProcess.run(["pause", String(kept), "--state-dir", state])
            #expect(paused.status == 0, "\(paused.errors)")
            #expect(paused.output == "paused \(kept)\n")
            let removed = try await HaulProcess.run(["rm", String(dropped), "--delete-files", "--state-dir", state])
            #expect(removed.status == 0, "\(removed.errors)")
            // Both stopped long before their 16 s at the throttled rate: the running process carried them out.
            let (status, _, errors) = try await haul.finish(timeout: .seconds(10))
            #expect(status == 1)
            #expect(errors.contains("haul: [\(kept)] paused; `haul resume \(kept)` continues it"), "\(errors)")
            #expect(errors.contains("haul: [\(dropped)] removed"), "\(errors)")
            #expect(errors.contains("0 of 2 saved"), "\(errors)")
            #expect(errors.contains("1 paused, 1 removed"), "\(errors)")
            #expect(!FileManager.default.fileExists(atPath: directory + "/dropped.bin.haul.part"))
            #expect(!FileManager.default.fileExists(atPath: directory + "/dropped.bin.haul.json"))

            let listed = try await listDownloads(state)
            #expect(listed.count == 1)
            #expect(listed.first?["state"] as? String == "paused")
            let stored = try #require(size(directory + "/kept.bin.haul.part"))
            #expect(listed.first?["bytes"] as? Int == Int(stored))

            server.setStandingFaults("/kept.bin", [])
            let requestsBefore = server.requests(for: "/kept.bin").count
            let resumed = try await HaulProcess.run(["resume", String(kept), "--state-dir", state, "-x", "4"])
            #expect(resumed.status == 0, "\(resumed.errors)")
            #expect(contents(directory + "/kept.bin") == server.resource("/kept.bin")!.content)
            // It continues where it stopped, then (with four connections from the start) splits the rest.
            let after = server.requests(for: "/kept.bin").dropFirst(requestsBefore)
            #expect(after.first?.header("range") == "bytes=\(stored)-")
            #expect(after.count > 1)
        }
    }

    @Test func pauseRetryAndRemoveByID() async throws {
        try await HaulTestServer.withRunning { server in
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            server.add("/ok.bin", TestResource(name: "ok", size: 40_000))
            server.add("/missing.bin", TestResource(name: "missing", size: 40_000))
            server.setStandingFaults("/missing.bin", [.status(404)])
            let first = try await HaulProcess.run(
                ["get", server.url("/ok.bin"), server.url("/missing.bin"), "-d", directory, "--state-dir", state])
            #expect(first.status == 4)
            #expect(first.errors.contains("1 of 2 saved"))
            let listed = try await listDownloads(state)
            let failed = try #require(listed.first { $0["state"] as? String == "failed" })
            let failedID = try #require(failed["id"] as? Int)
            #expect(failed["errorCode"] as? String == "httpStatus")

            // Retry once the server has it.
            server.setStandingFaults("/missing.bin", [])
            let retried = try await HaulProcess.run(["retry", String(failedID), "--state-dir", state])
            #expect(retried.status == 0, "\(retried.errors)")
            #expect(contents(directory + "/missing.bin") == server.resource("/missing.bin")!.content)

            // Wrong IDs and wrong states are one-line errors with their own exit codes.
            let unknown = try await HaulProcess.run(["pause", "999", "--state-dir", state])
            #expect(unknown.status == 17)
            #expect(unknown.errors == "haul: error: there is no download 999\n")
            let notPausable = try await HaulProcess.run(["pause", String(failedID), "--state-dir", state])
            #expect(notPausable.status == 18)
            let notAnID = try await HaulProcess.run(["rm", "abc", "--state-dir", state])
            #expect(notAnID.status == 64)

            let removed = try await HaulProcess.run(["rm", String(failedID), "--delete-files", "--state-dir", state])
            #expect(removed.status == 0)
            #expect(!FileManager.default.fileExists(atPath: directory + "/missing.bin"))
            #expect(FileManager.default.fileExists(atPath: directory + "/ok.bin"))
            #expect(try await listDownloads(state).count == 1)
        }
    }
}

@Suite(.timeLimit(.minutes(2)))
struct SegmentedCommandTests {
    @Test func killedSegmentedDownloadResumesEverySegmentFromItsRecordedOffset() async throws {
        try await HaulTestServer.withRunning { server in try await killSegmentedThenResume(server) }
    }

    private func killSegmentedThenResume(_ server: HaulTestServer) async throws {
        let resource = TestResource(name: "segmented", size: 32 * 1024 * 1024)
        server.add("/seg.bin", resource)
        server.setStandingFaults("/seg.bin", [.throttle(bytesPerSecond: 1024 * 1024)])
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let destination = directory + "/seg.bin"
        let arguments = [
            "get", server.url("/seg.bin"), "-o", destination, "-x", "4", "--min-split-size", "1M", "-q",
            "--state-dir", directory + "/state",
        ]
        let haul = try HaulProcess(arguments)
        // Wait for a checkpoint that records progress in four segments, then kill without warning.
        var recorded: [[String: Any]] = []
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            if let data = contents(destination + ".haul.json"),
                let manifest = try? JSONSerialization.jsonObject(with: Data(data)) as? [String: Any],
                let segments = manifest["segments"] as? [[String: Any]],
                segments.count >= 4, segments.allSatisfy({ ($0["written"] as? Int ?? 0) > 0 })
            {
                recorded = segments
                break
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(recorded.count >= 4)
        haul.signal(SIGKILL)
        _ = try await haul.finish()
        #expect(haul.endedBySignal)
        let manifest = try #require(
            try JSONSerialization.jsonObject(with: Data(contents(destination + ".haul.json") ?? [])) as? [String: Any])
        let segments = try #require(manifest["segments"] as? [[String: Any]])
        let sentBeforeResume = server.bodyBytesSent
        let requestsBefore = server.requests(for: "/seg.bin").count

        server.setStandingFaults("/seg.bin", [])
        let (status, _, errors) = try await HaulProcess.run(arguments)
        #expect(status == 0, "\(errors)")
        #expect(contents(destination) == resource.content)
        // Every unfinished segment continued exactly where its manifest said, with the validator.
        let later = server.requests(for: "/seg.bin").dropFirst(requestsBefore)
        for segment in segments {
            let start = try #require(segment["start"] as? Int)
            let end = try #require(segment["end"] as? Int)
            let written = try #require(segment["written"] as? Int)
            guard start + written < end else { continue }
            #expect(
                later.contains { $0.header("range")?.hasPrefix("bytes=\(start + written)-") == true },
                "no request resumed the segment at \(start + written)")
        }
        #expect(later.allSatisfy { $0.header("if-range") == resource.entityTagValue })
        // What was fetched twice: at most what arrived after the last checkpoint, per connection.
        let kept = segments.reduce(0) { $0 + ($1["written"] as? Int ?? 0) }
        let refetched = Int(sentBeforeResume) - kept
        #expect(refetched < 4 * 2 * 1024 * 1024, "re-fetched \(refetched) bytes")
    }
}

/// `haul add -i` with a list longer than what it reads at once: nothing is added when a line
/// near its end is wrong; a right one is added whole, from a file or from standard input.
@Suite(.timeLimit(.minutes(2)))
struct LongListTests {
    @Test func aLongListWithABadLineNearItsEndAddsNothingAndAFixedOneAddsAll() async throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let state = directory + "/state"
        let count = 5_000
        let lines = (0..<count).map { "http://127.0.0.1:9/f\($0)?n=\($0)\n  out=q\($0)\n" }.joined()
        let list = directory + "/list.txt"
        try (lines + "  bogus=1\n").write(toFile: list, atomically: true, encoding: .utf8)
        let bad = try await HaulProcess.run(["add", "-i", list, "-d", directory + "/files", "--state-dir", state])
        #expect(bad.status == 2)
        #expect(bad.errors.contains("\(list):\(2 * count + 1): unknown option 'bogus'"), "\(bad.errors)")
        #expect(bad.output.isEmpty)
        let empty = try await HaulProcess.run(["ls", "--json", "--state-dir", state])
        #expect(empty.status == 0)
        #expect((try JSONSerialization.jsonObject(with: Data(empty.output.utf8)) as? [Any])?.count == 0)

        // A file of someone else's in the way of one of the last: refused, nothing added.
        try lines.write(toFile: list, atomically: true, encoding: .utf8)
        try FileManager.default.createDirectory(atPath: directory + "/files", withIntermediateDirectories: true)
        let blocker = directory + "/files/q\(count - 5)"
        try "theirs".write(toFile: blocker, atomically: true, encoding: .utf8)
        let refused = try await HaulProcess.run(["add", "-i", list, "-d", directory + "/files", "--state-dir", state])
        #expect(refused.status == 14, "\(refused.errors)")
        #expect(refused.errors.contains("q\(count - 5) already exists"), "\(refused.errors)")
        let stillEmpty = try await HaulProcess.run(["ls", "--json", "--state-dir", state])
        #expect((try JSONSerialization.jsonObject(with: Data(stillEmpty.output.utf8)) as? [Any])?.count == 0)
        try FileManager.default.removeItem(atPath: blocker)

        let added = try await HaulProcess.run(["add", "-i", list, "-d", directory + "/files", "--state-dir", state])
        #expect(added.status == 0, "\(added.errors)")
        let ids = added.output.split(separator: "\n").compactMap { Int($0) }
        #expect(ids.count == count && ids == ids.sorted() && Set(ids).count == count)
        // From standard input, which is read twice too: the same downloads, added again, same IDs.
        let again = try await HaulProcess.run(
            ["add", "-i", "-", "-d", directory + "/files", "--state-dir", state], standardInput: list)
        #expect(again.status == 0, "\(again.errors)")
        #expect(again.output.split(separator: "\n").compactMap { Int($0) } == ids)
        let more = try await HaulProcess.run(
            ["add", "-i", "-", "-d", directory + "/more", "--state-dir", state], standardInput: list)
        #expect(more.status == 0, "\(more.errors)")
        #expect(more.output.split(separator: "\n").count == count)
        let stats = try await HaulProcess.run(["ls", "--json", "--state", "queued", "--state-dir", state])
        #expect((try JSONSerialization.jsonObject(with: Data(stats.output.utf8)) as? [Any])?.count == 2 * count)
    }
}

@Suite(.timeLimit(.minutes(2)))
struct SharedStateTests {
    @Test func processesOpeningANewStateAtOnceAllSucceed() async throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for round in 1...4 {
            let state = directory + "/state\(round)"
            let processes = try (1...8).map { index in
                try HaulProcess(["add", "http://127.0.0.1:9/f\(index)", "-d", directory, "--state-dir", state])
            }
            for process in processes {
                let (status, _, errors) = try await process.finish()
                #expect(status == 0, "\(errors)")
            }
            let (status, output, _) = try await HaulProcess.run(["ls", "--json", "--state-dir", state])
            #expect(status == 0)
            let listed = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [[String: Any]]
            #expect(listed?.count == 8)
        }
    }
}

@Suite(.timeLimit(.minutes(2)))
struct LabelTests {
    /// A label given to `haul get` is kept with the download and shown by `haul ls` (a column of its
    /// own, `-` for a download without one) and `haul ls --json`; one with a line break is refused
    /// and nothing is downloaded.
    @Test func aLabelIsKeptAndListed() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/a.bin", TestResource(name: "a.bin", size: 5000))
            server.add("/b.bin", TestResource(name: "b.bin", size: 6000))
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            let got = try await HaulProcess.run(
                [
                    "get", "--label", "nightly build 7", "-d", directory, "--state-dir", state, "-q",
                    server.url("/a.bin"),
                ])
            #expect(got.status == 0, "\(got.errors)")
            let plain = try await HaulProcess.run(
                ["get", "-d", directory, "--state-dir", state, "-q", server.url("/b.bin")])
            #expect(plain.status == 0, "\(plain.errors)")

            let listed = try await listDownloads(state)
            #expect(listed.map { $0["label"] as? String } == ["nightly build 7", nil])
            let table = try await HaulProcess.run(["ls", "--state-dir", state]).output.split(separator: "\n")
            #expect(table.first?.hasSuffix("LABEL            NAME") == true, "\(table)")
            #expect(table.dropFirst().first?.hasSuffix("nightly build 7  a.bin") == true, "\(table)")
            #expect(table.dropFirst(2).first?.hasSuffix("-                b.bin") == true, "\(table)")

            let refused = try await HaulProcess.run(
                ["get", "--label", "two\nlines", "-d", directory, "--state-dir", state, server.url("/c.bin")])
            #expect(refused.status == 2)
            #expect(refused.errors == "haul: error: a label cannot hold control or invisible formatting characters\n")
            #expect(try await listDownloads(state).count == 2)
        }
    }
}
