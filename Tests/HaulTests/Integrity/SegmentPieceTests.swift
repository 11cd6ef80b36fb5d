import HaulTestServer
import Testing

@testable import Haul

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Piece hashes of downloads fetched over several connections: recorded out of order, re-checked on
/// resume, checked by `verifyPartial`.
@Suite(.timeLimit(.minutes(1)))
struct SegmentPieceTests {
    static let pieceSize: Int64 = 256 * 1024

    func configuration() -> DownloaderConfiguration {
        var configuration = segmentedConfiguration()
        configuration.storage.pieceSize = Self.pieceSize
        return configuration
    }

    /// Leaves a partial 6 MiB download in four or more ranges, an unfinished later one holding at least
    /// `pieces` whole pieces.
    func interrupt(_ server: HaulTestServer, _ resource: TestResource, destination: String, pieces: Int64)
        async throws -> Manifest
    {
        server.add("/f", resource)
        return try await pauseWhenRanges(server, "/f", destination: destination, configuration: configuration()) {
            segments in
            // Under load a range may finish early and be split again: wait for four ranges and one
            // unfinished later range holding the pieces asked for.
            return segments.count >= 4
                && segments.contains {
                    $0.start > 0 && $0.start + $0.written < $0.end! && $0.written >= (pieces + 1) * Self.pieceSize
                }
        }
    }

    /// An unfinished range that does not start at 0, with the first and last whole pieces it wrote.
    func laterRange(_ manifest: Manifest) throws -> (segment: Manifest.Segment, first: Int, last: Int) {
        let segment = try #require(
            manifest.segments.filter { $0.start > 0 && $0.start + $0.written < $0.end! }.max { $0.written < $1.written }
        )
        let first = Int((segment.start + Self.pieceSize - 1) / Self.pieceSize)
        let last = Int((segment.start + segment.written) / Self.pieceSize) - 1
        try #require(last > first)
        return (segment, first, last)
    }

    @Test("every piece written whole over several connections has its hash in the manifest")
    func piecesAreRecordedOutOfOrder() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "segment-pieces", size: 6 * 1024 * 1024)
                let manifest = try await interrupt(server, resource, destination: directory + "/f", pieces: 2)
                let trusted = manifest.trustedRanges(currentBootID: BootIdentity.current, partialSize: 6 << 20)
                var expected: [Int] = []
                for range in Manifest.joined(trusted) {
                    // A range may be too short to hold a whole piece.
                    let first = Int((range.lowerBound + Self.pieceSize - 1) / Self.pieceSize)
                    expected += Array(first..<max(first, Int(range.upperBound / Self.pieceSize)))
                }
                #expect(manifest.recordedPieces(within: trusted) == expected)
                for index in expected {
                    let start = Int64(index) * Self.pieceSize
                    #expect(manifest.pieces[index] == pieceHash(resource.bytes(start..<start + Self.pieceSize)))
                }
                // Pieces of a later range are there while pieces before it are not: recorded out of order.
                let later = try laterRange(manifest)
                #expect(manifest.pieces[later.first] != nil)
                // (The list of pieces ends at the last one recorded, so the next one may lie past its end.)
                #expect(
                    manifest.pieces.indices.contains(later.last + 1) ? manifest.pieces[later.last + 1] == nil : true)
            }
        }
    }

    @Test("a damaged last piece of one range is found on resume; that range continues from the piece")
    func damagedPieceOfOneRangeIsFetchedAgain() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "segment-damage", size: 6 * 1024 * 1024)
                let destination = directory + "/f"
                let manifest = try await interrupt(server, resource, destination: destination, pieces: 2)
                let later = try laterRange(manifest)
                let lastStart = Int64(later.last) * Self.pieceSize
                try damage(destination + ".haul.part", at: lastStart + 100)

                let requestsBefore = server.requests(for: "/f").count
                try await download(server, to: destination, configuration: configuration())
                #expect(try readFile(destination) == resource.content)
                let ranges = server.requests(for: "/f").dropFirst(requestsBefore).compactMap { $0.header("Range") }
                #expect(ranges.contains { $0.hasPrefix("bytes=\(lastStart)-") }, "\(ranges)")
                // The other ranges continue where they stopped.
                for segment in manifest.segments
                where segment.start + segment.written < segment.end! && segment.start != later.segment.start {
                    #expect(ranges.contains { $0.hasPrefix("bytes=\(segment.start + segment.written)-") }, "\(ranges)")
                }
            }
        }
    }

    @Test("verify finds a damaged piece inside a range; the next download fetches that piece alone")
    func verifyChecksEveryRange() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "segment-verify", size: 6 * 1024 * 1024)
                let destination = directory + "/f"
                let manifest = try await interrupt(server, resource, destination: destination, pieces: 3)
                let trusted = manifest.trustedRanges(currentBootID: BootIdentity.current, partialSize: 6 << 20)
                let before = trusted.reduce(Int64(0)) { $0 + $1.upperBound - $1.lowerBound }
                let clean = try await DownloadVerifier.verifyPartial(destination: destination)
                #expect(clean.damagedPieces.isEmpty)
                #expect(clean.piecesChecked == manifest.recordedPieces(within: trusted).count)
                #expect(clean.bytesKept == before)

                let damaged = try laterRange(manifest).first
                try damage(destination + ".haul.part", at: Int64(damaged) * Self.pieceSize + 9)
                let report = try await DownloadVerifier.verifyPartial(destination: destination)
                #expect(report.damagedPieces == [damaged])
                #expect(report.bytesKept == before - Self.pieceSize)

                let requestsBefore = server.requests(for: "/f").count
                try await download(server, to: destination, configuration: configuration())
                #expect(try readFile(destination) == resource.content)
                // The damaged piece is fetched again; nothing kept is (a request may also cover the
                // unwritten tail of the range before it, and connections split what remains).
                let start = Int64(damaged) * Self.pieceSize
                let good = DownloadVerifier.subtract(start..<start + Self.pieceSize, from: Manifest.joined(trusted))
                let ranges = server.requests(for: "/f").dropFirst(requestsBefore).flatMap { request in
                    request.header("Range").flatMap(ByteRangeSet.init)?.resolve(length: resource.size) ?? []
                }
                #expect(ranges.contains { $0.contains(start) && $0.contains(start + Self.pieceSize - 1) }, "\(ranges)")
                for range in ranges {
                    #expect(!good.contains { $0.contains(range.lowerBound) }, "\(range) starts in kept bytes \(good)")
                }
            }
        }
    }

    @Test("a manifest of format 1 is read without its SHA-256 piece hashes")
    func formatOnePiecesAreForgotten() throws {
        var manifest = Manifest(
            originalURL: "http://127.0.0.1/f", finalURL: "http://127.0.0.1/f", validator: ResourceValidator(),
            totalLength: 10 << 20, acceptsRanges: true, contentEncoding: nil, bootID: nil, now: 0)
        manifest.segments[0].written = 8 << 20
        manifest.pieces = ["AAAAAAAAAAAAAAAAAAAAAA==", "AAAAAAAAAAAAAAAAAAAAAA=="]
        manifest.format = 1
        let bytes = try Array(JSONEncoder().encode(manifest))
        let decoded = try Manifest.decode(bytes)
        #expect(decoded.format == Manifest.currentFormat)
        #expect(decoded.pieces.isEmpty)
        #expect(decoded.segments[0].written == 8 << 20)
        // Its written bytes are kept without the hashes it no longer has; a manifest of format 2
        // claiming the same without them is not believed.
        #expect(decoded.hashedEnd(of: decoded.segments[0]) == 8 << 20)
        var current = decoded
        current.piecesCoverWrites = true
        #expect(current.hashedEnd(of: current.segments[0]) == 0)
    }
}
