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
        var rate: Int64
        var burst: Double
    }

    /// The rate in bytes per second, 0 while unlimited: read without the lock on every chunk.
    private let currentRate: Atomic<Int64>
    private let bucket: Mutex<Bucket>
    private let clock: TransferClock

    /// Bytes per second; `nil` while the limiter lets everything through.
    public var bytesPerSecond: Int64? {
        let rate = currentRate.load(ordering: .relaxed)
        return rate > 0 ? rate : nil
    }

    /// - Parameters:
    ///   - bytesPerSecond: the rate; at least 1, or `nil` for no limit until ``setRate(_:)`` sets one.
    ///   - clock: the clock the rate is measured by (the continuous clock unless a test gives its own).
    public convenience init(bytesPerSecond: Int64?, clock: any Clock<Duration> = ContinuousClock()) {
        self.init(bytesPerSecond: bytesPerSecond, clock: TransferClock(clock))
    }

    init(bytesPerSecond: Int64?, clock: TransferClock) {
        let rate = bytesPerSecond.map { max(1, $0) } ?? 0
        self.clock = clock
        self.currentRate = Atomic(rate)
        self.bucket = Mutex(Bucket(tokens: 0, updated: clock.now, rate: rate, burst: Self.burst(rate)))
    }

    /// A twentieth of a second of credit, at least 16 KiB so that fast transfers do not stop and go
    /// for every network buffer, but never more than a second's worth: at a low rate the limit holds
    /// from the first second on.
    private static func burst(_ rate: Int64) -> Double { max(min(16 * 1024, Double(rate)), Double(rate) / 20) }

    /// Changes the rate (`nil`: no limit) for every download sharing the limiter, from their next
    /// bytes on.
    public func setRate(_ bytesPerSecond: Int64?) {
        let rate = bytesPerSecond.map { max(1, $0) } ?? 0
        bucket.withLock { bucket in
            bucket.rate = rate
            bucket.burst = Self.burst(rate)
            bucket.tokens = min(bucket.tokens, bucket.burst)
        }
        currentRate.store(rate, ordering: .relaxed)
    }

    /// The most bytes a transfer should take at once: a quarter of a second's worth (`nil` while
    /// unlimited). At a low rate, bytes then still reach the disk every second or so instead of
    /// after one long wait per network buffer.
    var pace: Int? {
        let rate = currentRate.load(ordering: .relaxed)
        return rate > 0 ? Int(max(1, rate / 4)) : nil
    }

    /// Accounts for `count` bytes, sleeping as long as the rate requires.
    public func take(_ count: Int) async throws {
        guard currentRate.load(ordering: .relaxed) > 0 else { return }
        let wait = debit(count, at: clock.now)
        if wait > .zero { try await clock.sleep(for: wait) }
    }

    /// Accounts for `count` bytes taken at `now`; returns how long the taker must wait.
    func debit(_ count: Int, at now: Moment) -> Duration {
        bucket.withLock { bucket -> Duration in
            guard bucket.rate > 0 else { return .zero }
            let rate = Double(bucket.rate)
            let elapsed = max(0, (now - bucket.updated).seconds)
            bucket.tokens = min(bucket.burst, bucket.tokens + elapsed * rate)
            bucket.updated = max(now, bucket.updated)
            bucket.tokens -= Double(count)
            guard bucket.tokens < 0 else { return .zero }
            return .nanoseconds(Int64(-bucket.tokens / rate * 1e9))
        }
    }
}
