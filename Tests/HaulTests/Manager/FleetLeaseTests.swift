import HaulPostgreSQL
import Synchronization
import Testing

@testable import Haul

/// Workers' leases on a PostgreSQL queue, on the tests' server, with a clock the test moves: a
/// worker is alive while its lease runs; one whose lease ran out is taken over, its downloads go
/// back to the queue, and nothing it commits afterwards is written.
@Suite(.timeLimit(.minutes(2))) struct FleetLeaseTests {
    /// Seconds since 1970, moved by the test.
    final class TestClock: Sendable {
        private let now = Mutex(1_000_000.0)
        func advance(_ seconds: Double) { now.withLock { $0 += seconds } }
        var read: @Sendable () -> Double { { self.now.withLock { $0 } } }
    }

    /// Runs `body` with a fresh queue database, two stores on it and a clock.
    func withFleet(
        _ body: (PostgreSQLQueueStore, PostgreSQLQueueStore, TestClock) throws -> Void
    ) async throws {
        try await PostgreSQLTesting.withDatabase { location in
            try body(
                try PostgreSQLQueueStore(location: location), try PostgreSQLQueueStore(location: location), TestClock())
        }
    }

    /// A lease holds while it is renewed; the worker stops writing two thirds into a lease that is
    /// not renewed, and others see it gone once the lease has run out.
    @Test func aLeaseHoldsWhileItIsRenewed() async throws {
        try await withFleet { first, second, clock in
            let a = try FleetLease(store: first, duration: 30, clock: clock.read)
            let b = try FleetLease(store: second, duration: 30, clock: clock.read)
            #expect(a.name != b.name && a.token != b.token)
            #expect(b.isAlive(a.name) && a.isHeld)
            for _ in 0..<5 {
                clock.advance(15)
                #expect(a.renew())
            }
            #expect(b.isAlive(a.name) && a.isHeld)
            clock.advance(19)
            #expect(a.isHeld && b.isAlive(a.name))
            clock.advance(2)
            #expect(!a.isHeld, "two thirds of the lease passed without a renewal")
            #expect(b.isAlive(a.name))
            clock.advance(10)
            #expect(!b.isAlive(a.name))
            // Nobody took over yet: a late renewal is refused all the same (the lease ran out).
            #expect(!a.renew())
            #expect(!a.isHeld)
            b.release()
            #expect(!a.isAlive(b.name))
        }
    }

    /// A worker whose lease ran out is taken over: its registration ends, every download it owned
    /// is nobody's, a running one queued again (the counts follow), and a commit it makes
    /// afterwards fails with `locked` and writes nothing. A live worker is not touched.
    @Test func aWorkerWhoseLeaseRanOutIsTakenOver() async throws {
        try await withFleet { first, second, clock in
            let a = try FleetLease(store: first, duration: 30, clock: clock.read)
            let b = try FleetLease(store: second, duration: 30, clock: clock.read)
            var records = try QueueStoreConformanceTests.stored(
                first, count: 6, states: [.running, .queued, .paused], owner: { $0 < 4 ? a.name : b.name })
            #expect(try second.counts() == [.running: 2, .queued: 2, .paused: 2])
            // A commit under a's fence goes through while the lease holds.
            records[0].bytes = 10
            _ = try first.commit(QueueChanges(updates: [records[0]], fence: a.fence()))
            #expect(try b.takeOverExpired().isEmpty)

            clock.advance(20)
            #expect(b.renew())
            clock.advance(11)
            #expect(try b.takeOverExpired() == [a.name])
            let after = try second.allDownloads()
            #expect(after[0...3].allSatisfy { $0.owner == nil })
            #expect(after[0...3].map(\.state) == [.queued, .queued, .paused, .queued])
            #expect(after[4...5].allSatisfy { $0.owner == b.name })
            #expect(try second.counts() == [.queued: 4, .paused: 2])
            #expect(!b.isAlive(a.name))

            // a, cut off meanwhile, comes back: its renewal fails and its commits are refused.
            #expect(!a.renew())
            records[1].bytes = 99
            let refused = #expect(throws: HaulError.self) {
                try first.commit(QueueChanges(updates: [records[1]], fence: a.fence()))
            }
            #expect(refused?.code == .locked)
            #expect(refused?.message.contains("taken over") == true, "\(refused?.message ?? "")")
            #expect(try second.download(records[1].downloadID)?.bytes == 0)
        }
    }

    /// A fence of another registration of the same worker name (a worker that registered again)
    /// is refused: only the registration that holds the lease writes.
    @Test func aStaleRegistrationWritesNothing() async throws {
        try await withFleet { first, _, clock in
            let a = try FleetLease(store: first, duration: 30, clock: clock.read)
            let stale = QueueFence(owner: a.name, token: a.token - 1, now: clock.read())
            let record = QueueStoreConformanceTests.record("x", owner: a.name)
            let refused = #expect(throws: HaulError.self) {
                try first.commit(QueueChanges(inserts: [record], fence: stale))
            }
            #expect(refused?.code == .locked)
            #expect(try first.allDownloads().isEmpty)
            _ = try first.commit(QueueChanges(inserts: [record], fence: a.fence()))
            #expect(try first.allDownloads().map(\.key) == [record.key])
        }
    }
}
