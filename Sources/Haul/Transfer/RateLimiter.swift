import Synchronization

/// A token bucket that paces bytes to a rate. One limiter can be shared by several downloads (a global
/// limit); each download can also have its own.
///
/// A caller takes the bytes it just received and, when that overdraws the bucket, sleeps until the
/// debt is repaid. Because the sleep holds back reading from the connection, TCP slows the sender
/// down: nothing piles up in memory.
public final class RateLimiter: Sendable {
    private struct Bucket {
        var tokens: Double
        var updated: Moment
    }

    /// Bytes per second.
    public let bytesPerSecond: Int64
    private let burst: Double
    private let bucket: Mutex<Bucket>
    private let clock: TransferClock

    /// - Parameters:
    ///   - bytesPerSecond: the rate; at least 1.
    ///   - clock: the clock the rate is measured by (the continuous clock unless a test gives its own).
    public convenience init(bytesPerSecond: Int64, clock: any Clock<Duration> = ContinuousClock()) {
        self.init(bytesPerSecond: bytesPerSecond, clock: TransferClock(clock))
    }

    init(bytesPerSecond: Int64, clock: TransferClock) {
        self.bytesPerSecond = max(1, bytesPerSecond)
        // A twentieth of a second of credit: smooth, yet no stop-and-go for every network buffer.
        self.burst = max(16 * 1024, Double(self.bytesPerSecond) / 20)
        self.clock = clock
        self.bucket = Mutex(Bucket(tokens: 0, updated: clock.now))
    }

    /// Accounts for `count` bytes, sleeping as long as the rate requires.
    public func take(_ count: Int) async throws {
        let wait = debit(count, at: clock.now)
        if wait > .zero { try await clock.sleep(for: wait) }
    }

    /// Accounts for `count` bytes taken at `now`; returns how long the taker must wait.
    func debit(_ count: Int, at now: Moment) -> Duration {
        bucket.withLock { bucket -> Duration in
            let elapsed = max(0, (now - bucket.updated).seconds)
            bucket.tokens = min(burst, bucket.tokens + elapsed * Double(bytesPerSecond))
            bucket.updated = max(now, bucket.updated)
            bucket.tokens -= Double(count)
            guard bucket.tokens < 0 else { return .zero }
            return .nanoseconds(Int64(-bucket.tokens / Double(bytesPerSecond) * 1e9))
        }
    }
}
