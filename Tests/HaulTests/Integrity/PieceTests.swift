import Crypto
import HaulTestServer
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

func pieceHash(_ bytes: [UInt8]) -> String {
    bytes.withUnsafeBytes { PieceHasher.hash($0) }
}

/// Flips one byte of a file in place, as a torn write or a bad disk would.
func damage(_ path: String, at offset: Int64) throws {
    let descriptor = open(path, O_RDWR)
    guard descriptor >= 0 else { throw TestFailure("cannot open \(path)") }
    defer { close(descriptor) }
    var byte: UInt8 = 0
    guard pread(descriptor, &byte, 1, off_t(offset)) == 1 else { throw TestFailure("cannot read \(path)") }
    byte ^= 0xFF
    guard pwrite(descriptor, &byte, 1, off_t(offset)) == 1 else { throw TestFailure("cannot write \(path)") }
}

@Suite(.timeLimit(.minutes(1)))
struct PieceTests {
    static let pieceSize: Int64 = 64 * 1024

    func configuration(retries: Int = 5) -> DownloaderConfiguration {
        var configuration = testConfiguration(retries: retries)
        configuration.storage.pieceSize = Self.pieceSize
        return configuration
    }

    /// Leaves a partial download of `resource` at `destination` and returns its manifest.
    func interrupt(_ server: HaulTestServer, _ resource: TestResource, at bytes: Int64, destination: String)
        async throws
        -> Manifest
    {
        try await interruptedSession(
            server, destination: destination, bytes: bytes, configuration: configuration(retries: 0))
        return try #require(try ManifestStore.load(DownloadPaths.open(destination)))
    }

    @Test func everyCompletePieceWrittenIsRecorded() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "pieces", size: 1_000_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let manifest = try await interrupt(server, resource, at: 500_000, destination: directory + "/f")
                let written = manifest.segments[0].written
                #expect(manifest.pieceSize == Self.pieceSize)
                #expect(manifest.pieces.count == Int(written / Self.pieceSize))
                for (index, hash) in manifest.pieces.enumerated() {
                    let start = Int64(index) * Self.pieceSize
                    #expect(hash == pieceHash(resource.bytes(start..<start + Self.pieceSize)))
                }
            }
        }
    }

    @Test func aDamagedLastPieceIsFoundOnResumeAndOnlyItIsFetchedAgain() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "damaged", size: 1_000_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let manifest = try await interrupt(server, resource, at: 500_000, destination: destination)
                let recorded = manifest.pieces.count
                try #require(recorded >= 3)
                // The last recorded piece changed on disk after it was written.
                let lastPieceStart = Int64(recorded - 1) * Self.pieceSize
                try damage(destination + ".haul.part", at: lastPieceStart + 1234)

                let result = try await withDownloader(configuration()) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(destination)))
                }
                #expect(try readFile(destination) == resource.content)
                #expect(result.resumedFrom == lastPieceStart)
                #expect(server.requests.last?.header("range") == "bytes=\(lastPieceStart)-")
            }
        }
    }

    @Test func severalDamagedPiecesAtTheEndAreAllFetchedAgain() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "damaged-run", size: 1_000_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let manifest = try await interrupt(server, resource, at: 600_000, destination: destination)
                let recorded = manifest.pieces.count
                try #require(recorded >= 4)
                for index in (recorded - 3)..<recorded {
                    try damage(destination + ".haul.part", at: Int64(index) * Self.pieceSize + 7)
                }
                try await withDownloader(configuration()) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(destination)))
                }
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests.last?.header("range") == "bytes=\(Int64(recorded - 3) * Self.pieceSize)-")
            }
        }
    }
}

@Suite(.timeLimit(.minutes(1)))
struct VerifierTests {
    @Test func verifyFindsDamagedPiecesAndTheNextDownloadFetchesOnlyThose() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "verify", size: 2_000_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let pieces = PieceTests()
                // The client may lose what it had buffered when the connection drops (hundreds of KiB on
                // a busy machine): interrupt late enough that at least six pieces are kept.
                let manifest = try await pieces.interrupt(server, resource, at: 1_600_000, destination: destination)
                try #require(manifest.pieces.count >= 6)
                let before = try #require(fileSize(destination + ".haul.part"))

                let clean = try await DownloadVerifier.verifyPartial(destination: destination)
                #expect(clean.damagedPieces.isEmpty)
                #expect(clean.piecesChecked == manifest.pieces.count)
                #expect(clean.bytesKept == before)

                // Damage two pieces in the middle: only an explicit check finds those.
                try damage(destination + ".haul.part", at: 2 * PieceTests.pieceSize + 5)
                try damage(destination + ".haul.part", at: 4 * PieceTests.pieceSize + 5)
                let report = try await DownloadVerifier.verifyPartial(destination: destination)
                #expect(report.damagedPieces == [2, 4])
                #expect(report.bytesKept == before - 2 * PieceTests.pieceSize)
                #expect(fileSize(destination + ".haul.part") == before)

                // The next download fetches the two damaged pieces and the part never written, nothing else.
                let requestsBefore = server.requests.count
                try await withDownloader(pieces.configuration()) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(destination)))
                }
                #expect(try readFile(destination) == resource.content)
                let piece = PieceTests.pieceSize
                let ranges = server.requests.dropFirst(requestsBefore).compactMap { $0.header("range") }
                #expect(
                    ranges == [
                        "bytes=\(2 * piece)-\(3 * piece - 1)", "bytes=\(4 * piece)-\(5 * piece - 1)",
                        "bytes=\(before)-\(resource.size - 1)",
                    ])
                #expect(
                    server.requests.dropFirst(requestsBefore).allSatisfy {
                        $0.header("if-range") == resource.entityTagValue
                    })
            }
        }
    }

    @Test func aCompleteFileIsCheckedAgainstAChecksum() async throws {
        try await withTemporaryDirectory { directory in
            let bytes = TestResource(name: "complete", size: 300_000).content
            try writeFile(directory + "/f", bytes)
            let actual = try await DownloadVerifier.checksum(ofFile: directory + "/f", algorithm: .sha256)
            #expect(actual == sha256(bytes))
        }
    }

    @Test func checkingADownloadThatIsNotThereLeavesNothingBehind() async throws {
        try await withTemporaryDirectory { directory in
            let error = await expectHaulError(.fileSystem) {
                _ = try await DownloadVerifier.verifyPartial(destination: directory + "/none")
            }
            #expect(error?.message.contains("no partial download") == true)
            // Taking the lock created an empty partial file; it is gone again.
            #expect(listDirectory(directory).isEmpty)
        }
    }
}
