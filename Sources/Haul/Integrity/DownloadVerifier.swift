/// Checks downloads on disk without the network: a partial download against the piece hashes in its
/// manifest, or a complete file against a checksum.
public enum DownloadVerifier {
    /// The result of checking a partial download.
    public struct PartialReport: Sendable, Equatable {
        /// The file the download will have when complete.
        public let destination: String
        /// The size of the pieces whose hashes the manifest keeps.
        public let pieceSize: Int64
        /// Pieces whose hash was recorded and checked.
        public let piecesChecked: Int
        /// Indexes of the pieces whose bytes no longer match their hash.
        public let damagedPieces: [Int]
        /// Bytes of the partial download that were trusted before the check.
        public let bytesBefore: Int64
        /// Bytes kept: everything but the damaged pieces when the server's validator allows fetching
        /// single ranges (a strong `ETag` or `Last-Modified`), else everything before the first damaged piece.
        public let bytesKept: Int64
        /// Trusted bytes outside the recorded pieces, which have no hash yet and cannot be checked.
        public var bytesUnchecked: Int64 { damagedPieces.isEmpty ? bytesBefore - Int64(piecesChecked) * pieceSize : 0 }
        /// The file's length, when known.
        public let totalBytes: Int64?
    }

    /// Checks every recorded piece of the partial download of `destination`. When damage is found the
    /// manifest is rewritten so the next download fetches only the damaged pieces (and what was never
    /// written), each as its own range checked with `If-Range`; when the server gave no validator that
    /// allows that, the partial file is cut at the first damaged piece instead.
    public static func verifyPartial(destination: String) async throws -> PartialReport {
        let paths = try DownloadPaths.open(destination)
        let lock = try DestinationLock.acquire(paths)
        defer {
            if lock.created { lock.removePartial() }
            lock.unlock()
        }
        guard !lock.created, var manifest = try ManifestStore.load(paths) else {
            throw HaulError(.fileSystem, "\(destination) has no partial download to check")
        }
        let file = try lock.partialFile(io: .shared)
        let pieceSize = manifest.pieceSize
        let trusted = manifest.trustedRanges(currentBootID: BootIdentity.current, partialSize: try file.size())
        let before = trusted.reduce(0) { $0 + $1.upperBound - $1.lowerBound }
        let checkable = manifest.recordedPieces(within: trusted)
        var damaged: [Int] = []
        for index in checkable where try await file.pieceHash(index, pieceSize: pieceSize) != manifest.pieces[index] {
            damaged.append(index)
        }
        var kept = before
        if let first = damaged.first {
            if let total = manifest.totalLength, manifest.validator.ifRangeValue != nil {
                let good = damaged.reduce(trusted) { ranges, index in
                    let start = Int64(index) * pieceSize
                    return Self.subtract(start..<start + pieceSize, from: ranges)
                }
                manifest.segments = Self.segments(keeping: good, total: total)
                for index in damaged { manifest.pieces[index] = nil }
                kept = manifest.segments.reduce(0) { $0 + $1.written }
            } else {
                // Only a download written in order over one connection has no such validator.
                manifest.segments = [Manifest.Segment(start: 0, end: manifest.totalLength)]
                kept = Int64(first) * pieceSize
            }
            // One range reads as "the file's size is kept": the file must end where that range's data does.
            if manifest.segments.count == 1 {
                kept = min(kept, before)
                manifest.segments[0].written = kept
                manifest.segments[0].durable = kept
                try await file.truncate(to: kept)
                manifest.truncate(to: kept)
            }
            try await file.syncData()
            let updated = manifest
            try await BlockingIO.shared.run { try ManifestStore.store(updated, at: paths, durable: true) }
        }
        return PartialReport(
            destination: destination, pieceSize: pieceSize, piecesChecked: checkable.count, damagedPieces: damaged,
            bytesBefore: before, bytesKept: kept, totalBytes: manifest.totalLength
        )
    }

    /// `ranges` (sorted, not overlapping) without the bytes of `removed`.
    static func subtract(_ removed: Range<Int64>, from ranges: [Range<Int64>]) -> [Range<Int64>] {
        ranges.flatMap { range -> [Range<Int64>] in
            guard range.overlaps(removed) else { return [range] }
            return [range.lowerBound..<removed.lowerBound, removed.upperBound..<range.upperBound].filter {
                $0.lowerBound < $0.upperBound
            }
        }
    }

    /// The segments of a file of `total` bytes of which the bytes in `good` (sorted ranges) are on disk
    /// and intact: a segment starts at 0 and at every good range, and counts that range as written (and
    /// durable: the data is flushed before the manifest says so); what follows up to the next good range
    /// is left for its connection to fetch.
    static func segments(keeping good: [Range<Int64>], total: Int64) -> [Manifest.Segment] {
        let good = Manifest.joined(good).filter { $0.lowerBound < total }
        var starts = good.map(\.lowerBound)
        if starts.first != 0 { starts.insert(0, at: 0) }
        return starts.enumerated().map { position, start in
            let end = position + 1 < starts.count ? starts[position + 1] : total
            let written = good.first { $0.lowerBound == start }.map { min($0.upperBound, end) - start } ?? 0
            return Manifest.Segment(start: start, end: end, written: written, durable: written)
        }
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
