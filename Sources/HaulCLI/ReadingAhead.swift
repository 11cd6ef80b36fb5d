import Dispatch
import Foundation
import Synchronization

/// Runs `produce` on a thread of its own, at most `depth` chunks ahead of `consume`, which gets
/// them in order on the calling thread: reading and parsing a long list goes on while the queue
/// adds what was read. An error of either ends both (the producer's is thrown here, once the
/// chunks before it are consumed); when this returns, `produce` has ended too.
func readingAhead<Chunk: Sendable>(
    depth: Int = 2, _ produce: @escaping @Sendable (_ next: (Chunk) throws -> Void) throws -> Void,
    consume: (Chunk) throws -> Void
) throws {
    let handoff = Handoff<Chunk>(depth: depth)
    let thread = Thread {
        do {
            try produce { chunk in
                handoff.free.wait()
                if handoff.stopped.load(ordering: .acquiring) { throw CancellationError() }
                handoff.put(.chunk(chunk))
            }
            handoff.put(.end)
        } catch {
            handoff.put(.failure(error))
        }
        handoff.finished.signal()
    }
    thread.start()
    defer {
        handoff.stopped.store(true, ordering: .releasing)
        handoff.free.signal()
        handoff.finished.wait()
    }
    while true {
        switch handoff.take() {
        case .chunk(let chunk): try consume(chunk)
        case .end: return
        case .failure(let error): throw error
        }
    }
}

/// The chunks on their way from the producing thread to the consuming one.
private final class Handoff<Chunk: Sendable>: Sendable {
    enum Item: Sendable {
        case chunk(Chunk)
        case end
        case failure(any Error)
    }

    /// Places left for chunks not yet taken.
    let free: DispatchSemaphore
    /// Items put and not yet taken.
    private let ready = DispatchSemaphore(value: 0)
    /// Signalled once the producer has ended.
    let finished = DispatchSemaphore(value: 0)
    /// Set when the consumer stops: the producer ends at its next chunk.
    let stopped = Atomic(false)
    private let items = Mutex<[Item]>([])

    init(depth: Int) {
        free = DispatchSemaphore(value: max(1, depth))
    }

    func put(_ item: Item) {
        items.withLock { $0.append(item) }
        ready.signal()
    }

    /// The next item, waiting for it; the place of a chunk is given back.
    func take() -> Item {
        ready.wait()
        let item = items.withLock { $0.removeFirst() }
        if case .chunk = item { free.signal() }
        return item
    }
}
