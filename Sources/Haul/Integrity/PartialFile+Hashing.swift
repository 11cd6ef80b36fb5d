extension PartialFile {
    /// Hashes the file's first `length` bytes on the thread pool, reading 1 MiB at a time.
    func hash(upTo length: Int64, algorithms: Set<DigestAlgorithm>) async throws -> StreamingHasher {
        try await readSequentially(upTo: length, into: StreamingHasher(algorithms: algorithms)) { hasher, bytes in
            hasher.update(bytes)
        }
    }
}

extension PartialFile {
    /// The hash of piece `index`, as ``PieceHasher`` records it; `nil` when the file ends inside it.
    func pieceHash(_ index: Int, pieceSize: Int64) async throws -> String? {
        let bytes = try await read(count: Int(pieceSize), at: Int64(index) * pieceSize)
        guard bytes.count == Int(pieceSize) else { return nil }
        return bytes.withUnsafeBytes { PieceHasher.hash($0) }
    }

    /// A piece hasher that has seen the file from the start of piece `firstPiece` up to `offset`,
    /// and the hashes of the pieces completed on the way.
    func pieceHasher(pieceSize: Int64, firstPiece: Int, upTo offset: Int64) async throws -> (PieceHasher, [String]) {
        struct Progress: Sendable {
            var hasher: PieceHasher
            var completed: [String] = []
        }
        let start = Int64(firstPiece) * pieceSize
        let progress = try await readSequentially(
            from: start, upTo: offset,
            into: Progress(hasher: PieceHasher(pieceSize: pieceSize, startingAtPiece: firstPiece))
        ) { progress, bytes in progress.completed += progress.hasher.update(bytes) }
        return (progress.hasher, progress.completed)
    }
}

extension PartialFile {
    /// Continues `hasher`, which has seen the file's first `hasher.count` bytes, up to `length`.
    func hash(continuing hasher: StreamingHasher, upTo length: Int64) async throws -> StreamingHasher {
        try await readSequentially(from: hasher.count, upTo: length, into: hasher) { hasher, bytes in
            hasher.update(bytes)
        }
    }
}
