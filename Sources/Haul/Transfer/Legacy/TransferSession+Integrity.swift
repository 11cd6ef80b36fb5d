/// Checking the complete file against the caller's checksum and the server's digests.
extension TransferSession {
    /// The checksums the complete file must match: the caller's, and the strongest digest the server
    /// announced for the file.
    func expectedChecksums(_ validator: ResourceValidator?) -> [Checksum] {
        var expected: [Checksum] = []
        if let checksum = request.checksum { expected.append(checksum) }
        // With the same algorithm as the caller's checksum, the caller's value decides.
        if let strongest = validator?.digests.max(by: { $0.algorithm < $1.algorithm }),
            strongest.algorithm != request.checksum?.algorithm
        {
            expected.append(strongest)
        }
        return expected
    }

    /// A hasher that has seen the file's first `offset` bytes, or `nil` when nothing is to be verified.
    ///
    /// A fresh download hashes while it streams and needs no second pass; a resume reads the prefix
    /// already on disk once (or reuses the hash from the previous attempt of this call).
    mutating func hasherForPrefix(_ offset: Int64, validator: ResourceValidator, file: PartialFile) async throws
        -> StreamingHasher?
    {
        let algorithms = Set(expectedChecksums(validator).map(\.algorithm))
        guard !algorithms.isEmpty else { return nil }
        if let prefixHash, prefixHash.offset == offset, prefixHash.hasher.algorithms == algorithms {
            return prefixHash.hasher
        }
        if offset == 0 { return StreamingHasher(algorithms: algorithms) }
        return try await file.hash(upTo: offset, algorithms: algorithms)
    }

    /// Checks the complete file against every expected checksum, hashing it from disk when the
    /// transfer did not already. Returns false when the download had to start over.
    ///
    /// A mismatch with the caller's checksum is final: the data stays under its partial name, so a
    /// corrected checksum finishes without downloading again. A mismatch with the server's own digest
    /// means the bytes are wrong, and the download starts over.
    mutating func verify(totalBytes: Int64, hasher: StreamingHasher?) async throws -> Bool {
        let expected = expectedChecksums(manifest?.validator)
        guard !expected.isEmpty, let file, let paths else { return true }
        let algorithms = Set(expected.map(\.algorithm))
        var computed = hasher
        if computed?.count != totalBytes || computed?.algorithms != algorithms {
            computed = try await file.hash(upTo: totalBytes, algorithms: algorithms)
        }
        guard let mismatch = Self.mismatch(expected: expected, computed: computed?.finalize() ?? []) else {
            return true
        }
        if mismatch.expected == request.checksum {
            // Kept for a corrected checksum: the data needs its manifest.
            if manifestUnwritten { try await storeManifest(durable: false) }
            throw HaulError(
                .checksumMismatch, "checksum mismatch: \(mismatch.description); the data is kept in \(paths.partial)"
            )
        }
        prefixHash = nil
        try await startOver(.digestMismatch(mismatch.description))
        return false
    }

    /// The first expected checksum that a computed digest of the same algorithm contradicts.
    static func mismatch(expected: [Checksum], computed: [Checksum]) -> ChecksumMismatch? {
        for checksum in expected {
            if let actual = computed.first(where: { $0.algorithm == checksum.algorithm }), actual != checksum {
                return ChecksumMismatch(expected: checksum, actual: actual)
            }
        }
        return nil
    }
}

/// An expected checksum and the digest the bytes really have.
struct ChecksumMismatch {
    let expected: Checksum
    let actual: Checksum

    var description: String {
        "\(expected.algorithm.rawValue) is \(actual.hex), expected \(expected.hex)"
    }
}
