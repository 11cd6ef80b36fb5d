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
        var updated: ContinuousClock.Instant
    }

    /// Bytes per second.
    public let bytesPerSecond: Int64
    private let burst: Double
    private let bucket: Mutex<Bucket>

    /// - Parameter bytesPerSecond: the rate; at least 1.
    public init(bytesPerSecond: Int64) {
        self.bytesPerSecond = max(1, bytesPerSecond)
        // A twentieth of a second of credit: smooth, yet no stop-and-go for every network buffer.
        self.burst = max(16 * 1024, Double(self.bytesPerSecond) / 20)
        self.bucket = Mutex(Bucket(tokens: 0, updated: .now))
    }

    /// Accounts for `count` bytes, sleeping as long as the rate requires.
    public func take(_ count: Int) async throws {
        let wait = bucket.withLock { bucket -> Duration in
            let now = ContinuousClock.now
            let elapsed = (now - bucket.updated).seconds
            bucket.tokens = min(burst, bucket.tokens + elapsed * Double(bytesPerSecond))
            bucket.updated = now
            bucket.tokens -= Double(count)
            guard bucket.tokens < 0 else { return .zero }
            return .nanoseconds(Int64(-bucket.tokens / Double(bytesPerSecond) * 1e9))
        }
        if wait > .zero { try await Task.sleep(for: wait) }
    }
}
