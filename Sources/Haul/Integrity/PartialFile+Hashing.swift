extension PartialFile {
    /// Hashes the file's first `length` bytes on the thread pool, reading 1 MiB at a time.
    func hash(upTo length: Int64, algorithms: Set<DigestAlgorithm>) async throws -> StreamingHasher {
        try await readSequentially(upTo: length, into: StreamingHasher(algorithms: algorithms)) { hasher, bytes in
            hasher.update(bytes)
        }
    }
}
