import Synchronization

/// The checksum of a file's first bytes, kept while the file is written, so that a file written in
/// order needs no second read to be verified. Whichever connection writes where the hashed prefix
/// ends advances it; bytes written elsewhere are hashed from the disk at the end.
final class PrefixHash: Sendable {
    private struct State {
        var hasher: StreamingHasher
        /// Set while a write task hashes its block.
        var inUse = false
    }

    let algorithms: Set<DigestAlgorithm>
    private let state: Mutex<State>

    /// `nil` when there is nothing to verify.
    init?(algorithms: Set<DigestAlgorithm>) {
        guard !algorithms.isEmpty else { return nil }
        self.algorithms = algorithms
        self.state = Mutex(State(hasher: StreamingHasher(algorithms: algorithms)))
    }

    /// Hashes `bytes`, just written at `offset`, when they continue the hashed prefix.
    func advance(over bytes: UnsafeRawBufferPointer, at offset: Int64) {
        guard var hasher = take(at: offset) else { return }
        hasher.update(bytes)
        putBack(hasher)
    }

    /// Hashes the file's bytes from the end of the prefix up to `offset`.
    func catchUp(to offset: Int64, file: PartialFile) async throws {
        let start = state.withLock { $0.hasher.count }
        guard start < offset, let hasher = take(at: start) else { return }
        do {
            putBack(try await file.hash(continuing: hasher, upTo: offset))
        } catch {
            putBack(hasher)
            throw error
        }
    }

    /// The hash of the prefix, when it is computed with `algorithms`.
    func current(algorithms: Set<DigestAlgorithm>) -> StreamingHasher? {
        state.withLock { state in
            state.inUse || state.hasher.algorithms != algorithms ? nil : state.hasher
        }
    }

    /// Forgets the hash when it covers bytes from `offset` on, which are being replaced.
    func forget(from offset: Int64) {
        state.withLock { state in
            if state.hasher.count > offset { state.hasher = StreamingHasher(algorithms: algorithms) }
        }
    }

    private func take(at offset: Int64) -> StreamingHasher? {
        state.withLock { state in
            guard !state.inUse, state.hasher.count == offset else { return nil }
            state.inUse = true
            return state.hasher
        }
    }

    private func putBack(_ hasher: StreamingHasher) {
        state.withLock { state in
            state.hasher = hasher
            state.inUse = false
        }
    }
}
