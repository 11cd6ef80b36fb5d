/// Piece hashes: recorded as the file is written, re-checked when a download resumes.
extension TransferSession {
    /// Re-checks the last piece hash the manifest recorded before resuming from `trusted` bytes.
    ///
    /// Catches data that changed on disk since it was written (a torn or reverted write after a crash,
    /// a damaged disk, another program). On a mismatch, earlier pieces are checked until a good one is
    /// found, and the download continues from there: the damaged bytes are fetched again, the good ones
    /// are kept. Returns the number of bytes that can be trusted.
    mutating func verifyRecordedPieces(trusted: Int64, file: PartialFile) async throws -> Int64 {
        guard var manifest, trusted > 0 else { return trusted }
        let kept = try await Self.keptEnd(
            of: 0..<trusted, pieces: &manifest.pieces, pieceSize: manifest.pieceSize, file: file)
        manifest.pieces = Array(manifest.pieces.prefix(while: { $0 != nil }))
        self.manifest = manifest
        guard kept < trusted else { return trusted }
        try await cutPartial(to: kept, file: file, durable: true)
        return kept
    }

    /// Re-checks the last recorded piece of every range a download over several connections kept, as
    /// ``verifyRecordedPieces(trusted:file:)`` does for one range; a range whose last pieces are damaged
    /// is cut back to its last good piece, and its connection fetches the rest again.
    mutating func verifyRecordedPieces(_ segments: inout [SegmentTable.Segment], file: PartialFile) async throws {
        guard var manifest else { return }
        let covered = Manifest.joined(segments.map { $0.start..<$0.start + $0.written })
        for range in covered {
            let kept = try await Self.keptEnd(
                of: range, pieces: &manifest.pieces, pieceSize: manifest.pieceSize, file: file)
            guard kept < range.upperBound else { continue }
            for index in segments.indices where segments[index].start < range.upperBound {
                let written = min(segments[index].written, max(0, kept - segments[index].start))
                segments[index].written = written
                segments[index].durable = min(segments[index].durable, written)
            }
        }
        self.manifest = manifest
    }

    /// Checks the recorded pieces wholly inside `range` from the last one back, until one is intact;
    /// returns the offset up to which the range's bytes can be kept: its end when the last recorded
    /// piece is intact (or none is recorded), else the end of the last intact piece before the damage
    /// (the start of the range when there is none). Damaged pieces lose their hashes.
    static func keptEnd(
        of range: Range<Int64>, pieces: inout [String?], pieceSize: Int64, file: PartialFile
    ) async throws -> Int64 {
        let first = Int((range.lowerBound + pieceSize - 1) / pieceSize)
        var index = min(Int(range.upperBound / pieceSize), pieces.count) - 1
        var damaged = false
        while index >= first {
            if let recorded = pieces[index] {
                if try await file.pieceHash(index, pieceSize: pieceSize) == recorded {
                    return damaged ? Int64(index + 1) * pieceSize : range.upperBound
                }
                damaged = true
                pieces[index] = nil
            }
            index -= 1
        }
        return damaged ? range.lowerBound : range.upperBound
    }

    /// A piece hasher positioned at `offset`, after hashing from disk the bytes written since the
    /// last recorded piece (a killed process records its last pieces only at its next checkpoint).
    mutating func pieceHasher(at offset: Int64, file: PartialFile) async throws -> PieceHasher {
        guard var manifest else {
            return PieceHasher(pieceSize: configuration.storage.pieceSize, startingAtPiece: 0)
        }
        // Pieces written in order: the hashes recorded from the start, up to `offset`.
        let recorded = min(manifest.pieces.prefix(while: { $0 != nil }).count, Int(offset / manifest.pieceSize))
        manifest.pieces = Array(manifest.pieces.prefix(recorded))
        let (hasher, completed) = try await file.pieceHasher(
            pieceSize: manifest.pieceSize, firstPiece: recorded, upTo: offset
        )
        manifest.pieces += completed.map(Optional.some)
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
