/// Checks downloads on disk without the network: a partial download against the piece hashes in its
/// manifest, or a complete file against a checksum.
public enum DownloadVerifier {
    /// The result of checking a partial download.
    public struct PartialReport: Sendable, Equatable {
        public let destination: String
        public let pieceSize: Int64
        /// Pieces whose hash was recorded and checked.
        public let piecesChecked: Int
        /// Indexes of the pieces whose bytes no longer match their hash.
        public let damagedPieces: [Int]
        /// Bytes in the partial file before the check.
        public let bytesBefore: Int64
        /// Bytes kept: everything but the damaged pieces when the server's validator allows fetching
        /// single ranges (a strong `ETag` or `Last-Modified`), else everything before the first damaged piece.
        public let bytesKept: Int64
        /// Bytes after the last recorded piece, which have no hash yet and cannot be checked.
        public var bytesUnchecked: Int64 { damagedPieces.isEmpty ? bytesBefore - Int64(piecesChecked) * pieceSize : 0 }
        public let totalBytes: Int64?
    }

    /// Checks every recorded piece of the partial download of `destination`. When damage is found the
    /// manifest is rewritten so the next download fetches only the damaged pieces (and what was never
    /// written), each as its own range checked with `If-Range`; when the server gave no validator that
    /// allows that, the partial file is cut at the first damaged piece instead.
    public static func verifyPartial(destination: String) async throws -> PartialReport {
        let paths = DownloadPaths(destination: destination)
        let lock = try DestinationLock.acquire(paths)
        defer { lock.removeFile() }
        guard var manifest = try ManifestStore.load(paths) else {
            throw HaulError(.fileSystem, "\(destination) has no partial download to check")
        }
        let file = try PartialFile(path: paths.partial)
        let before = try file.size()
        let pieceSize = manifest.pieceSize
        let checkable = min(manifest.pieces.count, Int(before / pieceSize))
        var damaged: [Int] = []
        for index in 0..<checkable where try await file.pieceHash(index, pieceSize: pieceSize) != manifest.pieces[index]
        {
            damaged.append(index)
        }
        var kept = before
        if let first = damaged.first {
            let ranges = manifest.totalLength.map {
                Self.segments(
                    around: damaged, pieceSize: pieceSize, written: min(manifest.segments[0].written, before), total: $0
                )
            }
            // One range would read as "the file's size is kept": only several can leave holes to fetch.
            if let ranges, ranges.count > 1, manifest.validator.ifRangeValue != nil, manifest.segments.count == 1 {
                manifest.segments = ranges
                manifest.pieces = Array(manifest.pieces.prefix(first))
                kept = manifest.segments.reduce(0) { $0 + $1.written }
            } else {
                kept = Int64(first) * pieceSize
                try await file.truncate(to: kept)
                manifest.truncate(to: kept)
            }
            try await file.syncData()
            let updated = manifest
            try await BlockingIO.shared.run { try ManifestStore.store(updated, at: paths, durable: true) }
        }
        return PartialReport(
            destination: destination, pieceSize: pieceSize, piecesChecked: checkable, damagedPieces: damaged,
            bytesBefore: before, bytesKept: kept, totalBytes: manifest.totalLength
        )
    }

    /// The ranges of a file whose first `written` bytes are on disk except the `damaged` pieces: the
    /// good stretches count as written (and durable: they are flushed before the manifest says so),
    /// the damaged pieces and the part never written are left to fetch.
    static func segments(around damaged: [Int], pieceSize: Int64, written: Int64, total: Int64) -> [Manifest.Segment] {
        var segments: [Manifest.Segment] = []
        var cursor: Int64 = 0
        for index in damaged.sorted() {
            let start = Int64(index) * pieceSize
            let end = min(start + pieceSize, total)
            if start > cursor {
                segments.append(
                    Manifest.Segment(start: cursor, end: start, written: start - cursor, durable: start - cursor))
            }
            segments.append(Manifest.Segment(start: start, end: end, written: 0, durable: 0))
            cursor = end
        }
        if cursor < total {
            let rest = max(0, written - cursor)
            segments.append(Manifest.Segment(start: cursor, end: total, written: rest, durable: rest))
        }
        return segments
    }

    /// Hashes the complete file at `path` with the checksum's algorithm and returns the actual digest.
    public static func checksum(ofFile path: String, algorithm: DigestAlgorithm) async throws -> Checksum {
        let file = try PartialFile(path: path, readOnly: true)
        let hasher = try await file.hash(upTo: try file.size(), algorithms: [algorithm])
        guard let digest = hasher.finalize().first else {
            throw HaulError(.fileSystem, "cannot hash \(path)")
        }
        return digest
    }
}
