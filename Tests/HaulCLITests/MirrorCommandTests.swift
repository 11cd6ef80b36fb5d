import Foundation
import Haul
import HaulTestServer
import Testing

/// `haul get --mirror` and `mirror=` lines: one file from several servers.
@Suite(.timeLimit(.minutes(2)), .serialized)
struct MirrorCommandTests {
    /// Two servers with the same file, each with an ETag of its own.
    static func serve(_ first: HaulTestServer, _ second: HaulTestServer, size: Int64 = 4 << 20) -> TestResource {
        let resource = TestResource(name: "mirrored", size: size, fixedEntityTag: "\"first\"")
        first.add("/file", resource)
        second.add("/file", TestResource(name: "mirrored", size: size, fixedEntityTag: "\"second\""))
        for server in [first, second] { server.setStandingFaults("/file", [.throttle(bytesPerSecond: 4 << 20)]) }
        return resource
    }

    @Test func withAChecksumTheRangesComeFromEveryMirror() async throws {
        try await HaulTestServer.withRunning { first in
            try await HaulTestServer.withRunning { second in
                let resource = Self.serve(first, second)
                let directory = try makeTemporaryDirectory()
                defer { try? FileManager.default.removeItem(atPath: directory) }
                let result = try await HaulProcess.run(
                    [
                        "get", first.url("/file"), "--mirror", second.url("/file"), "-o", directory + "/file",
                        "--checksum", "sha-256=" + sha256Hex(resource.content), "--no-daemon",
                    ], stateDirectory: directory + "/state")
                #expect(result.status == 0, "\(result.errors)")
                #expect(contents(directory + "/file") == resource.content)
                #expect(result.errors.contains("haul: ranges come from every mirror"), "\(result.errors)")
                #expect(first.bodyBytesSent > 0 && second.bodyBytesSent > 0)
                // The second server was asked only with its own validator, never with the first's.
                let ifRanges = second.requests(for: "/file").compactMap { $0.header("if-range") }
                #expect(ifRanges.allSatisfy { $0 == "\"second\"" }, "\(ifRanges)")
            }
        }
    }

    @Test func withoutProofTheInputFilesMirrorsAreTriedInTurnAndSaidSo() async throws {
        try await HaulTestServer.withRunning { first in
            try await HaulTestServer.withRunning { second in
                let resource = Self.serve(first, second)
                let directory = try makeTemporaryDirectory()
                defer { try? FileManager.default.removeItem(atPath: directory) }
                let list = directory + "/list.txt"
                try "\(first.url("/file"))\n  out=file\n  mirror=\(second.url("/file"))\n"
                    .write(toFile: list, atomically: true, encoding: .utf8)
                let result = try await HaulProcess.run(
                    ["get", "-i", list, "-d", directory, "--no-daemon"], stateDirectory: directory + "/state")
                #expect(result.status == 0, "\(result.errors)")
                #expect(contents(directory + "/file") == resource.content)
                let lines = result.errors.split(separator: "\n").filter {
                    $0.contains("mirrors are used one after another")
                }
                #expect(lines.count == 1, "\(result.errors)")
                #expect(second.requests.isEmpty)
            }
        }
    }

    @Test func badMirrorsAreOneLineErrors() async throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let two = try await HaulProcess.run(
            ["get", "http://127.0.0.1:1/a", "http://127.0.0.1:1/b", "--mirror", "http://127.0.0.1:2/a", "--no-daemon"],
            stateDirectory: directory)
        #expect(two.status == 64)
        #expect(two.errors.contains("--mirror names another URL of one file"), "\(two.errors)")
        let list = directory + "/list.txt"
        try "http://127.0.0.1:1/a\n  mirror=ftp://127.0.0.1/a\n".write(toFile: list, atomically: true, encoding: .utf8)
        let ftp = try await HaulProcess.run(["get", "-i", list, "--no-daemon"], stateDirectory: directory)
        #expect(ftp.status != 0)
        #expect(ftp.errors.contains("list.txt:2: mirror=: unsupported scheme ftp"), "\(ftp.errors)")
        #expect(ftp.errors.split(separator: "\n").count == 1, "\(ftp.errors)")
    }
}
