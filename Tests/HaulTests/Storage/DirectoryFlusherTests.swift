import Dispatch
import Synchronization
import Testing

@testable import Haul

@Suite("Directory flushes shared by downloads finishing together")
struct DirectoryFlusherTests {
    /// Flushes the real directory, after holding the first flush until `release()`, failing the flushes
    /// listed in `failing` (counting from 1), and counting them all.
    final class GatedFlush: Sendable {
        let gate = DispatchSemaphore(value: 0)
        let calls = Atomic<Int>(0)
        let failing: Set<Int>

        init(failing: Set<Int> = []) { self.failing = failing }

        func flush(_ directory: DirectoryHandle) throws {
            let call = calls.add(1, ordering: .relaxed).newValue
            if call == 1 { gate.wait() }
            if failing.contains(call) { throw HaulError(.fileSystem, "flush \(call) failed") }
            try directory.sync()
        }

        func release() { gate.signal() }
    }

    /// Starts a flush that is held at the gate, then queues `count` more requests behind it.
    static func queueBehindAHeldFlush(
        _ flusher: DirectoryFlusher, _ gated: GatedFlush, in directory: DirectoryHandle, count: Int
    ) async throws -> (first: Task<UInt64?, any Error>, tickets: [UInt64]) {
        let io = BlockingIO.shared
        // The held flush waits on a thread of its own, not one of the I/O pool's.
        let first = Task {
            try await withCheckedThrowingContinuation { continuation in
                DispatchQueue.global().async {
                    continuation.resume(with: Result { try flusher.flushOrQueue(directory) })
                }
            }
        }
        while gated.calls.load(ordering: .relaxed) == 0 { try await Task.sleep(for: .milliseconds(1)) }
        var tickets: [UInt64] = []
        for _ in 0..<count {
            let ticket = try await io.run { try flusher.flushOrQueue(directory) }
            tickets.append(try #require(ticket, "a flush is running, so the request must wait for the next"))
        }
        return (first, tickets)
    }

    @Test("requests made during a flush share one more flush; a lone request flushes at once")
    func requestsDuringAFlushShareTheNext() async throws {
        try await withTemporaryDirectory { path in
            let directory = try DirectoryHandle.open(path)
            let gated = GatedFlush()
            let flusher = DirectoryFlusher(flush: { try gated.flush($0) })
            let (first, tickets) = try await Self.queueBehindAHeldFlush(flusher, gated, in: directory, count: 6)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for ticket in tickets {
                    group.addTask { try await flusher.waitForFlush(of: directory, ticket: ticket, io: .shared) }
                }
                gated.release()
                #expect(try await first.value == nil)
                try await group.waitForAll()
            }
            #expect(gated.calls.load(ordering: .relaxed) == 2)

            // Nothing running: the request flushes on the spot and returns no ticket.
            #expect(try await BlockingIO.shared.run { try flusher.flushOrQueue(directory) } == nil)
            #expect(gated.calls.load(ordering: .relaxed) == 3)
        }
    }

    @Test("a failed flush covers no one: its runner reports it and the next waiter flushes again")
    func aFailedFlushIsRetriedByTheNextWaiter() async throws {
        try await withTemporaryDirectory { path in
            let directory = try DirectoryHandle.open(path)
            let gated = GatedFlush(failing: [2])
            let flusher = DirectoryFlusher(flush: { try gated.flush($0) })
            let (first, tickets) = try await Self.queueBehindAHeldFlush(flusher, gated, in: directory, count: 4)
            let outcomes = await withTaskGroup(of: Bool.self) { group in
                for ticket in tickets {
                    group.addTask {
                        do {
                            try await flusher.waitForFlush(of: directory, ticket: ticket, io: .shared)
                            return true
                        } catch {
                            return false
                        }
                    }
                }
                gated.release()
                return await group.reduce(into: [Bool]()) { $0.append($1) }
            }
            #expect(try await first.value == nil)
            // Flush 2 failed for the waiter that ran it; flush 3 covered the other three.
            #expect(outcomes.filter { !$0 }.count == 1)
            #expect(outcomes.filter { $0 }.count == 3)
            #expect(gated.calls.load(ordering: .relaxed) == 3)
        }
    }
}
