import HaulTestServer
import Testing

@testable import Haul

/// Servers that refuse range requests or tell them to come back much later (hosts allowing one
/// connection per client, CDNs): a download finishes on what works, or fails at once with the data
/// kept. Never a wait without end.
///
/// The downloads run on a clock that never moves: any wait for a `Retry-After` (or a backoff) would
/// hang until the suite's time limit, so a passing test shows that none happened.
@Suite(.timeLimit(.minutes(1)))
struct RefusedRangesTests {
    static let size: Int64 = 3 * 1024 * 1024 + 77

    func configuration(connections: Int) -> DownloaderConfiguration {
        var configuration = testConfiguration()
        configuration.segmentation.connections = connections
        configuration.segmentation.minimumSplit = 256 * 1024
        return configuration
    }

    @Test(arguments: [1, 4])
    func aServerRefusingEveryRangeForADayIsServedByOnePlainRequest(connections: Int) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "no-ranges", size: Self.size)
            server.add("/f", resource)
            server.setStandingFaults("/f", [.refuseRanges(status: 503, retryAfter: "86400", sparingFromStart: false)])
            try await withTemporaryDirectory { directory in
                let log = EventLog()
                let clock = ManualClock()
                try await download(
                    server, to: directory + "/f", log: log, configuration: configuration(connections: connections),
                    clock: clock)
                #expect(try readFile(directory + "/f") == resource.content)
                // One connection asks without a range; several ask for bytes=0- first, and on the refusal
                // ask again without one, at once.
                let ranges = server.requests(for: "/f").map { $0.header("range") }
                #expect(ranges == (connections == 1 ? [nil] : ["bytes=0-", nil]))
                #expect(log.retries.isEmpty && clock.requestedSleeps.allSatisfy { $0 <= .seconds(30) })
            }
        }
    }

    @Test func whenOnlyTheFirstRequestIsServedItFetchesTheWholeFileWhileTheOthersRetire() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "first-only", size: Self.size)
            server.add("/f", resource)
            server.setStandingFaults(
                "/f",
                [
                    .throttle(bytesPerSecond: 4 << 20),
                    .refuseRanges(status: 503, retryAfter: "86400", sparingFromStart: true),
                ])
            try await withTemporaryDirectory { directory in
                let log = EventLog()
                let result = try await download(
                    server, to: directory + "/f", log: log, configuration: configuration(connections: 4),
                    clock: ManualClock())
                #expect(try readFile(directory + "/f") == resource.content)
                let requests = server.requests(for: "/f")
                #expect(requests.first?.header("range") == "bytes=0-")
                // The other three asked for ranges, were told to wait a day, and left; the first answer
                // went on through their ranges: every byte came over the network once. (A connection
                // whose range the first answer reached before its refusal came asks for another once.)
                #expect((4...7).contains(requests.count), "\(requests.count) requests")
                #expect(requests.dropFirst().allSatisfy { $0.header("range")?.hasPrefix("bytes=") == true })
                #expect(result.bytesFetched == Self.size)
                #expect(server.bodyBytesSent(answering: 0) == Self.size)
                #expect(log.retries.isEmpty && log.restartReasons.isEmpty)
            }
        }
    }

    @Test(arguments: [1, 4])
    func whenEveryRequestNeedsARangeTheDownloadFailsAtOnceWithItsDataKept(connections: Int) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "resume-refused", size: Self.size)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, destination: destination, bytes: 1_000_000)
                server.setStandingFaults(
                    "/f", [.refuseRanges(status: 503, retryAfter: "86400", sparingFromStart: false)])
                let error = await expectHaulError(.httpStatus) {
                    try await download(
                        server, to: destination, configuration: configuration(connections: connections),
                        clock: ManualClock())
                }
                #expect(error?.status == 503)
                #expect(error?.message.contains("asked to retry after 86400 s, longer than allowed") == true)
                // The stored bytes stay for a later resume.
                #expect(fileSize(destination + ".haul.part") == stored)
                #expect(fileExists(destination + ".haul.json"))
                #expect(server.requests(for: "/f").dropFirst().allSatisfy { $0.header("range") == "bytes=\(stored)-" })
            }
        }
    }
}
