import NIOCore
import NIOPosix

/// Runs blocking file-system calls on a thread pool and waits for them.
///
/// The work always runs to its end, even when the waiting task is cancelled: a pause must still be
/// able to write its last block and checkpoint, and a write that already started must finish before
/// the manifest is updated.
struct BlockingIO: Sendable {
    let threadPool: NIOThreadPool

    static let shared = BlockingIO(threadPool: .singleton)

    /// Runs `body` on the pool; the waiting task resumes straight from the pool's thread, without a
    /// detour through an event loop (each detour costs a thread wake-up, which adds up over many
    /// small files).
    func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withUnsafeThrowingContinuation { continuation in
            threadPool.submit { state in
                switch state {
                case .active: continuation.resume(with: Result(catching: body))
                case .cancelled:
                    continuation.resume(throwing: HaulError(.fileSystem, "the I/O thread pool has stopped"))
                }
            }
        }
    }
}
