import HaulTestServer
import Testing

@testable import Haul

/// A configuration for `connections` connections per file with small splits.
func segmentedConfiguration(connections: Int = 4, stall: Duration = .seconds(5)) -> DownloaderConfiguration {
    var configuration = testConfiguration(stall: stall)
    configuration.segmentation.connections = connections
    configuration.segmentation.minimumSplit = 256 * 1024
    configuration.segmentation.stallTakeover = .seconds(1)
    return configuration
}

/// Runs a download until `condition` holds, then cancels it (a pause with a durable checkpoint).
func downloadUntil(
    _ request: DownloadRequest, _ configuration: DownloaderConfiguration, _ condition: @escaping () throws -> Bool
) async throws {
    try await withDownloader(configuration) { downloader in
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await downloader.download(request) }
            while try !condition() { try await Task.sleep(for: .milliseconds(10)) }
            group.cancelAll()
            await #expect(throws: HaulError.self) { try await group.next() }
        }
    }
}

/// Starts a download of `path` throttled to `bytesPerSecond` per connection, pauses it once its stored
/// ranges satisfy `condition`, lifts the throttle and returns the manifest left behind.
func pauseWhenRanges(
    _ server: HaulTestServer, _ path: String, destination: String, bytesPerSecond: Int = 1 << 20,
    configuration: DownloaderConfiguration = segmentedConfiguration(),
    _ condition: @escaping ([Manifest.Segment]) -> Bool
) async throws -> Manifest {
    server.setStandingFaults(path, [.throttle(bytesPerSecond: bytesPerSecond)])
    let paths = try DownloadPaths.open(destination)
    try await downloadUntil(DownloadRequest(url: server.url(path), destination: .file(destination)), configuration) {
        condition((try? ManifestStore.load(paths))?.segments ?? [])
    }
    server.setStandingFaults(path, [])
    return try #require(try ManifestStore.load(paths))
}

@Suite("Several connections per file") struct SegmentedTests {
    @Test("the file arrives in ranges over several connections, byte-identical")
    func segmentedDownload() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "parts", size: 6 * 1024 * 1024 + 123)
                server.add("/parts", resource)
                server.setStandingFaults("/parts", [.throttle(bytesPerSecond: 2 << 20)])
                let destination = directory + "/parts"
                let result = try await withDownloader(segmentedConfiguration()) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/parts"), destination: .file(destination)))
                }
                #expect(try readFile(destination) == resource.content)
                #expect(result.bytes == resource.size)
                let requests = server.requests(for: "/parts")
                #expect(requests.first?.header("Range") == "bytes=0-")
                #expect(requests.count >= 4)
                for request in requests.dropFirst() {
                    let range = try #require(request.header("Range"))
                    #expect(range.hasPrefix("bytes=") && !range.hasSuffix("-"), "\(range)")
                    #expect(request.header("If-Range") == resource.entityTagValue)
                }
                // Four at a time, plus at most one whose range was cut short and is still closing.
                #expect((4...5).contains(server.maximumOpenConnections))
                #expect(listDirectory(directory) == ["parts"])
            }
        }
    }

    @Test("each connection of a fresh download asks for exactly its share of the file")
    func equalRangesAskedForExactly() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "thirds", size: 6 * 1024 * 1024 + 123)
                server.add("/thirds", resource)
                server.setStandingFaults("/thirds", [.throttle(bytesPerSecond: 2 << 20)])
                try await download(
                    server, "/thirds", to: directory + "/thirds",
                    configuration: segmentedConfiguration(connections: 3))
                #expect(try readFile(directory + "/thirds") == resource.content)
                // Thirds on 64 KiB boundaries: no request asks for more than its connection fetches
                // (which would cut it short, and close it) and none is left with twice the others' share.
                let ranges = server.requests(for: "/thirds").compactMap { $0.header("Range") }
                #expect(ranges.first == "bytes=0-")
                #expect(Set(ranges.dropFirst().prefix(2)) == ["bytes=2097152-4194303", "bytes=4194304-6291578"])
            }
        }
    }

    @Test("a request's own connection count replaces the downloader's, and progress reports the open ones")
    func requestChoosesItsConnections() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "own", size: 6 * 1024 * 1024 + 123)
                server.add("/own", resource)
                server.setStandingFaults("/own", [.throttle(bytesPerSecond: 2 << 20)])
                let log = EventLog()
                var request = DownloadRequest(url: server.url("/own"), destination: .file(directory + "/own"))
                request.connections = 3
                // The downloader's own setting is one connection, and no ramp: the request decides.
                try await withDownloader(segmentedConfiguration(connections: 1)) { downloader in
                    try await downloader.download(request, observing: log.record)
                }
                #expect(try readFile(directory + "/own") == resource.content)
                let ranges = server.requests(for: "/own").compactMap { $0.header("Range") }
                #expect(ranges.first == "bytes=0-")
                #expect(Set(ranges.dropFirst().prefix(2)) == ["bytes=2097152-4194303", "bytes=4194304-6291578"])
                #expect(log.progress.map(\.connections).max() == 3)
                #expect(log.progress.last?.connections == 0, "the last report comes once every connection ended")
            }
        }
    }

    @Test("a connection count out of range is refused before anything is sent", arguments: [0, 65])
    func connectionCountOutOfRange(connections: Int) async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                server.add("/never", TestResource(name: "never", size: 1000))
                var request = DownloadRequest(url: server.url("/never"), destination: .file(directory + "/never"))
                request.connections = connections
                let error = await expectHaulError(.invalidArgument) {
                    try await withDownloader { downloader in try await downloader.download(request) }
                }
                #expect(error?.message.contains("from 1 to 64") == true)
                #expect(server.requests.isEmpty)
                #expect(listDirectory(directory).isEmpty)
            }
        }
    }

    @Test("one connection is used when the server ignores ranges")
    func fallsBackToOneConnection() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "whole", size: 3 * 1024 * 1024)
                server.add("/whole", resource)
                server.setStandingFaults("/whole", [.ignoreRange])
                try await withDownloader(segmentedConfiguration()) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/whole"), destination: .file(directory + "/whole")))
                }
                #expect(try readFile(directory + "/whole") == resource.content)
                #expect(server.requests(for: "/whole").count == 1)
                #expect(server.maximumOpenConnections == 1)
            }
        }
    }

    @Test(
        "a version switch seen by one segment restarts the download; no mixed file",
        arguments: [HaulTestServer.Transport.plain, .tls])
    func versionSwitchOnOneSegment(transport: HaulTestServer.Transport) async throws {
        try await HaulTestServer.withRunning(transport: transport) { server in
            try await withTemporaryDirectory { directory in
                var resource = TestResource(name: "switching", size: 4 * 1024 * 1024)
                server.add("/switching", resource)
                server.setStandingFaults("/switching", [.throttle(bytesPerSecond: 2 << 20)])
                // The third request (a segment) finds version 2.
                server.script("/switching", [[], [], [.switchVersion(to: 2)]])
                let log = EventLog()
                try await download(
                    server, "/switching", to: directory + "/switching", log: log,
                    configuration: try reaching(server, segmentedConfiguration(), in: directory))
                resource.version = 2
                #expect(try readFile(directory + "/switching") == resource.content)
                #expect(log.restartKinds == ["remoteChanged"])
                expectHTTP2OverTLS(server)
            }
        }
    }

    @Test(
        "a connection that closes early is retried from where it stopped",
        arguments: [HaulTestServer.Transport.plain, .tls])
    func connectionClosesEarly(transport: HaulTestServer.Transport) async throws {
        try await HaulTestServer.withRunning(transport: transport) { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "dropped", size: 4 * 1024 * 1024)
                server.add("/dropped", resource)
                server.setStandingFaults("/dropped", [.throttle(bytesPerSecond: 2 << 20)])
                // The first answer (the first range, which no other connection's answer runs into) ends
                // after 100,000 bytes.
                server.script("/dropped", [[.closeAfter(bytes: 100_000)]])
                let log = EventLog()
                try await download(
                    server, "/dropped", to: directory + "/dropped", log: log,
                    configuration: try reaching(server, segmentedConfiguration(), in: directory))
                #expect(try readFile(directory + "/dropped") == resource.content)
                #expect(log.retries.count >= 1)
                #expect(log.restartKinds.isEmpty)
                // The rest of that range is asked for from where its stored bytes end (at the close,
                // unless the HTTP client dropped what it still held when the connection broke), with If-Range.
                let ranges = server.requests(for: "/dropped").map { $0.header("range") ?? "-" }
                let resumed = server.requests(for: "/dropped").dropFirst().filter { request in
                    guard let range = request.header("range"), let dash = range.firstIndex(of: "-"),
                        let start = Int(range.dropFirst("bytes=".count).prefix(upTo: dash))
                    else { return false }
                    return start > 0 && start <= 100_000
                }
                #expect(resumed.count == 1, "\(ranges)")
                #expect(resumed.first?.header("if-range") == resource.entityTagValue)
                expectHTTP2OverTLS(server)
            }
        }
    }

    @Test(
        "a stalled connection's range is taken over and the file completes long before the stall ends",
        arguments: [HaulTestServer.Transport.plain, .tls])
    func stalledRangeIsTakenOver(transport: HaulTestServer.Transport) async throws {
        try await HaulTestServer.withRunning(transport: transport) { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "stalled", size: 4 * 1024 * 1024)
                server.add("/stalled", resource)
                // The first answer is held to 4 MiB/s: unheld, it could bring the whole file before the
                // other connections start, and no range would be left to stall.
                server.script(
                    "/stalled", [[.throttle(bytesPerSecond: 4 << 20)], [.stall(afterBytes: 64 * 1024, seconds: 60)]])
                let log = EventLog()
                let clock = ManualClock()
                let configuration = try reaching(server, segmentedConfiguration(stall: .seconds(60)), in: directory)
                let transfer = Task {
                    try await download(
                        server, "/stalled", to: directory + "/stalled", log: log, configuration: configuration,
                        clock: clock)
                }
                // Every other byte arrives; the stalled range's last part (too small to halve) waits for
                // its connection, which sends nothing more.
                // Generous: 4 MiB in a debug build beside the whole suite on two cores.
                try await waitUntil("only the stalled range's rest is missing", timeout: .seconds(60)) {
                    let stored = log.progress.last?.bytes ?? 0
                    return stored > resource.size - 2 * 256 * 1024 && server.requests(for: "/stalled").count >= 5
                        && clock.sleeperCount > 0
                }
                // A second on the download's clock with no progress there: another connection takes it over.
                clock.advance(by: .seconds(1))
                _ = try await transfer.value
                #expect(try readFile(directory + "/stalled") == resource.content)
                #expect(clock.now.offset == .seconds(1), "the stall timeout of 60 s never had to pass")
                expectHTTP2OverTLS(server)
            }
        }
    }

    @Test("the manifest lists every range before a byte is written out of order")
    func rangesAreRecordedFirst() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "ordered", size: 8 * 1024 * 1024)
                server.add("/ordered", resource)
                server.setStandingFaults("/ordered", [.throttle(bytesPerSecond: 1 << 20)])
                let destination = directory + "/ordered"
                let paths = try DownloadPaths.open(destination)
                var configuration = segmentedConfiguration()
                // No periodic checkpoint during the test: what is on disk is what was stored up front.
                configuration.storage.checkpointInterval = .seconds(600)
                configuration.storage.durableCheckpointInterval = .seconds(600)
                try await downloadUntil(
                    DownloadRequest(url: server.url("/ordered"), destination: .file(destination)), configuration
                ) {
                    // Data lands past the first range: a later connection has written.
                    guard (fileSize(paths.partial) ?? 0) > 2 * 1024 * 1024 else { return false }
                    // Were the manifest one range, a killed process would come back trusting the file's
                    // size, holes included.
                    let manifest = try #require(try ManifestStore.load(paths))
                    #expect(manifest.segments.count == 4)
                    #expect(manifest.trustedBytes(currentBootID: BootIdentity.current, partialSize: 8 << 20) < 1 << 20)
                    return true
                }
            }
        }
    }

    @Test("an interrupted segmented download resumes every segment from its recorded offset")
    func resumesEverySegment() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "resumed", size: 6 * 1024 * 1024)
                server.add("/resumed", resource)
                let destination = directory + "/resumed"
                let manifest = try await pauseWhenRanges(server, "/resumed", destination: destination) { segments in
                    segments.count >= 4 && segments.allSatisfy { $0.written > 0 }
                }
                #expect(manifest.segments.count >= 4)
                let requestsBefore = server.requests(for: "/resumed").count
                let log = EventLog()
                try await withDownloader(segmentedConfiguration()) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/resumed"), destination: .file(destination)),
                        observing: log.record)
                }
                #expect(try readFile(destination) == resource.content)
                #expect(log.starts.first?.resumedFrom == manifest.segments.reduce(0) { $0 + $1.written })
                let ranges = Set(
                    server.requests(for: "/resumed").dropFirst(requestsBefore).compactMap { $0.header("Range") })
                for segment in manifest.segments where segment.start + segment.written < segment.end! {
                    #expect(ranges.contains { $0.hasPrefix("bytes=\(segment.start + segment.written)-") }, "\(ranges)")
                }
                #expect(log.restartKinds.isEmpty)
            }
        }
    }
}
