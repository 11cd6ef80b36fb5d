import HaulTestServer
import Synchronization
import Testing

@testable import Haul
@testable import HaulURLSession

/// The transports every scenario of ``TransportSuiteTests`` runs with.
enum TransportKind: String, CaseIterable, CustomTestStringConvertible, Sendable {
    /// Haul's own client on SwiftNIO.
    case haul
    /// `URLSessionTransport` with data tasks.
    case urlSession
    /// `URLSessionTransport` with download tasks: each body arrives as a file.
    case urlSessionFiles

    var testDescription: String { rawValue }

    /// `configuration` with this transport; download tasks leave their bodies in `bodies`.
    func configure(_ configuration: DownloaderConfiguration, bodies: String) -> DownloaderConfiguration {
        var configuration = configuration
        switch self {
        case .haul: configuration.transport = nil
        case .urlSession: configuration.transport = URLSessionTransport()
        case .urlSessionFiles: configuration.transport = URLSessionTransport(mode: .files(directory: bodies))
        }
        return configuration
    }
}

/// The scenarios of a download that depend on how its requests are sent, run with each transport:
/// whichever sends the requests, Haul asks for the right ranges, checks every answer and never
/// splices two versions of a file. The first, interrupted session of a resume runs on Haul's own
/// client; what is tested runs on the transport.
@Suite(.timeLimit(.minutes(1)))
struct TransportSuiteTests {
    /// Runs `body` with a directory for the downloads and `configure`, which gives a configuration
    /// the transport; afterwards no body file of a download task is left behind.
    private func withTransport(
        _ kind: TransportKind,
        _ body: (_ directory: String, _ configure: (DownloaderConfiguration) -> DownloaderConfiguration) async throws
            -> Void
    ) async throws {
        try await withTemporaryDirectory { bodies in
            try await withTemporaryDirectory { directory in
                try await body(directory) { kind.configure($0, bodies: bodies) }
            }
            #expect(listDirectory(bodies).isEmpty)
        }
    }

    @Test(arguments: TransportKind.allCases)
    func aResumeAsksForTheRestWithIfRange(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "resume", size: 500_000)
            server.add("/f", resource)
            try await withTransport(kind) { directory, configure in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, destination: destination, bytes: 200_000)
                let result = try await download(
                    server, to: destination, configuration: configure(testConfiguration()))
                #expect(try readFile(destination) == resource.content)
                #expect(result.resumedFrom == stored)
                #expect(result.bytesFetched == resource.size - stored)
                let second = server.requests(for: "/f")[1]
                #expect(second.header("range") == "bytes=\(stored)-")
                #expect(second.header("if-range") == resource.entityTagValue)
                #expect(second.header("accept-encoding") == "identity")
                // Sent by the transport under test: URLSession adds an Accept-Language of its own.
                #expect((second.header("accept-language") != nil) == (kind != .haul))
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func aChangedFileStartsAgainFromItsFirstByte(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "changing", size: 500_000))
            try await withTransport(kind) { directory, configure in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, destination: destination, bytes: 200_000)
                let old = try #require(server.resource("/f"))
                server.update("/f") { $0.version = 2 }
                let log = EventLog()
                try await download(server, to: destination, log: log, configuration: configure(testConfiguration()))
                let new = try #require(server.resource("/f"))
                #expect(try readFile(destination) == new.content)
                #expect(new.content != old.content)
                let second = server.requests(for: "/f")[1]
                #expect(second.header("range") == "bytes=\(stored)-")
                #expect(second.header("if-range") == old.entityTagValue)
                #expect(log.restartKinds == ["remoteChanged"], "\(log.restartReasons)")
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func aWholeFileAnsweringARangeReplacesWhatWasStored(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "ignore", size: 300_000)
            server.add("/f", resource)
            try await withTransport(kind) { directory, configure in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, destination: destination, bytes: 100_000)
                server.script("/f", [[.ignoreRange]])
                let log = EventLog()
                try await download(server, to: destination, log: log, configuration: configure(testConfiguration()))
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests(for: "/f")[1].header("range") == "bytes=\(stored)-")
                #expect(log.restartReasons == [.rangeIgnored])
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func aWrongContentRangeIsNeverSpliced(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "wrong-range", size: 300_000)
            server.add("/f", resource)
            try await withTransport(kind) { directory, configure in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, destination: destination, bytes: 100_000)
                server.script("/f", [[.wrongContentRange(shift: 100)]])
                let log = EventLog()
                try await download(server, to: destination, log: log, configuration: configure(testConfiguration()))
                #expect(try readFile(destination) == resource.content)
                let requests = server.requests(for: "/f")
                #expect(requests.count == 3)
                #expect(requests[1].header("range") == "bytes=\(stored)-")
                #expect(requests[2].header("range") == nil)
                #expect(log.restartKinds == ["invalidContentRange"], "\(log.restartReasons)")
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func rangeNotSatisfiableStartsAgain(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "bare-416", size: 300_000)
            server.add("/f", resource)
            try await withTransport(kind) { directory, configure in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, destination: destination, bytes: 100_000)
                server.script("/f", [[.status(416)]])
                try await download(server, to: destination, configuration: configure(testConfiguration()))
                #expect(try readFile(destination) == resource.content)
                let requests = server.requests(for: "/f")
                #expect(requests.count == 3)
                #expect(requests[1].header("range") == "bytes=\(stored)-")
                #expect(requests[2].header("range") == nil)
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func aShortBodyIsNeverReportedComplete(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "short", size: 200_000)
            server.add("/f", resource)
            server.script("/f", [[.shortBody(missing: 10)]])
            try await withTransport(kind) { directory, configure in
                let destination = directory + "/f"
                try await withDownloader(configure(testConfiguration(retries: 0))) { downloader in
                    await expectHaulError(.network) {
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(destination)))
                    }
                }
                #expect(!fileExists(destination))
                // A data task keeps what arrived; a download task's file of a cut-short body is dropped.
                let stored = fileSize(destination + ".haul.part") ?? 0
                #expect(stored <= 199_990)
                if kind != .urlSessionFiles { #expect(stored > 0) }
                try await download(server, to: destination, configuration: configure(testConfiguration()))
                #expect(try readFile(destination) == resource.content)
                let second = server.requests(for: "/f")[1]
                #expect(second.header("range") == (stored > 0 ? "bytes=\(stored)-" : nil))
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func redirectsAreFollowedByHaulAndCredentialsStayWithTheirOrigin(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { origin in
            try await HaulTestServer.withRunning { other in
                let resource = TestResource(name: "elsewhere", size: 10_000)
                other.add("/file", resource)
                origin.add("/same", .redirect(to: "/start", status: 301))
                origin.add("/start", .redirect(to: other.url("/file"), status: 307))
                try await withTransport(kind) { directory, configure in
                    let request = DownloadRequest(
                        url: origin.url("/same"), destination: .file(directory + "/f"),
                        headers: [("Authorization", "Bearer secret"), ("X-Trace", "kept")])
                    try await withDownloader(configure(testConfiguration())) { downloader in
                        try await downloader.download(request)
                    }
                    #expect(try readFile(directory + "/f") == resource.content)
                    #expect(origin.requests.map(\.path) == ["/same", "/start"])
                    for request in origin.requests { #expect(request.header("authorization") == "Bearer secret") }
                    let final = try #require(other.requests.first)
                    #expect(other.requests.count == 1)
                    #expect(final.header("authorization") == nil)
                    #expect(final.header("x-trace") == "kept")
                }
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func aBodyCorruptedOnTheWayIsCaughtByItsDigestAndFetchedAgain(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "corrupt", size: 800_000, reprDigest: true)
            server.add("/f", resource)
            server.script("/f", [[.corruptByte(at: 654_321)]])
            try await withTransport(kind) { directory, configure in
                let log = EventLog()
                try await withDownloader(configure(testConfiguration())) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")),
                        observing: log.record)
                }
                #expect(try readFile(directory + "/f") == resource.content)
                #expect(log.restartKinds == ["digestMismatch"])
                #expect(server.requests.map { $0.header("range") } == [nil, nil])
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func aWrongChecksumKeepsNothingUnderTheFinalName(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "checked", size: 300_000)
            server.add("/f", resource)
            try await withTransport(kind) { directory, configure in
                let destination = directory + "/f"
                var request = DownloadRequest(url: server.url("/f"), destination: .file(destination))
                request.checksum = sha256(Array(repeating: 1, count: 4))
                try await withDownloader(configure(testConfiguration())) { downloader in
                    await expectHaulError(.checksumMismatch) { try await downloader.download(request) }
                    #expect(!fileExists(destination))
                    request.checksum = sha256(resource.content)
                    try await downloader.download(request)
                }
                #expect(try readFile(destination) == resource.content)
            }
        }
    }

    @Test(arguments: TransportKind.allCases)
    func aFileArrivesInRangesOverSeveralConnections(kind: TransportKind) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "parts", size: 6 * 1024 * 1024 + 123)
            server.add("/parts", resource)
            server.setStandingFaults("/parts", [.throttle(bytesPerSecond: 2 << 20)])
            try await withTransport(kind) { directory, configure in
                let destination = directory + "/parts"
                let request = DownloadRequest(url: server.url("/parts"), destination: .file(destination))
                try await withDownloader(configure(segmentedConfiguration())) { downloader in
                    guard kind != .urlSessionFiles else {
                        // A download task fetches the whole answer before Haul sees any of it.
                        let error = await expectHaulError(.invalidArgument) { try await downloader.download(request) }
                        #expect(error?.message.contains("connections to 1") == true)
                        #expect(server.requests.isEmpty)
                        return
                    }
                    let result = try await downloader.download(request)
                    #expect(try readFile(destination) == resource.content)
                    #expect(result.bytes == resource.size)
                    let requests = server.requests(for: "/parts")
                    #expect(requests.first?.header("range") == "bytes=0-")
                    #expect(requests.count >= 4)
                    for request in requests.dropFirst() {
                        let range = try #require(request.header("range"))
                        #expect(range.hasPrefix("bytes=") && !range.hasSuffix("-"), "\(range)")
                        #expect(request.header("if-range") == resource.entityTagValue)
                    }
                    #expect(server.maximumRequestsAnswering(for: "/parts") >= 2)
                    #expect(listDirectory(directory) == ["parts"])
                }
            }
        }
    }

    /// Settings URLSession takes from elsewhere are refused with a clear error before anything is
    /// sent, never silently dropped; so is a download that asks download tasks for several connections.
    @Test func settingsURLSessionCannotHonourAreRefusedBeforeAnythingIsSent() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "refused", size: 4 << 20))
            server.setStandingFaults("/f", [.throttle(bytesPerSecond: 4 << 20)])
            try await withTemporaryDirectory { directory in
                let changes: [(String, @Sendable (inout DownloaderConfiguration) -> Void)] = [
                    ("proxy", { $0.proxy.http = Proxy(kind: .http, host: "127.0.0.1", port: 3128) }),
                    ("trusts what the system trusts", { $0.tls.trustedCertificateFiles = ["/tmp/ca.pem"] }),
                    ("HTTP/1.1", { $0.tls.allowHTTP2 = false }),
                ]
                for (words, change) in changes {
                    var configuration = testConfiguration()
                    change(&configuration)
                    configuration.transport = URLSessionTransport()
                    let error = await expectHaulError(.invalidArgument) {
                        try await download(server, to: directory + "/f", configuration: configuration)
                    }
                    #expect(error?.message.contains(words) == true, "\(error?.message ?? "")")
                }
                var request = DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f"))
                request.connections = 2
                let error = await expectHaulError(.invalidArgument) {
                    try await withDownloader(
                        TransportKind.urlSessionFiles.configure(testConfiguration(), bodies: directory)
                    ) { downloader in try await downloader.download(request) }
                }
                #expect(error?.message.contains("one connection") == true, "\(error?.message ?? "")")
                #expect(server.requests(for: "/f").map { $0.header("range") } == ["bytes=0-"])
                #expect(!fileExists(directory + "/f"))
            }
        }
    }

    /// A refused connection says so, and is not retried when refusals are not to be.
    @Test(arguments: [TransportKind.urlSession, .urlSessionFiles])
    func aRefusedConnectionIsReportedAsOne(kind: TransportKind) async throws {
        let refusing = try RefusingPort()
        defer { refusing.close() }
        try await withTransport(kind) { directory, configure in
            var configuration = configure(testConfiguration(retries: 5))
            configuration.retry.retriesRefusedConnections = false
            let log = EventLog()
            let error = await expectHaulError(.network) {
                try await withDownloader(configuration) { downloader in
                    try await downloader.download(
                        DownloadRequest(
                            url: "http://127.0.0.1:\(refusing.port)/f", destination: .file(directory + "/f")),
                        observing: log.record)
                }
            }
            #expect(error?.message.hasPrefix("cannot connect to 127.0.0.1:\(refusing.port)") == true)
            #expect(log.retries.isEmpty)
        }
    }

    /// A download task's body goes to a file Haul cannot see until it is complete: the transport
    /// tells the download that bytes arrive, so a body longer than the stall timeout is no stall.
    @Test func aDownloadTaskLongerThanTheStallTimeoutIsNotTakenForAStall() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "slow", size: 2 << 20)
            server.add("/f", resource)
            server.setStandingFaults("/f", [.throttle(bytesPerSecond: 1 << 20)])
            try await withTransport(.urlSessionFiles) { directory, configure in
                let clock = ManualClock()
                let log = EventLog()
                // Time on the download's clock runs ten times faster than on the wall: the body takes
                // about 20 s of it, four times the stall timeout.
                let ticking = Task {
                    while !Task.isCancelled {
                        try? await Task.sleep(for: .milliseconds(20))
                        clock.advance(by: .milliseconds(200))
                    }
                }
                defer { ticking.cancel() }
                try await download(
                    server, to: directory + "/f", log: log,
                    configuration: configure(testConfiguration(retries: 0, stall: .seconds(5))), clock: clock)
                #expect(try readFile(directory + "/f") == resource.content)
                #expect(server.requests(for: "/f").count == 1)
                #expect(log.retries.isEmpty)
            }
        }
    }

    /// Starts a download of `path` (1,000,000 bytes, sent at `rate`) on a download-task transport
    /// over `bodies`, then lets its request go once the server sends, as a killed app would: the
    /// download fails, the task goes on. Calls `body` with the transport, its downloader, the request
    /// and the server's file, then shuts the downloader down.
    private func letGoWhileSending(
        _ server: HaulTestServer, rate: Int, bodies: String, into directory: String,
        _ body: (URLSessionTransport, Downloader, DownloadRequest, TestResource) async throws -> Void
    ) async throws {
        let resource = TestResource(name: "carried", size: 1_000_000)
        server.add("/f", resource)
        server.setStandingFaults("/f", [.throttle(bytesPerSecond: rate)])
        let request = DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f"))
        let transport = URLSessionTransport(mode: .files(directory: bodies))
        var configuration = testConfiguration(retries: 0)
        configuration.transport = transport
        try await withDownloader(configuration) { downloader in
            let run = Task { try await downloader.download(request) }
            try await waitUntil("the server sends") { server.bodyBytesSent > 0 }
            transport.letGo()
            await #expect(throws: HaulError.self) { try await run.value }
            try await body(transport, downloader, request, resource)
        }
    }

    /// A download task that finishes while nobody waits (on iOS: the app was killed and the system
    /// carried the transfer on) is matched to its download by the task's description: the next run
    /// takes its answer, checked as any other, without asking the server again.
    @Test func aDownloadTaskThatEndedWhileNobodyWaitedIsTakenOnTheNextRun() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { bodies in
                try await withTemporaryDirectory { directory in
                    try await letGoWhileSending(server, rate: 2_000_000, bodies: bodies, into: directory) {
                        _, _, _, resource in
                        try await waitUntil("the answer is held", timeout: .seconds(20)) {
                            listDirectory(bodies).contains { $0.hasSuffix(".head") }
                        }
                        #expect(!fileExists(directory + "/f"))
                        // The next run: another transport on the same directory.
                        let result = try await download(
                            server, to: directory + "/f",
                            configuration: TransportKind.urlSessionFiles.configure(testConfiguration(), bodies: bodies))
                        #expect(try readFile(directory + "/f") == resource.content)
                        #expect(result.bytes == resource.size)
                        #expect(server.requests(for: "/f").count == 1)
                    }
                    #expect(listDirectory(bodies).isEmpty)
                }
            }
        }
    }

    /// A request for a download whose task still runs follows that task instead of sending another.
    @Test func aRequestFollowsTheTaskStillRunningForItsDownload() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { bodies in
                try await withTemporaryDirectory { directory in
                    try await letGoWhileSending(server, rate: 1_000_000, bodies: bodies, into: directory) {
                        _, downloader, request, resource in
                        let result = try await downloader.download(request)
                        #expect(try readFile(directory + "/f") == resource.content)
                        #expect(result.bytes == resource.size)
                        #expect(server.requests(for: "/f").count == 1)
                    }
                    #expect(listDirectory(bodies).isEmpty)
                }
            }
        }
    }

    /// The networks an app allows reach every request the transport sends, through the queue.
    @Test func theQueuesNetworkAccessReachesEveryRequest() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "policy", size: 100_000)
            server.add("/f", resource)
            server.add("/go", .redirect(to: "/f"))
            try await withTemporaryDirectory { directory in
                var configuration = testConfiguration()
                configuration.networkAccess.allowsExpensiveNetworkAccess = false
                configuration.networkAccess.isDiscretionary = true
                let recording = RecordingTransport(URLSessionTransport())
                configuration.transport = recording
                try await withManager(directory + "/state", downloader: configuration) { manager in
                    let id = try await manager.enqueue(
                        DownloadRequest(url: server.url("/go"), destination: .file(directory + "/f")))
                    await manager.start()
                    try await waitFor(manager, id) { $0.state == .completed }
                }
                #expect(try readFile(directory + "/f") == resource.content)
                let sent = recording.sent
                #expect(sent.count == 2)
                #expect(sent.allSatisfy { !$0.allowsExpensiveNetworkAccess && $0.allowsConstrainedNetworkAccess })
                #expect(sent.allSatisfy { $0.isDiscretionary })
            }
        }
    }
}

/// A transport that notes the network access of every request and lets another send it.
final class RecordingTransport: DownloadTransport {
    private let inner: any DownloadTransport
    private let recorded = Mutex<[NetworkAccess]>([])

    init(_ inner: any DownloadTransport) { self.inner = inner }

    var sent: [NetworkAccess] { recorded.withLock { $0 } }

    func send<Result>(_ request: TransportRequest, receive: (TransportResponse) async -> Result) async throws -> Result
    {
        recorded.withLock { $0.append(request.networkAccess) }
        return try await inner.send(request, receive: receive)
    }

    func failure(of error: any Error, sending request: TransportRequest) -> TransportFailure {
        inner.failure(of: error, sending: request)
    }

    func shutdown() async throws { try await inner.shutdown() }
}
