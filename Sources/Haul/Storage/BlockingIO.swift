import NIOCore
import NIOPosix

/// Runs blocking file-system calls on a thread pool and waits for them.
///
/// The work always runs to its end, even when the waiting task is cancelled: a pause must still be
/// able to write its last block and checkpoint, and a write that already started must finish before
/// the manifest is updated.
struct BlockingIO: Sendable {
    let threadPool: NIOThreadPool
    let eventLoop: any EventLoop

    static let shared = BlockingIO(threadPool: .singleton, eventLoop: MultiThreadedEventLoopGroup.singleton.any())

    func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await threadPool.runIfActive(eventLoop: eventLoop, body).get()
    }
}
