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
        /// Bytes kept: everything before the first damaged piece.
        public let bytesKept: Int64
        /// Bytes after the last recorded piece, which have no hash yet and cannot be checked.
        public var bytesUnchecked: Int64 { damagedPieces.isEmpty ? bytesBefore - Int64(piecesChecked) * pieceSize : 0 }
        public let totalBytes: Int64?
    }

    /// Checks every recorded piece of the partial download of `destination`. Damaged data is dropped
    /// from the first damaged piece on (the partial file is cut there and the manifest updated), so the
    /// next download fetches it again and keeps everything before it.
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
            kept = Int64(first) * pieceSize
            try await file.truncate(to: kept)
            manifest.truncate(to: kept)
            try await file.syncData()
            let updated = manifest
            try await BlockingIO.shared.run { try ManifestStore.store(updated, at: paths, durable: true) }
        }
        return PartialReport(
            destination: destination, pieceSize: pieceSize, piecesChecked: checkable, damagedPieces: damaged,
            bytesBefore: before, bytesKept: kept, totalBytes: manifest.totalLength
        )
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
