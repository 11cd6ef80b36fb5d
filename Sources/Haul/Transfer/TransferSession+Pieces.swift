/// Piece hashes: recorded as the file is written, re-checked when a download resumes.
extension TransferSession {
    /// Re-checks the last piece hash the manifest recorded before resuming from `trusted` bytes.
    ///
    /// Catches data that changed on disk since it was written (a torn or reverted write after a crash,
    /// a damaged disk, another program). On a mismatch, earlier pieces are checked until a good one is
    /// found, and the download continues from there: the damaged bytes are fetched again, the good ones
    /// are kept. Returns the number of bytes that can be trusted.
    mutating func verifyRecordedPieces(trusted: Int64, file: PartialFile) async throws -> Int64 {
        guard let manifest else { return trusted }
        let pieceSize = manifest.pieceSize
        var recorded = min(manifest.pieces.count, Int(trusted / pieceSize))
        var damaged = false
        while recorded > 0 {
            let index = recorded - 1
            if try await file.pieceHash(index, pieceSize: pieceSize) == manifest.pieces[index] { break }
            damaged = true
            recorded -= 1
        }
        self.manifest?.pieces = Array(manifest.pieces.prefix(recorded))
        guard damaged else { return trusted }
        let kept = Int64(recorded) * pieceSize
        try await cutPartial(to: kept, file: file, durable: true)
        return kept
    }

    /// A piece hasher positioned at `offset`, after hashing from disk the bytes written since the
    /// last recorded piece (a killed process records its last pieces only at its next checkpoint).
    mutating func pieceHasher(at offset: Int64, file: PartialFile) async throws -> PieceHasher {
        guard var manifest else {
            return PieceHasher(pieceSize: configuration.storage.pieceSize, startingAtPiece: 0)
        }
        let (hasher, completed) = try await file.pieceHasher(
            pieceSize: manifest.pieceSize, firstPiece: manifest.pieces.count, upTo: offset
        )
        manifest.pieces += completed
        self.manifest = manifest
        return hasher
    }

    /// Cuts the partial file back to the bytes that can be trusted. After a reboot the file may hold
    /// bytes that were never flushed (zeros or stale data); they must go before this boot starts
    /// trusting the file's size again.
    mutating func discardUntrustedTail(beyond trusted: Int64, file: PartialFile) async throws {
        guard try file.size() > trusted else { return }
        try await cutPartial(to: trusted, file: file, durable: false)
    }

    /// Cuts the partial file and its manifest back to `offset`, so neither claims a byte past it.
    mutating func cutPartial(to offset: Int64, file: PartialFile, durable: Bool) async throws {
        try await file.truncate(to: offset)
        manifest?.truncate(to: offset)
        prefixHash = prefixHash.flatMap { $0.offset <= offset ? $0 : nil }
        try await storeManifest(durable: durable)
    }
}
