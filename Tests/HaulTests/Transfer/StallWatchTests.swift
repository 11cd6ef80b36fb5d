import Synchronization
import Testing

@testable import Haul

@Suite("One watch gives up on stalled exchanges", .timeLimit(.minutes(1)))
struct StallWatchTests {
    /// The exchanges aborted so far, by name, in order.
    final class Aborts: Sendable {
        private let names = Mutex<[String]>([])
        var all: [String] { names.withLock { $0 } }
        func abort(_ name: String) -> @Sendable () -> Void { { self.names.withLock { $0.append(name) } } }
    }

    @Test func anExchangeIsAbortedOnceAtItsDeadlineAndOneThatEndedIsNot() async throws {
        let clock = ManualClock()
        let watch = StallWatch(timeout: .seconds(20), clock: TransferClock(clock))
        let aborts = Aborts()
        let ended = watch.begin(abort: aborts.abort("ended"))
        try await waitUntil("the watch sleeps until the first deadline") { clock.sleeperCount == 1 }
        clock.advance(by: .seconds(5))
        let stalled = watch.begin(abort: aborts.abort("stalled"))
        watch.end(ended)
        // The first deadline passes with its exchange ended: nothing is aborted, and the watch sleeps
        // until the second.
        clock.advance(by: .seconds(15))
        try await waitUntil("the watch sleeps until the second deadline") {
            clock.sleeperCount == 1 && clock.requestedSleeps.count == 2
        }
        #expect(aborts.all.isEmpty)
        clock.advance(by: .seconds(4))
        try await Task.sleep(for: .milliseconds(50))
        #expect(aborts.all.isEmpty)
        clock.advance(by: .seconds(1))
        try await waitUntil("the stalled exchange is aborted") { aborts.all == ["stalled"] }
        // Nothing is watched: the watching task ends, and ending the aborted ticket changes nothing.
        try await waitUntil("the watch stops sleeping") { clock.sleeperCount == 0 }
        watch.end(stalled)
        #expect(watch.count == 0)
        clock.advance(by: .seconds(60))
        try await Task.sleep(for: .milliseconds(50))
        #expect(aborts.all == ["stalled"])
    }

    @Test func exchangesBegunAfterTheWatchWentIdleAreWatchedAgain() async throws {
        let clock = ManualClock()
        let watch = StallWatch(timeout: .seconds(10), clock: TransferClock(clock))
        let aborts = Aborts()
        _ = watch.begin(abort: aborts.abort("first"))
        try await waitUntil("the watch sleeps") { clock.sleeperCount == 1 }
        clock.advance(by: .seconds(10))
        try await waitUntil("the first is aborted and the watch ends") {
            aborts.all == ["first"] && clock.sleeperCount == 0
        }
        _ = watch.begin(abort: aborts.abort("second"))
        try await waitUntil("a new watch sleeps") { clock.sleeperCount == 1 }
        clock.advance(by: .seconds(10))
        try await waitUntil("the second is aborted") { aborts.all == ["first", "second"] }
    }

    @Test func aStoppedWatchTakesNothingNewAndEndsWithTheLastItWatches() async throws {
        let clock = ManualClock()
        let watch = StallWatch(timeout: .seconds(10), clock: TransferClock(clock))
        let aborts = Aborts()
        _ = watch.begin(abort: aborts.abort("before"))
        try await waitUntil("the watch sleeps") { clock.sleeperCount == 1 }
        watch.stop()
        _ = watch.begin(abort: aborts.abort("after"))
        #expect(watch.count == 1)
        // The exchange begun before the stop is still given up on; the one after is not watched.
        clock.advance(by: .seconds(30))
        try await waitUntil("the watched exchange is aborted and the watch ends") {
            aborts.all == ["before"] && clock.sleeperCount == 0
        }
        try await Task.sleep(for: .milliseconds(50))
        #expect(aborts.all == ["before"])
    }

    @Test func aStoppedIdleWatchEndsAtOnce() async throws {
        let clock = ManualClock()
        let watch = StallWatch(timeout: .seconds(10), clock: TransferClock(clock))
        let ended = watch.begin(abort: {})
        try await waitUntil("the watch sleeps") { clock.sleeperCount == 1 }
        watch.end(ended)
        watch.stop()
        try await waitUntil("the watching task ends without the clock moving") { clock.sleeperCount == 0 }
    }
}
