import Haul
import HaulTestServer
import Synchronization
import Testing

/// Progress samples with the time they were observed, to measure a rate inside the transfer
/// (without connection setup and the final flush). Several downloads may report to one probe, each
/// under its own name: a sample is then the bytes of all of them together.
final class RateProbe: Sendable {
    private struct State {
        var bytesByDownload: [String: Int64] = [:]
        var samples: [(ContinuousClock.Instant, Int64)] = []
    }
    private let state = Mutex(State())

    func record(_ event: DownloadEvent) { record(event, of: "") }

    func record(_ event: DownloadEvent, of download: String) {
        guard case .progress(let progress) = event else { return }
        state.withLock { state in
            state.bytesByDownload[download] = progress.bytes
            state.samples.append((.now, state.bytesByDownload.values.reduce(0, +)))
        }
    }

    /// Bytes per second over the last `window` of the transfer.
    func rate(over window: Duration) -> Double {
        state.withLock { state in
            let samples = state.samples
            guard let last = samples.last, let first = samples.first(where: { last.0 - $0.0 <= window }),
                last.0 > first.0
            else { return 0 }
            return Double(last.1 - first.1) / (last.0 - first.0).secondsValue
        }
    }
}

struct ByteRateTests {
    @Test(arguments: [
        ("65536", Int64(65536)), ("500k", 512_000), ("2M", 2_097_152), ("2MiB/s", 2_097_152), ("1.5g", 1_610_612_736),
        ("10KB", 10_240),
    ])
    func parses(text: String, expected: Int64) throws {
        #expect(try ByteRate.parse(text) == expected)
    }

    @Test(arguments: ["", "fast", "-1M", "0", "2T", "1e3", "M"])
    func rejects(text: String) {
        #expect(throws: HaulError.self) { try ByteRate.parse(text) }
    }
}

@Suite(.timeLimit(.minutes(1)))
struct RateLimitTests {
    @Test func aDownloadHoldsItsLimitWithinFivePercentOverTenSeconds() async throws {
        try await HaulTestServer.withRunning { server in
            let rate: Int64 = 2_000_000
            // 14 s of transfer, measured over its last 10 s.
            let resource = TestResource(name: "limited", size: 14 * rate)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let probe = RateProbe()
                try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(
                            url: server.url("/f"), destination: .file(directory + "/f"), bytesPerSecondLimit: rate),
                        observing: probe.record
                    )
                }
                let measured = probe.rate(over: .seconds(10))
                #expect(abs(measured - Double(rate)) / Double(rate) < 0.05, "measured \(measured) B/s")
                #expect(try readFile(directory + "/f") == resource.content)
            }
        }
    }

    @Test func aSharedLimiterPacesSeveralDownloadsTogether() async throws {
        try await HaulTestServer.withRunning { server in
            let rate: Int64 = 2_000_000
            let resources = [
                "a": TestResource(name: "shared-a", size: 4 * rate),
                "b": TestResource(name: "shared-b", size: 4 * rate),
            ]
            for (name, resource) in resources { server.add("/\(name)", resource) }
            var configuration = testConfiguration()
            configuration.sharedRateLimiter = RateLimiter(bytesPerSecond: rate)
            try await withTemporaryDirectory { directory in
                let probe = RateProbe()
                let clock = ContinuousClock()
                let start = clock.now
                try await withDownloader(configuration) { downloader in
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        for name in ["a", "b"] {
                            group.addTask {
                                try await downloader.download(
                                    DownloadRequest(
                                        url: server.url("/\(name)"), destination: .file(directory + "/\(name)")),
                                    observing: { probe.record($0, of: name) }
                                )
                            }
                        }
                        try await group.waitForAll()
                    }
                }
                // Together the two downloads move 16 MB: at 2 MB/s that takes 8 s, never less. Their joint
                // rate over the last 5 s (past the bucket's first burst, and past a slow start on a machine
                // busy with the other tests) is the limit; bytes counted twice would halve it.
                let elapsed = (clock.now - start).secondsValue
                #expect(elapsed >= 8 * 0.95, "16 MB in \(elapsed) s")
                let measured = probe.rate(over: .seconds(5))
                #expect(abs(measured - Double(rate)) / Double(rate) < 0.05, "measured \(measured) B/s")
                for name in ["a", "b"] {
                    #expect(try readFile(directory + "/\(name)") == resources[name]?.content)
                }
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
