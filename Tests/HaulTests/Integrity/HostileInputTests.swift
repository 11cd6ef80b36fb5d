import HaulTestServer
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A hostile server or a hostile file system never crashes Haul or makes it write where it should not.
@Suite(.timeLimit(.minutes(1)))
struct HostileInputTests {
    func download(_ server: HaulTestServer, _ path: String, to destination: String, overwrite: Bool = false)
        async throws
    {
        try await withDownloader(testConfiguration(retries: 1)) { downloader in
            try await downloader.download(
                DownloadRequest(url: server.url(path), destination: .file(destination), overwrite: overwrite)
            )
        }
    }

    @Test(arguments: [".haul.part", ".haul.json"])
    func aSymlinkPlantedBesideTheDestinationIsNeverFollowed(suffix: String) async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "planted", size: 100_000))
            try await withTemporaryDirectory { directory in
                let victim = directory + "/victim"
                try writeFile(victim, Array("do not touch".utf8))
                let destination = directory + "/f"
                #expect(symlink(victim, destination + suffix) == 0)
                await expectHaulError(.fileSystem) { try await download(server, "/f", to: destination) }
                #expect(try readFile(victim) == Array("do not touch".utf8))
                #expect(!fileExists(destination))
            }
        }
    }

    @Test func aSymlinkAtTheFinalNameIsReplacedNotFollowed() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "final-link", size: 100_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let victim = directory + "/victim"
                try writeFile(victim, Array("do not touch".utf8))
                let destination = directory + "/f"
                #expect(symlink(victim, destination) == 0)
                await expectHaulError(.destinationExists) { try await download(server, "/f", to: destination) }
                try await download(server, "/f", to: destination, overwrite: true)
                var info = stat()
                #expect(lstat(destination, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG)
                #expect(try readFile(destination) == resource.content)
                #expect(try readFile(victim) == Array("do not touch".utf8))
            }
        }
    }

    @Test func aLengthBeyondTheFreeSpaceFailsBeforeWritingAnything() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                var info = statvfs()
                #expect(statvfs(directory, &info) == 0)
                let free = Int64(info.f_bavail) * Int64(info.f_frsize)
                server.add("/huge", TestResource(name: "huge", size: free + (1 << 30)))
                let error = await expectHaulError(.insufficientSpace) {
                    try await download(server, "/huge", to: directory + "/f")
                }
                #expect(error?.message.contains("free") == true)
                #expect(listDirectory(directory).isEmpty)
            }
        }
    }

    @Test(arguments: ["-5", "ten", "99999999999999999999999", "1, 2"])
    func aBogusContentLengthIsAClearErrorNotACrash(value: String) async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "bogus-length", size: 1000))
            server.setStandingFaults("/f", [.setHeader("Content-Length", value)])
            try await withTemporaryDirectory { directory in
                do {
                    try await download(server, "/f", to: directory + "/f")
                    Issue.record("a Content-Length of \(value) was accepted")
                } catch let error as HaulError {
                    #expect([.network, .protocolViolation].contains(error.code), "\(error.message)")
                }
                #expect(!fileExists(directory + "/f"))
            }
        }
    }

    /// A length no disk holds is a lie: said so at once, not taken for a range problem later.
    @Test(arguments: ["200", "206"])
    func anImpossibleLengthIsRefusedAtOnce(status: String) async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "huge-length", size: 100_000))
            let huge = "1000000000000000000"
            server.setStandingFaults(
                "/f",
                status == "200"
                    ? [.setHeader("Content-Length", huge)] : [.setHeader("Content-Range", "bytes 0-99999/\(huge)")])
            try await withTemporaryDirectory { directory in
                let configuration = status == "200" ? testConfiguration() : segmentedConfiguration()
                let error = await expectHaulError(.protocolViolation) {
                    try await HaulTests.download(server, "/f", to: directory + "/f", configuration: configuration)
                }
                #expect(error?.message.contains("announced a file of \(huge) bytes") == true, "\(error?.message ?? "")")
                #expect(server.requests(for: "/f").count == 1)
                #expect(listDirectory(directory).isEmpty)
            }
        }
    }

    @Test func aManifestWithAnImpossibleLengthIsNotTrusted() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "normal", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let paths = try DownloadPaths.open(directory + "/f")
                try plantPartialDownload(
                    at: paths, resource: resource, bytes: resource.bytes(0..<100_000), written: 100_000,
                    url: server.url("/f"))
                let text = String(decoding: try readFile(paths.manifest), as: UTF8.self)
                try writeFile(
                    paths.manifest,
                    Array(
                        text.replacingOccurrences(
                            of: "\"totalLength\":300000", with: "\"totalLength\":1000000000000000000"
                        ).utf8))
                let log = EventLog()
                try await HaulTests.download(server, to: paths.destination, log: log)
                #expect(try readFile(paths.destination) == resource.content)
                #expect(log.restartKinds == ["untrustedPartial"])
            }
        }
    }

    @Test func aHeaderFloodIsAClearErrorNotACrash() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "flood", size: 1000))
            server.setStandingFaults("/f", [.headerFlood(10_000)])
            try await withTemporaryDirectory { directory in
                do {
                    try await download(server, "/f", to: directory + "/f")
                    Issue.record("10,000 headers were accepted")
                } catch let error as HaulError {
                    #expect(error.code == .network, "\(error.message)")
                }
                #expect(listDirectory(directory).isEmpty)
            }
        }
    }

    @Test(arguments: [Int64(0), 1, 40, 200])
    func aTruncatedManifestStartsOver(keptBytes: Int64) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "truncated-manifest", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let paths = try DownloadPaths.open(directory + "/f")
                try plantPartialDownload(
                    at: paths, resource: resource, bytes: resource.bytes(0..<100_000), written: 100_000,
                    url: server.url("/f")
                )
                let full = try readFile(paths.manifest)
                try writeFile(paths.manifest, Array(full.prefix(Int(keptBytes))))
                let log = EventLog()
                try await HaulTests.download(server, to: paths.destination, log: log)
                #expect(try readFile(paths.destination) == resource.content)
                #expect(log.restartKinds == ["untrustedPartial"])
                #expect(server.requests.first?.header("range") == nil)
            }
        }
    }

    @Test func aManifestFromAnotherURLAndSizeNeverSplices() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "this-one", size: 300_000)
            server.add("/this", resource)
            try await withTemporaryDirectory { directory in
                let paths = try DownloadPaths.open(directory + "/f")
                let other = TestResource(name: "other", size: 900_000)
                try plantPartialDownload(
                    at: paths, resource: other, bytes: other.bytes(0..<200_000), written: 200_000,
                    url: server.url("/other")
                )
                let log = EventLog()
                try await HaulTests.download(server, "/this", to: paths.destination, log: log)
                #expect(try readFile(paths.destination) == resource.content)
                #expect(server.requests.first?.header("if-range") == other.entityTagValue)
                #expect(log.restartKinds.count == 1)
            }
        }
    }

    /// A manifest that says more was written than its piece hashes cover (edited, or damaged) is not
    /// believed past the first whole piece without a hash: those bytes are fetched again, in one
    /// range or in several.
    @Test(arguments: [1, 2])
    func writtenBytesNoPieceHashCoversAreFetchedAgain(segments: Int) async throws {
        try await HaulTestServer.withRunning { server in
            let piece: Int64 = 1 << 20
            let resource = TestResource(name: "claims", size: 3 * piece + 100)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let paths = try DownloadPaths.open(directory + "/f")
                // The first piece as the server has it, then bytes of nothing the server ever sent.
                let good = resource.bytes(0..<piece)
                try writeFile(paths.partial, good + [UInt8](repeating: 0x5A, count: Int(resource.size - piece)))
                var manifest = Manifest(
                    originalURL: server.url("/f"), finalURL: server.url("/f"),
                    validator: ResourceValidator(etag: resource.entityTagValue, lastModified: nil, date: nil),
                    totalLength: resource.size, acceptsRanges: true, contentEncoding: nil,
                    bootID: BootIdentity.current, now: 0, pieceSize: piece)
                manifest.pieces = [good.withUnsafeBytes { PieceHasher.hash($0) }]
                if segments == 1 {
                    manifest.segments = [.init(start: 0, end: resource.size, written: resource.size)]
                } else {
                    manifest.segments = [
                        .init(start: 0, end: 2 * piece, written: 2 * piece),
                        .init(start: 2 * piece, end: resource.size, written: piece + 100),
                    ]
                }
                try ManifestStore.store(manifest, at: paths, durable: true)
                let result = try await HaulTests.download(
                    server, to: paths.destination, configuration: segmentedConfiguration(connections: segments))
                #expect(try readFile(paths.destination) == resource.content)
                #expect(result.resumedFrom == piece)
                let ranges = Set(server.requests.compactMap { $0.header("range") })
                let expected: Set<String> =
                    segments == 1
                    ? ["bytes=\(piece)-"]
                    : ["bytes=\(piece)-\(2 * piece - 1)", "bytes=\(2 * piece)-\(resource.size - 1)"]
                #expect(expected.isSubset(of: ranges), "\(ranges)")
                // Nothing the verified piece holds is asked for again. A connection that finishes
                // first may take over the end of the other's range (on a loaded machine it does).
                let starts = ranges.compactMap { Int64($0.dropFirst("bytes=".count).prefix { $0 != "-" }) }
                #expect(starts.count == ranges.count && starts.allSatisfy { $0 >= piece }, "\(ranges)")
                if segments == 1 { #expect(ranges == expected) }
            }
        }
    }
}
