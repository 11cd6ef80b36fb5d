import HaulTestServer
import Synchronization
import Testing

@testable import Haul

/// How `task` ended, once it has (waiting in real time, at most 10 s): a task that would never end
/// fails the test rather than hang it.
private func ending<Value: Sendable>(_ task: Task<Value, any Error>) async throws -> Result<Value, any Error> {
    let outcome = Outcome<Value>()
    Task { outcome.set(await task.result) }
    // Generous: the whole suite runs beside it on two cores, with daemons of other tests.
    try await waitUntil("the task ended", timeout: .seconds(30)) { outcome.value != nil }
    return try #require(outcome.value)
}

private final class Outcome<Value: Sendable>: Sendable {
    private let result = Mutex<Result<Value, any Error>?>(nil)

    var value: Result<Value, any Error>? { result.withLock { $0 } }

    func set(_ value: Result<Value, any Error>) { result.withLock { $0 = value } }
}

@Suite("A cap on connections per host", .timeLimit(.minutes(1)))
struct HostConnectionCapTests {
    @Test(
        "over HTTP/1.1, six downloads from one host under a cap of 2 never have more than 2 connections open",
        arguments: [HaulTestServer.Transport.plain, .tlsHTTP1Only])
    func http1Downloads(transport: HaulTestServer.Transport) async throws {
        try await HaulTestServer.withRunning(transport: transport) { server in
            try await withTemporaryDirectory { directory in
                let resources = throttled(server, (0..<6).map { "capped\($0)" }, size: 200_000, rate: 1 << 20)
                var configuration = try reaching(server, testConfiguration(), in: directory)
                configuration.segmentation.connections = 1
                configuration.maxConnectionsPerHost = 2
                try await downloadAtOnce(server, resources, into: directory, configuration: configuration)
                #expect(server.maximumOpenConnections == 2)
                #expect(server.maximumRequestsAnswering == 2)
                #expect(server.requests.count == 6)
                #expect(server.requests.allSatisfy { $0.version == "HTTP/1.1" })
            }
        }
    }

    @Test("a segmented download under a cap of 1 runs over one connection, the first answer going on into every range")
    func segmentedUnderACapOfOne() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resources = throttled(server, ["ranges"], size: 2 * 1024 * 1024, rate: 4 << 20)
                var configuration = segmentedConfiguration(connections: 4)
                configuration.maxConnectionsPerHost = 1
                try await downloadAtOnce(server, resources, into: directory, configuration: configuration)
                #expect(server.maximumOpenConnections == 1)
                #expect(server.maximumRequestsAnswering == 1)
                #expect(server.requests.first?.header("Range") == "bytes=0-")
            }
        }
    }

    @Test("over HTTP/2 the cap counts connections: two segmented downloads share 2 of them, their ranges multiplexed")
    func http2CountsConnections() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            try await withTemporaryDirectory { directory in
                let resources = throttled(server, ["first", "second"], size: 4 * 1024 * 1024, rate: 2 << 20)
                var configuration = try trustingTestServer(segmentedConfiguration(connections: 4), in: directory)
                configuration.maxConnectionsPerHost = 2
                try await downloadAtOnce(server, resources, into: directory, configuration: configuration)
                #expect(server.requests.allSatisfy { $0.version == "HTTP/2" })
                #expect(server.maximumOpenConnections == 2)
                // More ranges at once than connections: streams are not capped.
                #expect(server.maximumRequestsAnswering > 2)
                #expect(Set(server.requests.map(\.connection)).count == 2)
            }
        }
    }

    @Test("a request waiting for a place is not stalled, however long it waits on the download's clock")
    func waitingIsNoStall() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "patient", size: 300_000)
                server.add("/patient", resource)
                let clock = ManualClock()
                let log = EventLog()
                var configuration = testConfiguration(stall: .seconds(30))
                configuration.maxConnectionsPerHost = 1
                try await withDownloader(configuration, clock: clock) { downloader in
                    let cap = try #require(downloader.hostCap)
                    let host = try DownloadURL(server.url("/patient")).origin
                    // Another request holds the only place.
                    let holder = try await cap.enter(host: host, connection: 0, mayMultiplex: false) {}
                    let transfer = Task {
                        try await downloader.download(
                            DownloadRequest(url: server.url("/patient"), destination: .file(directory + "/patient")),
                            observing: advancingRetries(clock, log))
                    }
                    // Waiting in line, the download has no stall deadline on its clock.
                    try await waitUntil("the download waits for a place with no timer set") {
                        cap.usage(of: host).waiting == 1 && clock.sleeperCount == 0
                    }
                    clock.advance(by: .seconds(600))
                    cap.leave(holder)
                    _ = try await ending(transfer).get()
                    #expect(try readFile(directory + "/patient") == resource.content)
                    #expect(log.retries.isEmpty)
                    #expect(server.requests.count == 1)
                    #expect(cap.usage(of: host) == (0, 0, 0))
                }
            }
        }
    }

    @Test("a download cancelled while it waits for a place leaves the line, and the next one gets the place")
    func cancelledWaiterLeaves() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resources = ["left", "next"].map { TestResource(name: $0, size: 100_000) }
                for resource in resources { server.add("/\(resource.name)", resource) }
                var configuration = testConfiguration()
                configuration.maxConnectionsPerHost = 1
                try await withDownloader(configuration) { downloader in
                    let cap = try #require(downloader.hostCap)
                    let host = try DownloadURL(server.url("/")).origin
                    let holder = try await cap.enter(host: host, connection: 0, mayMultiplex: false) {}
                    let request = { @Sendable (name: String) in
                        DownloadRequest(url: server.url("/\(name)"), destination: .file(directory + "/" + name))
                    }
                    let left = Task { try await downloader.download(request("left")) }
                    try await waitUntil("the first download waits") { cap.usage(of: host).waiting == 1 }
                    let next = Task { try await downloader.download(request("next")) }
                    try await waitUntil("both wait") { cap.usage(of: host).waiting == 2 }
                    // The first in line is paused: it leaves at once, holding nothing.
                    left.cancel()
                    let paused = await expectHaulError(.cancelled) { try await ending(left).get() }
                    #expect(paused != nil)
                    #expect(cap.usage(of: host) == (1, 1, 1))
                    cap.leave(holder)
                    _ = try await ending(next).get()
                    #expect(try readFile(directory + "/next") == resources[1].content)
                    #expect(server.requests.map(\.path) == ["/next"])
                    #expect(cap.usage(of: host) == (0, 0, 0))
                }
            }
        }
    }
}

@Suite("The line for connections to a host", .timeLimit(.minutes(1)))
struct HostConnectionLineTests {
    /// Enters `cap` in a task of its own, behind `ahead` waiters, and waits until it is in line.
    private func enter(
        _ cap: HostConnectionCap, connection: Int, mayMultiplex: Bool = false, behind ahead: Int
    ) async throws -> Task<HostConnectionCap.Pass, any Error> {
        let task = Task {
            try await cap.enter(host: "https://h:443", connection: connection, mayMultiplex: mayMultiplex) {}
        }
        try await waitUntil("\(ahead + 1) wait") { cap.usage(of: "https://h:443").waiting == ahead + 1 }
        return task
    }

    @Test("over HTTP/1.1 requests beyond the cap wait, first come first served, and go through the first client")
    func firstComeFirstServed() async throws {
        let cap = HostConnectionCap(limit: 2)
        let first = try await cap.enter(host: "https://h:443", connection: 3, mayMultiplex: false) {}
        let second = try await cap.enter(host: "https://h:443", connection: 1, mayMultiplex: false) {}
        #expect([first.lane, second.lane] == [0, 0] && first.holdsPlace && second.holdsPlace)
        let third = try await enter(cap, connection: 2, behind: 0)
        let fourth = try await enter(cap, connection: 0, behind: 1)
        cap.leave(second)
        let admitted = try await ending(third).get()
        #expect(cap.usage(of: "https://h:443") == (2, 2, 1), "the fourth still waits")
        cap.leave(first)
        cap.leave(admitted)
        cap.leave(try await ending(fourth).get())
        #expect(cap.usage(of: "https://h:443") == (0, 0, 0))
    }

    @Test("until a host's first answer tells its protocol one request goes; over HTTP/2 the rest go at once")
    func oneAtATimeUntilHTTP2IsKnown() async throws {
        let cap = HostConnectionCap(limit: 2)
        let probe = try await cap.enter(host: "https://h:443", connection: 0, mayMultiplex: true) {}
        let waiting = [
            try await enter(cap, connection: 1, mayMultiplex: true, behind: 0),
            try await enter(cap, connection: 2, mayMultiplex: true, behind: 1),
            try await enter(cap, connection: 3, mayMultiplex: true, behind: 2),
        ]
        // The answer came over HTTP/2: the probe holds no place, and every waiter goes, connection k
        // over the client k modulo the cap.
        let answered = cap.answered(probe, multiplexed: true)
        #expect(!answered.holdsPlace)
        var lanes: [Int] = []
        for task in waiting { lanes.append(try await ending(task).get().lane) }
        #expect(lanes == [1, 0, 1])
        #expect(cap.usage(of: "https://h:443") == (0, 4, 0))
    }

    @Test("a task cancelled in line, or before it, leaves no trace")
    func cancelledInLine() async throws {
        let cap = HostConnectionCap(limit: 1)
        let holder = try await cap.enter(host: "https://h:443", connection: 0, mayMultiplex: false) {}
        let waiter = try await enter(cap, connection: 0, behind: 0)
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await ending(waiter).get() }
        let early = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await cap.enter(host: "https://h:443", connection: 0, mayMultiplex: false) {}
        }
        await #expect(throws: CancellationError.self) { try await ending(early).get() }
        #expect(cap.usage(of: "https://h:443") == (1, 1, 0))
        cap.leave(holder)
        #expect(cap.usage(of: "https://h:443") == (0, 0, 0))
    }
}
