import HaulTestServer
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

@Suite(.timeLimit(.minutes(1)))
struct RetryTests {
    @Test func serviceUnavailableWithRetryAfterIsRetriedAfterTheAskedDelay() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "busy", size: 100_000)
            server.add("/f", resource)
            server.script("/f", [[.status(503, retryAfter: "1")], [.status(429, retryAfter: "0")]])
            try await withTemporaryDirectory { directory in
                let log = EventLog()
                let clock = ManualClock()
                let download = Task {
                    try await withDownloader(clock: clock) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")),
                            observing: log.record
                        )
                    }
                }
                // The 503 asked for one second: the download waits for exactly that on its clock, and
                // sends nothing more before the clock gets there.
                try await clock.waitForSleep(until: .seconds(1))
                #expect(server.requests(for: "/f").count == 1)
                clock.advance(by: .seconds(1))
                _ = try await download.value
                #expect(try readFile(directory + "/f") == resource.content)
                #expect(server.requests(for: "/f").count == 3)
                let delays = log.all.compactMap { event -> Duration? in
                    if case .retrying(_, let delay, _) = event { delay } else { nil }
                }
                #expect(delays == [.seconds(1), .seconds(0)])
                #expect(log.retries.map(\.status) == [503, 429])
            }
        }
    }

    @Test func stallIsRetriedFromTheStoredByte() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "stall", size: 600_000)
            server.add("/f", resource)
            server.script("/f", [[.stall(afterBytes: 300_000, seconds: 30)]])
            try await withTemporaryDirectory { directory in
                let log = EventLog()
                let clock = ManualClock()
                let download = Task {
                    try await withDownloader(testConfiguration(stall: .seconds(20)), clock: clock) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")),
                            observing: advancingRetries(clock, log)
                        )
                    }
                }
                // The server sent 300,000 bytes and went quiet; once they are stored, 20 s pass on the
                // download's clock with nothing more: a stall.
                try await waitUntil("the bytes before the stall are stored") {
                    log.progress.last?.bytes == 300_000
                }
                clock.advance(by: .seconds(20))
                let result = try await download.value
                #expect(try readFile(directory + "/f") == resource.content)
                #expect(log.retries.map(\.code) == [.timedOut])
                let second = try #require(server.requests(for: "/f").last)
                #expect(second.header("range") == "bytes=300000-")
                #expect(second.header("if-range") == resource.entityTagValue)
                // Every byte that reached Haul was stored and none was fetched twice.
                #expect(result.bytesFetched == 600_000)
            }
        }
    }

    @Test(arguments: [404, 403, 410, 401])
    func clientErrorsFailAtOnceWithTheStatus(status: Int) async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "gone", size: 1000))
            server.script("/f", [[.status(status)]])
            try await withTemporaryDirectory { directory in
                let error = await expectHaulError(.httpStatus) {
                    try await withDownloader { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")))
                    }
                }
                #expect(error?.status == status)
                #expect(error?.message.contains("\(status)") == true)
                #expect(server.requests(for: "/f").count == 1)
                // Nothing resumable was stored, so nothing is left behind.
                #expect(listDirectory(directory).isEmpty)

                // Named by the server's answer: the status is what the user hears about, not the name.
                try writeFile(directory + "/f", [1, 2, 3])
                server.script("/f", [[.status(status)]])
                let named = await expectHaulError(.httpStatus) {
                    try await withDownloader { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .directory(directory)))
                    }
                }
                #expect(named?.status == status)
                #expect(listDirectory(directory) == ["f"])
            }
        }
    }

    @Test func retriesRunOutWithTheLastError() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "down", size: 1000))
            server.setStandingFaults("/f", [.status(502)])
            try await withTemporaryDirectory { directory in
                let error = await expectHaulError(.httpStatus) {
                    try await withDownloader(testConfiguration(retries: 3)) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")))
                    }
                }
                #expect(error?.status == 502)
                #expect(error?.message.contains("gave up after 3 retries") == true)
                #expect(server.requests(for: "/f").count == 4)
            }
        }
    }

    @Test func refusedConnectionIsANetworkError() async throws {
        let refusing = try RefusingPort()
        defer { refusing.close() }
        let port = refusing.port
        try await withTemporaryDirectory { directory in
            let error = await expectHaulError(.network) {
                try await withDownloader(testConfiguration(retries: 1)) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: "http://127.0.0.1:\(port)/f", destination: .file(directory + "/f"))
                    )
                }
            }
            #expect(
                error?.message.hasPrefix("cannot connect to 127.0.0.1:\(port): connection refused") == true,
                "\(error?.message ?? "")")
            #expect(listDirectory(directory).isEmpty)
        }
    }

    @Test func manyDropsWithProgressStillComplete() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "flaky", size: 2_000_000)
            server.add("/f", resource)
            // More drops than retries allowed: each attempt stores bytes, which resets the count.
            server.script("/f", Array(repeating: [Fault.closeAfter(bytes: 150_000)], count: 12))
            try await withTemporaryDirectory { directory in
                try await withDownloader(testConfiguration(retries: 3)) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")))
                }
                #expect(try readFile(directory + "/f") == resource.content)
                let ranges = server.requests(for: "/f").dropFirst().compactMap { $0.header("range") }
                #expect(ranges.count == server.requests(for: "/f").count - 1)
            }
        }
    }
}
