import Crypto
import Foundation
import Haul
import HaulTestServer
import Testing

func sha256Hex(_ bytes: [UInt8]) -> String {
    SHA256.hash(data: bytes).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
}

@Suite(.timeLimit(.minutes(3)), .serialized)
struct GetCommandTests {
    @Test func killedRepeatedlyThenResumedGivesAByteIdenticalFile() async throws {
        try await HaulTestServer.withRunning { server in try await killRepeatedlyThenResume(server) }
    }

    /// Kept out of the closure above: the compiler's region checker crashes on this body inside a closure.
    private func killRepeatedlyThenResume(_ server: HaulTestServer) async throws {
        let resource = TestResource(name: "killed", size: 12 * 1024 * 1024 + 5)
        server.add("/big.bin", resource)
        server.setStandingFaults("/big.bin", [.throttle(bytesPerSecond: 3 * 1024 * 1024)])
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let destination = directory + "/big.bin"
        let arguments = ["get", server.url("/big.bin"), "-o", destination, "--quiet", "-x", "1"]

        var sizesAtKill: [Int64] = []
        for round in 1...3 {
            let haul = try HaulProcess(arguments)
            // Let this round add roughly another megabyte, then kill without warning.
            let target = (sizesAtKill.last ?? 0) + 1024 * 1024
            let deadline = ContinuousClock.now + .seconds(20)
            while (size(destination + ".haul.part") ?? 0) < target && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(20))
            }
            try await Task.sleep(for: .milliseconds(Int64(50 * round)))
            haul.signal(SIGKILL)
            let (status, _, _) = try await haul.finish()
            // It died by the SIGKILL, not by finishing or failing on its own.
            #expect(haul.endedBySignal && status == SIGKILL)
            let partial = try #require(size(destination + ".haul.part"))
            sizesAtKill.append(partial)
            #expect(!FileManager.default.fileExists(atPath: destination))
        }
        #expect(sizesAtKill == sizesAtKill.sorted())

        server.setStandingFaults("/big.bin", [])
        let (status, _, errors) = try await HaulProcess.run(arguments)
        #expect(status == 0, "\(errors)")
        #expect(contents(destination) == resource.content)
        let names = try FileManager.default.contentsOfDirectory(atPath: directory)
        #expect(names == ["big.bin"])
        // Every run after the first resumed with a checked range; none started again from zero.
        let requests = server.requests(for: "/big.bin")
        #expect(requests.count == 4)
        for request in requests.dropFirst() {
            let range = try #require(request.header("range"))
            #expect(range != "bytes=0-")
            #expect(request.header("if-range") == resource.entityTagValue)
        }
        // Re-fetched bytes stay small: at most what the manifest had not yet recorded at each kill.
        let fetched = server.bodyBytesSent
        #expect(fetched < resource.size + 3 * 4 * 1024 * 1024)
    }

    @Test func interruptCheckpointsExitsWith130AndTheNextRunResumes() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "interrupted", size: 6 * 1024 * 1024)
            server.add("/f.bin", resource)
            server.script("/f.bin", [[.throttle(bytesPerSecond: 2 * 1024 * 1024)]])
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let haul = try HaulProcess(["get", server.url("/f.bin"), "-d", directory, "--json", "-x", "1"])
            while (size(directory + "/f.bin.haul.part") ?? 0) < 1024 * 1024 && haul.isRunning {
                try await Task.sleep(for: .milliseconds(20))
            }
            haul.signal(SIGINT)
            let (status, output, _) = try await haul.finish()
            #expect(status == 130)
            #expect(output.contains("\"event\":\"started\""))
            #expect(output.contains("\"code\":\"cancelled\""))
            let partial = try #require(size(directory + "/f.bin.haul.part"))
            let manifest = try #require(contents(directory + "/f.bin.haul.json"))
            #expect(String(decoding: manifest, as: UTF8.self).contains("\"written\":\(partial)"))

            let (second, _, errors) = try await HaulProcess.run([
                "get", server.url("/f.bin"), "-d", directory, "-x", "1",
            ])
            #expect(second == 0, "\(errors)")
            #expect(errors.contains("resum"))
            #expect(contents(directory + "/f.bin") == resource.content)
            #expect(server.requests(for: "/f.bin").last?.header("range") == "bytes=\(partial)-")
        }
    }

    /// A server that answers range requests with 503 and `Retry-After: 86400`: `haul get` ends within
    /// seconds, with the default connections and with `-x 1`. A fresh download is served by a plain
    /// request; a resume (which needs a range) fails at once with exit code 4, its data kept.
    @Test(arguments: [[String](), ["-x", "1"]])
    func rangesRefusedForADayEndWithinSeconds(connections: [String]) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "busy.bin", size: 2 * 1024 * 1024 + 5)
            server.add("/busy.bin", resource)
            server.setStandingFaults(
                "/busy.bin", [.refuseRanges(status: 503, retryAfter: "86400", sparingFromStart: false)])
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let started = ContinuousClock.now
            let fresh = try await HaulProcess.run(
                ["get", server.url("/busy.bin"), "-d", directory, "-q"] + connections)
            #expect(fresh.status == 0, "\(fresh.errors)")
            #expect(contents(directory + "/busy.bin") == resource.content)

            // Half a file from an earlier session: continuing it needs a range.
            try FileManager.default.removeItem(atPath: directory + "/busy.bin")
            server.setStandingFaults("/busy.bin", [.closeAfter(bytes: 1_000_000)])
            let first = try await HaulProcess.run(
                ["get", server.url("/busy.bin"), "-d", directory, "-q", "-x", "1", "--retries", "0"])
            #expect(first.status == 5)
            let stored = try #require(size(directory + "/busy.bin.haul.part"))
            server.setStandingFaults(
                "/busy.bin", [.refuseRanges(status: 503, retryAfter: "86400", sparingFromStart: false)])
            let refused = try await HaulProcess.run(
                ["get", server.url("/busy.bin"), "-d", directory, "-q"] + connections)
            #expect(refused.status == 4)
            #expect(refused.errors.split(separator: "\n").count == 1)
            #expect(
                refused.errors.contains("503") && refused.errors.contains("longer than allowed"), "\(refused.errors)")
            #expect(size(directory + "/busy.bin.haul.part") == stored)
            #expect(ContinuousClock.now - started < .seconds(30))
        }
    }

    @Test func errorsAreOneLineWithDocumentedExitCodes() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/exists", TestResource(name: "exists", size: 10))
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }

            let missing = try await HaulProcess.run(["get", server.url("/missing"), "-d", directory])
            #expect(missing.status == 4)
            #expect(missing.errors == "haul: error: the server answered 404 Not Found\n")

            let scheme = try await HaulProcess.run(["get", "ftp://127.0.0.1/x", "-d", directory])
            #expect(scheme.status == 3)
            #expect(scheme.errors.split(separator: "\n").count == 1)

            #expect(FileManager.default.createFile(atPath: directory + "/exists", contents: Data("mine".utf8)))
            let exists = try await HaulProcess.run(["get", server.url("/exists"), "-d", directory, "-q"])
            #expect(exists.status == 14)
            #expect(exists.errors.contains("--force"))
            #expect(contents(directory + "/exists") == Array("mine".utf8))

            let forced = try await HaulProcess.run(["get", server.url("/exists"), "-d", directory, "-q", "--force"])
            #expect(forced.status == 0)
            #expect(contents(directory + "/exists") == server.resource("/exists")?.content)

            let badHeader = try await HaulProcess.run(["get", server.url("/exists"), "-H", "no colon"])
            #expect(badHeader.status == 64)
            #expect(badHeader.errors.contains("Name: value"))

            let both = try await HaulProcess.run(["get", server.url("/exists"), "-d", directory, "-o", "/tmp/x"])
            #expect(both.status == 64)
            #expect(both.errors.contains("absolute -o"))
            let quietJSON = try await HaulProcess.run(["get", server.url("/exists"), "-q", "--json"])
            #expect(quietJSON.status == 64)
            let badRate = try await HaulProcess.run(["get", server.url("/exists"), "--limit-rate", "fast"])
            #expect(badRate.status == 64)
            let badAllocation = try await HaulProcess.run([
                "get", server.url("/exists"), "--file-allocation", "prealloc",
            ])
            #expect(badAllocation.status == 64)
            #expect(badAllocation.errors.contains("--file-allocation must be one of none, trunc, falloc"))
            #expect(badRate.errors.contains("is not a rate"))
            // A size is no rate: --keep-free takes 0 (nothing kept free) and says "size" when wrong.
            let badSize = try await HaulProcess.run(["get", server.url("/exists"), "--keep-free", "lots"])
            #expect(badSize.status == 64 && badSize.errors.contains("is not a size"), "\(badSize.errors)")
            let noMargin = try await HaulProcess.run([
                "get", server.url("/exists"), "-o", directory + "/no-margin", "-q", "--keep-free", "0",
            ])
            #expect(noMargin.status == 0, "\(noMargin.errors)")
            #expect(contents(directory + "/no-margin") == server.resource("/exists")?.content)
        }
    }

    @Test func aRefusedConnectionFailsAtOnceUnlessRetriesAreAskedFor() async throws {
        // A port bound but not listening refuses connections; no other test can take it meanwhile.
        let refusing = try RefusingPort()
        defer { refusing.close() }
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let url = "http://127.0.0.1:\(refusing.port)/file.bin"
        // The default would retry ten times over minutes: the suite's time limit would end it first.
        let refused = try await HaulProcess.run(["get", url, "-d", directory, "-q"])
        #expect(refused.status == 5)
        #expect(refused.errors == "haul: error: cannot connect to 127.0.0.1:\(refusing.port): connection refused\n")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty)
        // Asked to, it retries like any network failure.
        let retried = try await HaulProcess.run([
            "get", url, "-d", directory, "-q", "--retry-connrefused", "--retries", "2", "--retry-delay", "0.01",
        ])
        #expect(retried.status == 5)
        #expect(retried.errors.hasSuffix("connection refused (gave up after 2 retries)\n"), "\(retried.errors)")
    }

    @Test func httpsNeedsATrustedAuthorityAndSpeaksHTTP2UnlessTold() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            let resource = TestResource(name: "secure", size: 300_000)
            server.add("/secure.bin", resource)
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let authority = directory + "/authority.pem"
            #expect(
                FileManager.default.createFile(
                    atPath: authority, contents: Data(HaulTestServer.certificateAuthorityPEM.utf8)))

            let untrusted = try await HaulProcess.run(["get", server.url("/secure.bin"), "-d", directory, "-q"])
            #expect(untrusted.status == 7)
            #expect(untrusted.errors.hasPrefix("haul: error: TLS with 127.0.0.1 failed"))
            #expect(untrusted.errors.split(separator: "\n").count == 1)
            #expect(server.requests.isEmpty)

            let missing = try await HaulProcess.run([
                "get", server.url("/secure.bin"), "-d", directory, "--ca-cert", directory + "/nope.pem",
            ])
            #expect(missing.status == 64)
            #expect(missing.errors.contains("--ca-cert: cannot read the certificate file \(directory)/nope.pem"))

            let trusted = try await HaulProcess.run([
                "get", server.url("/secure.bin"), "-d", directory, "-q", "--ca-cert", authority,
            ])
            #expect(trusted.status == 0, "\(trusted.errors)")
            #expect(contents(directory + "/secure.bin") == resource.content)
            #expect(server.requests.map(\.version) == ["HTTP/2"])

            let http1 = try await HaulProcess.run([
                "get", server.url("/secure.bin"), "-o", directory + "/again.bin", "-q", "--ca-cert", authority,
                "--no-http2",
            ])
            #expect(http1.status == 0, "\(http1.errors)")
            #expect(contents(directory + "/again.bin") == resource.content)
            #expect(server.requests.map(\.version) == ["HTTP/2", "HTTP/1.1"])
        }
    }

    @Test func checksumMismatchExitsWith16AndTheRightChecksumFinishesFromDisk() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "summed", size: 200_000)
            server.add("/s.bin", resource)
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let wrong = "sha-256=" + String(repeating: "0", count: 64)
            let failed = try await HaulProcess.run(["get", server.url("/s.bin"), "-d", directory, "--checksum", wrong])
            #expect(failed.status == 16)
            #expect(failed.errors.contains("checksum mismatch"))
            #expect(!FileManager.default.fileExists(atPath: directory + "/s.bin"))

            let right = "sha-256=" + sha256Hex(resource.content)
            let passed = try await HaulProcess.run([
                "get", server.url("/s.bin"), "-d", directory, "--checksum", right, "-q",
            ])
            #expect(passed.status == 0, "\(passed.errors)")
            #expect(contents(directory + "/s.bin") == resource.content)
            #expect(server.requests.count == 1)

            let weak = try await HaulProcess.run([
                "get", server.url("/s.bin"), "-o", directory + "/md5.bin", "--checksum",
                "md5=" + String(repeating: "0", count: 32),
            ])
            #expect(weak.errors.contains("note: md5 is weak"))
            #expect(weak.status == 16)

            let malformed = try await HaulProcess.run(["get", server.url("/s.bin"), "--checksum", "sha-256=xyz"])
            #expect(malformed.status == 64)
            #expect(malformed.errors.contains("64 hexadecimal digits"))
        }
    }

    @Test func verifyReportsIntactAndDamagedDownloads() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "verified", size: 300_000)
            server.add("/v.bin", resource)
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let file = directory + "/v.bin"
            let got = try await HaulProcess.run(["get", server.url("/v.bin"), "-o", file, "-q"])
            #expect(got.status == 0)

            let right = try await HaulProcess.run([
                "verify", file, "--checksum", "sha-256=" + sha256Hex(resource.content),
            ])
            #expect(right.status == 0)
            #expect(right.output == "haul: \(file): sha-256 matches\n")

            let wrong = try await HaulProcess.run([
                "verify", file, "--checksum", "sha-256=" + String(repeating: "1", count: 64),
            ])
            #expect(wrong.status == 16)
            #expect(wrong.errors.contains("checksum mismatch"))

            let nothing = try await HaulProcess.run(["verify", file])
            #expect(nothing.status == 2)
            #expect(nothing.errors.contains("give --checksum"))

            let missing = try await HaulProcess.run(["verify", directory + "/none"])
            #expect(missing.status == 12)
        }
    }

    @Test func verifyOfADamagedUnfinishedDownloadExitsWith16AndGetFetchesTheRest() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "unfinished", size: 20 * 1024 * 1024)
            server.add("/u.bin", resource)
            server.script("/u.bin", [[.closeAfter(bytes: 13 * 1024 * 1024)]])
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let file = directory + "/u.bin"
            let first = try await HaulProcess.run([
                "get", server.url("/u.bin"), "-o", file, "-q", "--retries", "0", "-x", "1",
            ])
            #expect(first.status == 5)

            let intact = try await HaulProcess.run(["verify", file])
            #expect(intact.status == 0, "\(intact.errors)")
            #expect(intact.output.contains("3 pieces of 4.0 MiB checked, all intact"))

            // Damage the second piece.
            let handle = try #require(FileHandle(forUpdatingAtPath: file + ".haul.part"))
            try handle.seek(toOffset: 5 * 1024 * 1024)
            try handle.write(contentsOf: Data([0, 1, 2, 3]))
            try handle.close()
            let damaged = try await HaulProcess.run(["verify", file])
            #expect(damaged.status == 16)
            #expect(damaged.output.contains("1 of 3 pieces of 4.0 MiB damaged: piece 1 (4.0 MiB–8.0 MiB)"))
            let stored = try #require(size(file + ".haul.part"))
            #expect(damaged.output.contains("kept \(ByteCount.format(stored - 4 * 1024 * 1024))"))

            // Only the damaged piece and the rest are fetched.
            let requestsBefore = server.requests.count
            let last = try await HaulProcess.run(["get", server.url("/u.bin"), "-o", file, "-q", "-x", "1"])
            #expect(last.status == 0)
            #expect(contents(file) == resource.content)
            let ranges = server.requests.dropFirst(requestsBefore).compactMap { $0.header("range") }
            #expect(ranges.first == "bytes=\(4 * 1024 * 1024)-\(8 * 1024 * 1024 - 1)")
            #expect(ranges.dropFirst().first?.hasPrefix("bytes=\(stored)-") == true)
        }
    }

    @Test func pipedOutputPrintsPlainLines() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "lines", size: 300_000)
            server.add("/plain.txt", resource)
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let result = try await HaulProcess.run(["get", server.url("/plain.txt")], directory: directory)
            #expect(result.status == 0)
            #expect(!result.errors.contains("\u{1B}["))
            #expect(result.errors.contains("haul: saved \(directory)/plain.txt (293.0 KiB)"))
            // A short download prints its start and its end, and no progress line without a speed.
            #expect(!result.errors.contains("0 B/s"))
            #expect(result.errors.split(separator: "\n").count == 2)
            #expect(contents(directory + "/plain.txt") == resource.content)
        }
    }

    @Test func verbosePrintsRedirectsAndRetriesOneLineEach() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "verbose", size: 300_000)
            server.add("/file.bin", resource)
            server.add("/moved", .redirect(to: server.url("/file.bin")))
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }

            // The first request (for bytes=0-) and the one that follows are both told to come back.
            server.script("/file.bin", [[.status(503, retryAfter: "0")], [.status(503, retryAfter: "0")]])
            let verbose = try await HaulProcess.run(["get", "-v", server.url("/moved"), "-o", directory + "/v.bin"])
            #expect(verbose.status == 0, "\(verbose.errors)")
            #expect(contents(directory + "/v.bin") == resource.content)
            let lines = verbose.errors.split(separator: "\n")
            #expect(
                lines.contains {
                    $0 == "haul: debug: redirected (from=\(server.url("/moved")), to=\(server.url("/file.bin")))"
                }, "\(verbose.errors)")
            #expect(
                lines.contains {
                    $0
                        == "haul: debug: the server answered bytes=0- with 503; asking without a range (url=\(server.url("/moved")))"
                }, "\(verbose.errors)")
            #expect(
                lines.contains {
                    $0.hasPrefix("haul: debug: connection 0: ") && $0.contains("503") && $0.contains("retry 1")
                },
                "\(verbose.errors)")

            // Without -v the same download prints no debug line.
            server.script("/file.bin", [[.status(503, retryAfter: "0")]])
            let plain = try await HaulProcess.run(["get", server.url("/moved"), "-o", directory + "/p.bin"])
            #expect(plain.status == 0, "\(plain.errors)")
            #expect(contents(directory + "/p.bin") == resource.content)
            #expect(!plain.errors.contains("debug"), "\(plain.errors)")
        }
    }
}

@Suite(.timeLimit(.minutes(1)))
struct LockCommandTests {
    @Test func aSecondProcessIsRefusedWithTheFirstOnesPID() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "contended", size: 4 * 1024 * 1024)
            server.add("/c.bin", resource)
            server.script("/c.bin", [[.throttle(bytesPerSecond: 2 * 1024 * 1024)]])
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let arguments = ["get", server.url("/c.bin"), "-o", directory + "/c.bin", "-q", "-x", "1"]
            let first = try HaulProcess(arguments)
            while (size(directory + "/c.bin.haul.part") ?? 0) == 0 && first.isRunning {
                try await Task.sleep(for: .milliseconds(20))
            }
            let second = try await HaulProcess.run(arguments)
            #expect(second.status == 13)
            #expect(second.errors.contains("pid \(first.pid)"))
            let (status, _, errors) = try await first.finish()
            #expect(status == 0, "\(errors)")
            #expect(contents(directory + "/c.bin") == resource.content)
            #expect(server.requests(for: "/c.bin").count == 1)
        }
    }
}

@Suite(.timeLimit(.minutes(1)))
struct HostCapCommandTests {
    @Test func maxConnectionsPerHostCapsEveryDownloadOfTheRunAndRefusesWhatIsNoCount() async throws {
        try await HaulTestServer.withRunning { server in
            let names = (1...4).map { "capped\($0).bin" }
            for (index, name) in names.enumerated() {
                server.add("/\(name)", TestResource(name: name, size: 300_000 + Int64(index)))
                server.setStandingFaults("/\(name)", [.throttle(bytesPerSecond: 1 << 20)])
            }
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let capped = try await HaulProcess.run(
                ["get", "-j", "4", "-x", "2", "--max-connections-per-host", "1", "-d", directory, "-q", "--no-daemon"]
                    + names.map { server.url("/\($0)") }, stateDirectory: directory + "/state")
            #expect(capped.status == 0, "\(capped.errors)")
            for name in names { #expect(contents(directory + "/" + name) == server.resource("/\(name)")?.content) }
            #expect(server.maximumOpenConnections == 1)
            #expect(server.maximumRequestsAnswering == 1)

            for bad in ["0", "-3", "many"] {
                let refused = try await HaulProcess.run(
                    [
                        "get", server.url("/capped1.bin"), "--max-connections-per-host", bad, "-d", directory,
                        "--no-daemon",
                    ],
                    stateDirectory: directory + "/state")
                #expect(refused.status == 64, "\(bad): \(refused.errors)")
                #expect(refused.errors.split(separator: "\n").first?.contains("--max-connections-per-host") == true)
            }
            for command in [["get"], ["daemon"], ["resume"]] {
                let help = try await HaulProcess.run(command + ["--help"])
                #expect(help.output.contains("--max-connections-per-host <n>"), "\(command)")
            }
        }
    }
}

@Suite(.timeLimit(.minutes(1)))
struct DaemonOptionTests {
    /// Options a daemon cannot use are refused in one line, before it starts: a limit of one
    /// download (given when it is added), and two netrc files at once.
    @Test(arguments: [
        (["--limit-rate", "1M"], "--total-limit-rate"),
        (["--netrc", "--netrc-file", "/nonexistent"], "--netrc or --netrc-file"),
    ])
    func aDaemonRefusesWhatItCannotUse(_ options: [String], _ message: String) async throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let refused = try await HaulProcess.run(
            ["daemon", "--listen", "127.0.0.1:0"] + options, stateDirectory: directory + "/state")
        #expect(refused.status == 64, "\(refused.errors)")
        #expect(refused.errors.contains(message), "\(refused.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory + "/state/daemon.address"))
    }
}
