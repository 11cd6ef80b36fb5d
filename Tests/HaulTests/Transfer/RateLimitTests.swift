import HaulTestServer
import Synchronization
import Testing

@testable import Haul

struct ByteRateTests {
    @Test(arguments: [
        ("65536", Int64(65536)), ("500k", 512_000), ("2M", 2_097_152), ("2MiB/s", 2_097_152), ("1.5g", 1_610_612_736),
        ("10KB", 10_240),
    ])
    func parses(text: String, expected: Int64) throws {
        #expect(try ByteRate.parse(text) == expected)
    }

    @Test(arguments: ["", "fast", "-1M", "0", "2T", "1e3", "M", "2M/s/s"])
    func rejects(text: String) {
        #expect(throws: HaulError.self) { try ByteRate.parse(text) }
    }

    @Test func sizesTakeZeroAndNoRate() throws {
        #expect(try ByteCount.parse("0") == 0)
        #expect(try ByteCount.parse("64M") == 64 << 20)
        #expect(throws: HaulError.self) { try ByteCount.parse("2M/s") }
        #expect(throws: HaulError.self) { try ByteCount.parse("-1") }
    }
}

/// The token bucket's rule, on a controlled clock: no real time passes.
struct RateLimiterRuleTests {
    /// Takes `chunk`-byte pieces as fast as the limiter lets them through, for `duration` of the
    /// limiter's time, from `takers` downloads in turn; returns the bytes that went through.
    func transfer(
        _ limiter: RateLimiter, chunk: Int, takers: Int = 1, from start: Moment = .zero, for duration: Duration
    ) -> (bytes: Int64, byTaker: [Int64]) {
        var now = start
        var clocks = Array(repeating: start, count: takers)
        var byTaker = Array(repeating: Int64(0), count: takers)
        var bytes: Int64 = 0
        while true {
            // The taker that may take next is the one whose wait ends first.
            let taker = clocks.indices.min { clocks[$0] < clocks[$1] }!
            now = max(now, clocks[taker])
            guard now < start + duration else { break }
            let wait = limiter.debit(chunk, at: now)
            bytes += Int64(chunk)
            byTaker[taker] += Int64(chunk)
            clocks[taker] = now + wait
        }
        return (bytes, byTaker)
    }

    @Test(arguments: [4096, 16_384, 65_536])
    func aDownloadHoldsItsLimitWithinOnePercentOverTenSeconds(chunk: Int) {
        let rate: Int64 = 2_000_000
        let limiter = RateLimiter(bytesPerSecond: rate, clock: ManualClock())
        let (bytes, _) = transfer(limiter, chunk: chunk, for: .seconds(10))
        let measured = Double(bytes) / 10
        #expect(abs(measured - Double(rate)) / Double(rate) < 0.01, "measured \(measured) B/s")
    }

    @Test func aSharedLimiterPacesSeveralDownloadsTogether() {
        let rate: Int64 = 2_000_000
        let limiter = RateLimiter(bytesPerSecond: rate, clock: ManualClock())
        let (bytes, byTaker) = transfer(limiter, chunk: 16_384, takers: 2, for: .seconds(10))
        let measured = Double(bytes) / 10
        // Together they hold the limit (bytes counted twice would halve it), and they share it.
        #expect(abs(measured - Double(rate)) / Double(rate) < 0.01, "measured \(measured) B/s")
        #expect(abs(Double(byTaker[0] - byTaker[1])) < Double(bytes) * 0.05)
    }

    @Test func theFirstBurstIsATwentiethOfASecond() {
        let limiter = RateLimiter(bytesPerSecond: 2_000_000, clock: ManualClock())
        // The bucket starts empty, refills at the rate, and holds at most 100 kB.
        #expect(limiter.debit(100_000, at: .zero) == .milliseconds(50))
        #expect(limiter.debit(100_000, at: Moment(.seconds(60))) == .zero)
        #expect(limiter.debit(100_000, at: Moment(.seconds(60))) == .milliseconds(50))
    }

    @Test func aLimitChangedAtRunTimeHoldsFromTheNextBytesOn() {
        let clock = ManualClock()
        let limiter = RateLimiter(bytesPerSecond: nil, clock: clock)
        // No limit: nothing waits, however much is taken.
        #expect(limiter.bytesPerSecond == nil)
        #expect(limiter.debit(10_000_000, at: .zero) == .zero)
        limiter.setRate(1_000_000)
        #expect(limiter.bytesPerSecond == 1_000_000)
        let (bytes, _) = transfer(limiter, chunk: 16_384, for: .seconds(10))
        #expect(abs(Double(bytes) / 10 - 1_000_000) / 1_000_000 < 0.01, "measured \(Double(bytes) / 10) B/s")
        // Halved: the next ten seconds hold the new rate.
        limiter.setRate(500_000)
        let (slower, _) = transfer(limiter, chunk: 16_384, from: Moment(.seconds(10)), for: .seconds(10))
        #expect(abs(Double(slower) / 10 - 500_000) / 500_000 < 0.01, "measured \(Double(slower) / 10) B/s")
        limiter.setRate(nil)
        #expect(limiter.debit(10_000_000, at: Moment(.seconds(100))) == .zero)
    }

    @Test func atALowRateTheFirstBurstIsASecondsWorthAtMost() {
        let limiter = RateLimiter(bytesPerSecond: 1000, clock: ManualClock())
        #expect(limiter.debit(1000, at: Moment(.seconds(60))) == .zero)
        #expect(limiter.debit(250, at: Moment(.seconds(60))) == .milliseconds(250))
        #expect(limiter.pace == 250)
        #expect(RateLimiter(bytesPerSecond: 1, clock: ManualClock()).pace == 1)
        #expect(RateLimiter(bytesPerSecond: nil, clock: ManualClock()).pace == nil)
    }

    @Test func aTakerSleepsOnTheLimitersClock() async throws {
        let clock = ManualClock()
        let limiter = RateLimiter(bytesPerSecond: 1000, clock: clock)
        let taken = Task { try await limiter.take(2000) }
        try await clock.waitForSleepers()
        #expect(clock.requestedSleeps == [.seconds(2)])
        clock.advance(by: .seconds(2))
        try await taken.value
    }
}

@Suite(.timeLimit(.minutes(1)))
struct RateLimitTests {
    /// The real path end to end, briefly: a limited download cannot go faster than its limit.
    @Test func aLimitedDownloadTakesAtLeastItsSizeOverItsRate() async throws {
        try await HaulTestServer.withRunning { server in
            let rate: Int64 = 4_000_000
            let resource = TestResource(name: "limited", size: rate)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let clock = ContinuousClock()
                let start = clock.now
                try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(
                            url: server.url("/f"), destination: .file(directory + "/f"), bytesPerSecondLimit: rate))
                }
                // Less the bucket's first burst (a twentieth of a second).
                #expect((clock.now - start).secondsValue >= 0.9)
                #expect(try readFile(directory + "/f") == resource.content)
            }
        }
    }

    /// A download slowed by its limit far below what the server sends is not stalled: bytes reach
    /// the disk every second, the stall clock runs only while the limit lets bytes through, and the
    /// limit holds. On the download's clock, moved on only while the transfer waits for the limiter.
    @Test(arguments: [(Int64(1000), Int64(20_000)), (1, 40)])
    func aLowLimitIsNotTakenForAStall(rate: Int64, size: Int64) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "slow-\(rate)", size: size)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let clock = ManualClock()
                let log = EventLog()
                let done = Atomic(false)
                let download = Task {
                    defer { done.store(true, ordering: .relaxed) }
                    return try await withDownloader(testConfiguration(retries: 0, stall: .seconds(5)), clock: clock) {
                        downloader in
                        try await downloader.download(
                            DownloadRequest(
                                url: server.url("/f"), destination: .file(directory + "/f"), bytesPerSecondLimit: rate),
                            observing: log.record)
                    }
                }
                // A test that fails or runs out of time ends the download, which waits on the clock.
                defer { download.cancel() }
                // A quarter of a second's worth goes at a time (one byte at 1 B/s).
                let step: Duration = rate >= 4 ? .milliseconds(250) : .seconds(1)
                var elapsed: Duration = .zero
                while !done.load(ordering: .relaxed) {
                    // The driver's timer and the transfer waiting for the limiter.
                    if clock.sleeperCount < 2 {
                        try await Task.sleep(for: .milliseconds(1))
                        continue
                    }
                    clock.advance(by: step)
                    elapsed += step
                    #expect(elapsed < .seconds(Int64(Double(size) / Double(rate) * 2)), "no end in sight")
                    if elapsed > .seconds(Int64(Double(size) / Double(rate) * 2)) {
                        download.cancel()
                        break
                    }
                }
                _ = try await download.value
                #expect(try readFile(directory + "/f") == resource.content)
                #expect(server.requests(for: "/f").count == 1 && log.retries.isEmpty)
                // The limit held within a few percent: a second's burst at most.
                let expected = Double(size) / Double(rate)
                #expect(elapsed.secondsValue >= expected - 1.01 && elapsed.secondsValue <= expected * 1.05 + 0.5)
                // Bytes reached the disk all along, not in one go at the end.
                #expect(Set(log.progress.map(\.bytes)).count >= Int(expected / 2), "\(log.progress.map(\.bytes))")
            }
        }
    }

    /// A limiter given to a downloader paces all its downloads together, end to end.
    @Test func aSharedLimiterHoldsSeveralDownloadsToItsRate() async throws {
        try await HaulTestServer.withRunning { server in
            let rate: Int64 = 4_000_000
            let resources = [
                "a": TestResource(name: "shared-a", size: rate), "b": TestResource(name: "shared-b", size: rate),
            ]
            for (name, resource) in resources { server.add("/\(name)", resource) }
            var configuration = testConfiguration()
            configuration.sharedRateLimiter = RateLimiter(bytesPerSecond: rate)
            try await withTemporaryDirectory { directory in
                let clock = ContinuousClock()
                let start = clock.now
                try await withDownloader(configuration) { downloader in
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        for name in ["a", "b"] {
                            group.addTask {
                                try await downloader.download(
                                    DownloadRequest(
                                        url: server.url("/\(name)"), destination: .file(directory + "/\(name)")))
                            }
                        }
                        try await group.waitForAll()
                    }
                }
                // 8 MB at 4 MB/s together: two seconds at the least.
                #expect((clock.now - start).secondsValue >= 1.9)
                for name in ["a", "b"] { #expect(try readFile(directory + "/\(name)") == resources[name]?.content) }
            }
        }
    }
}

extension Duration {
    var secondsValue: Double {
        let parts = components
        return Double(parts.seconds) + Double(parts.attoseconds) / 1e18
    }
}
