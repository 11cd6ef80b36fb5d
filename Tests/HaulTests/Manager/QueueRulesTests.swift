import HaulTestServer
import Testing

@testable import Haul

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Schedules and rules: windows by the day and time, on the manager's clock; rules by site and by
/// kind of file when downloads are added.
@Suite(.timeLimit(.minutes(1)))
struct QueueRulesTests {
    static let utc = TimeZone(identifier: "UTC")!

    /// Monday 2026-11-23 at `hour`:`minute`:`second` UTC.
    static func monday(_ hour: Int, _ minute: Int, _ second: Int = 0) -> Date {
        Date(timeIntervalSince1970: 1_795_392_000 + Double(hour * 3600 + minute * 60 + second))
    }

    /// Moves `clock` on by `step` until `condition` holds: the manager's tick may not sleep yet when
    /// the clock first moves.
    static func step(
        _ clock: ManualClock, by step: Duration = .milliseconds(100), until what: String,
        _ condition: @Sendable () async throws -> Bool
    ) async throws {
        let deadline = ContinuousClock.now + .seconds(20)
        while try await !condition() {
            guard ContinuousClock.now < deadline else { throw TestFailure("timed out waiting until \(what)") }
            clock.advance(by: step)
            try await Task.sleep(for: .milliseconds(5))
        }
    }

    static func rules(_ json: String) throws -> QueueRules {
        try JSONDecoder().decode(QueueRules.self, from: Data(json.utf8))
    }

    @Test func windowsHoldOnTheirDaysAndRunPastMidnight() throws {
        #expect(Calendar(identifier: .gregorian).dateComponents(in: Self.utc, from: Self.monday(0, 0)).weekday == 2)
        let rules = try Self.rules(
            #"""
            {"speedLimits": [{"days": ["mon"], "from": "09:00", "to": "18:00", "limitRate": 1000},
                             {"from": "17:00", "to": "19:00", "limitRate": 500},
                             {"days": ["mon"], "from": "22:00", "to": "06:00", "limitRate": 7}],
             "startWindows": [{"days": ["tue"], "from": "01:00", "to": "07:00"}]}
            """#)
        try rules.check()
        func limit(_ date: Date) -> Int64? { rules.now(at: date, in: Self.utc).bytesPerSecond }
        #expect(limit(Self.monday(8, 59, 59)) == nil)
        #expect(limit(Self.monday(9, 0)) == 1000)
        // Where two hold, the lower.
        #expect(limit(Self.monday(17, 30)) == 500)
        #expect(limit(Self.monday(18, 30)) == 500)
        #expect(limit(Self.monday(19, 0)) == nil)
        // Monday night runs into Tuesday morning, and no further.
        #expect(limit(Self.monday(23, 0)) == 7)
        #expect(limit(Self.monday(24 + 5, 59)) == 7)
        #expect(limit(Self.monday(24 + 6, 0)) == nil)
        #expect(limit(Self.monday(0, 30)) == nil, "Sunday night is not Monday's")
        // Starts only on Tuesday between 01:00 and 07:00.
        #expect(!rules.now(at: Self.monday(2, 0), in: Self.utc).startsDownloads)
        #expect(rules.now(at: Self.monday(24 + 2, 0), in: Self.utc).startsDownloads)
        #expect(!rules.now(at: Self.monday(24 + 7, 0), in: Self.utc).startsDownloads)
        // Written back as read.
        let again = try JSONDecoder().decode(QueueRules.self, from: JSONEncoder().encode(rules))
        #expect(again == rules)
    }

    @Test func rulesThatCannotHoldAreRefused() throws {
        for json in [
            #"{"speedLimits": [{"from": "25:00", "to": "18:00", "limitRate": 1}]}"#,
            #"{"speedLimits": [{"from": "9:5", "to": "18:00", "limitRate": 1}]}"#,
            #"{"startWindows": [{"days": ["someday"], "from": "01:00", "to": "02:00"}]}"#,
            #"{"startWindows": null}"#, #"{"sites": [{"host": "x", "connections": null}]}"#,
        ] {
            #expect(throws: DecodingError.self, "\(json)") { try Self.rules(json) }
        }
        for json in [
            #"{"speedLimits": [{"from": "09:00", "to": "18:00", "limitRate": 0}]}"#,
            #"{"sites": [{"host": ""}]}"#, #"{"sites": [{"host": "a/b"}]}"#,
            #"{"sites": [{"host": "x", "connections": 0}]}"#,
            #"{"sites": [{"host": "x", "headers": [{"name": "Range", "value": "bytes=0-"}]}]}"#,
            #"{"sites": [{"host": "x", "directory": "../up"}]}"#,
            #"{"sites": [{"host": "x", "headers": [{"name": "Authorization", "value": "Bearer t"}]}]}"#,
            #"{"categories": [{"name": "none", "extensions": [], "directory": "x"}]}"#,
        ] {
            #expect(throws: HaulError.self, "\(json)") { try Self.rules(json).check() }
        }
    }

    @Test func siteAndFileRulesFillWhatARequestLeavesOpen() throws {
        let rules = try Self.rules(
            #"""
            {"sites": [{"host": "*.example.com", "connections": 2, "limitRate": 9000,
                        "headers": [{"name": "X-Team", "value": "media"}, {"name": "User-Agent", "value": "rule"}],
                        "directory": "example"}],
             "categories": [{"name": "Disk images", "extensions": ["ISO", "img"], "directory": "/srv/images"},
                            {"name": "Video", "extensions": ["mkv"], "directory": "video"}]}
            """#)
        try rules.check()
        var own = DownloadRequest(url: "https://cdn.example.com/a.iso", destination: .directory("/d"), connections: 5)
        own.headers = [("user-agent", "mine")]
        let site = rules.applied(to: own)
        #expect(site.connections == 5 && site.bytesPerSecondLimit == 9000)
        #expect(site.headers.map(\.name) == ["user-agent", "X-Team"])
        // The site's folder comes before the file's category.
        #expect(site.destination == .directory("/d/example"))
        #expect(rules.applied(to: own).headers.count == 2)
        let bare = rules.applied(to: DownloadRequest(url: "http://EXAMPLE.com/x", destination: .directory("/d")))
        #expect(bare.connections == 2 && bare.destination == .directory("/d/example"))
        // Another site: only the category, by the URL's extension in any case.
        let image = rules.applied(
            to: DownloadRequest(url: "http://other.org/disk.IMG?x=1", destination: .directory("/d")))
        #expect(image.destination == .directory("/srv/images") && image.connections == nil && image.headers.isEmpty)
        let video = rules.applied(to: DownloadRequest(url: "http://other.org/film.mkv", destination: .directory("/d")))
        #expect(video.destination == .directory("/d/video"))
        // A file named by the request stays where it was asked to go.
        let named = rules.applied(to: DownloadRequest(url: "http://other.org/film.mkv", destination: .file("/d/f")))
        #expect(named.destination == .file("/d/f"))
        #expect(
            rules.applied(to: DownloadRequest(url: "http://notexample.com/a", destination: .directory("/d")))
                .destination
                == .directory("/d"))
    }

    @Test func aQueueAddsWithTheRules() async throws {
        try await withTemporaryDirectory { directory in
            var configuration = managerConfiguration()
            configuration.rules = try Self.rules(
                #"{"categories": [{"name": "Archives", "extensions": ["zip"], "directory": "archives"}]}"#)
            try await withManager(directory + "/state", configuration) { manager in
                let id = try await manager.enqueue(
                    DownloadRequest(url: "http://127.0.0.1:9/a.zip", destination: .directory(directory)))
                #expect(await manager.download(id)?.request.destination == .directory(directory + "/archives"))
            }
        }
    }

    @Test func aSpeedWindowChangesTheTotalLimitAsTheClockCrossesItsEdges() async throws {
        try await withTemporaryDirectory { directory in
            let clock = ManualClock()
            var configuration = managerConfiguration()
            configuration.timeZone = Self.utc
            configuration.startDate = Self.monday(8, 59, 30)
            configuration.bytesPerSecondLimit = 200_000
            configuration.rules = try Self.rules(
                #"{"speedLimits": [{"days": ["mon"], "from": "09:00", "to": "18:00", "limitRate": 50000}]}"#)
            try await withManager(directory + "/state", configuration, clock: clock) { manager in
                let limiter = manager.rateLimiter
                try await whileRunning(manager) {
                    #expect(limiter.bytesPerSecond == 200_000)
                    // The next tick past 09:00 takes the window's limit, in the same limiter.
                    clock.advance(by: .seconds(30))
                    try await Self.step(clock, until: "the window's limit holds") {
                        await manager.rulesInForce.bytesPerSecond == 50_000
                    }
                    #expect(limiter.bytesPerSecond == 50_000)
                    // A limit set meanwhile waits for the window's end.
                    await manager.setBytesPerSecondLimit(300_000)
                    #expect(limiter.bytesPerSecond == 50_000)
                    clock.advance(by: .seconds(9 * 3600))
                    try await Self.step(clock, until: "the window closed") {
                        await manager.rulesInForce.bytesPerSecond == nil
                    }
                    #expect(limiter.bytesPerSecond == 300_000)
                }
            }
        }
    }

    @Test func anIdleQueueEndsItsRunOutsideTheStartWindows() async throws {
        try await withTemporaryDirectory { directory in
            var configuration = managerConfiguration()
            configuration.timeZone = Self.utc
            configuration.startDate = Self.monday(12, 0)
            configuration.rules = try Self.rules(#"{"startWindows": [{"from": "01:00", "to": "07:00"}]}"#)
            try await withManager(directory + "/state", configuration, clock: ManualClock()) { manager in
                // Nothing to wait for: it returns (it used to wait for the window).
                await manager.runUntilIdle()
                #expect(await manager.rulesInForce.startsDownloads == false)
            }
        }
    }

    @Test func downloadsRunOnlyInsideStartWindows() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "night", size: 3_000_000)
            server.add("/night", resource)
            server.setStandingFaults("/night", [.throttle(bytesPerSecond: 1_000_000)])
            try await withTemporaryDirectory { directory in
                let clock = ManualClock()
                var configuration = managerConfiguration()
                configuration.timeZone = Self.utc
                configuration.startDate = Self.monday(0, 59, 50)
                configuration.rules = try Self.rules(#"{"startWindows": [{"from": "01:00", "to": "07:00"}]}"#)
                var downloader = testConfiguration()
                downloader.segmentation.connections = 1
                try await withManager(directory + "/state", configuration, downloader: downloader, clock: clock) {
                    manager in
                    try await whileRunning(manager) {
                        let id = try await manager.enqueue(
                            DownloadRequest(url: server.url("/night"), destination: .file(directory + "/night")))
                        // Outside the window: queued, nothing asked of the server, tick after tick.
                        try await Self.step(clock, by: .milliseconds(1000), until: "00:59:59") {
                            clock.now.offset >= .seconds(9)
                        }
                        #expect(await manager.download(id)?.state == .queued)
                        #expect(server.requests(for: "/night").isEmpty)
                        // 01:00: it starts.
                        try await Self.step(clock, until: "it runs") {
                            await manager.download(id)?.state == .running
                        }
                        _ = try await waitFor(manager, id) { $0.state == .running && $0.bytes > 0 }
                        // 07:00: it stops with its data kept, queued for the next window.
                        clock.advance(by: .seconds(6 * 3600))
                        try await Self.step(clock, until: "it waits") { await manager.download(id)?.state == .queued }
                        let stopped = try #require(await manager.download(id))
                        #expect(stopped.bytes > 0 && stopped.bytes < 3_000_000)
                        let asked = server.requests(for: "/night").count
                        // Tuesday 01:00: it goes on from the stored byte and completes.
                        server.setStandingFaults("/night", [])
                        clock.advance(by: .seconds(18 * 3600))
                        try await Self.step(clock, until: "it completes") {
                            await manager.download(id)?.state == .completed
                        }
                        #expect(try readFile(directory + "/night") == resource.content)
                        let resumed = try #require(server.requests(for: "/night").dropFirst(asked).first)
                        #expect(resumed.header("range") == "bytes=\(stopped.bytes)-")
                    }
                }
            }
        }
    }
}
