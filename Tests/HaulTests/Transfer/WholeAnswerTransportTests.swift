import HaulTestServer
import Testing

@testable import Haul

/// The shortcut's own connections (``WholeAnswerTransport``): kept alive from file to file, read
/// whole, left to the general client where they cannot serve.
@Suite("The shortcut's kept-alive connections", .timeLimit(.minutes(1)))
struct WholeAnswerTransportTests {
    /// Fetches `names` one after another into `directory`; the first goes the machine's way.
    static func fetchAll(_ names: [String], _ server: HaulTestServer, _ downloader: Downloader, into directory: String)
        async throws
    {
        for name in names { try await WholeAnswerTests.fetch(name, server, downloader, into: directory) }
    }

    @Test func smallFilesAfterTheFirstShareOneKeptAliveConnection() async throws {
        try await HaulTestServer.withRunning { server in
            let names = (1...12).map { "k\($0)" }
            let resources = WholeAnswerTests.small(server, names)
            try await withTemporaryDirectory { directory in
                try await withDownloader { downloader in
                    try await Self.fetchAll(names, server, downloader, into: directory)
                    #expect(downloader.smallAnswers.finishedCount == names.count - 1)
                    let transport = try #require(downloader.wholeAnswerTransport)
                    #expect(transport.openConnections(to: try DownloadURL(server.url("/k1")).url) == 1)
                }
                // The first file came over the general client's connection; every other over the
                // shortcut's one connection, which is another.
                let connections = names.map { server.requests(for: "/\($0)").map(\.connection) }
                #expect(connections.allSatisfy { $0.count == 1 })
                let shortcut = Set(connections.dropFirst().flatMap { $0 })
                #expect(shortcut.count == 1 && !shortcut.contains(connections[0][0]))
                #expect(server.connectionsAccepted == 2)
                for name in names { #expect(try readFile(directory + "/" + name) == resources[name]?.content) }
            }
        }
    }

    @Test func downloadsAtOnceOpenNoMoreConnectionsThanTheLimitAndTheRestGoTheGeneralWay() async throws {
        try await HaulTestServer.withRunning { server in
            let names = (1...24).map { "p\($0)" }
            let resources = WholeAnswerTests.small(server, names)
            try await withTemporaryDirectory { directory in
                var configuration = testConfiguration()
                configuration.connectionsPerHost = 2
                try await withDownloader(configuration) { downloader in
                    try await WholeAnswerTests.fetch("p1", server, downloader, into: directory)
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        for name in names.dropFirst() {
                            group.addTask {
                                try await WholeAnswerTests.fetch(name, server, downloader, into: directory)
                            }
                        }
                        try await group.waitForAll()
                    }
                    #expect(downloader.smallAnswers.finishedCount == names.count - 1)
                    let transport = try #require(downloader.wholeAnswerTransport)
                    #expect(transport.connectionsPerOrigin == 2)
                    #expect(transport.openConnections(to: try DownloadURL(server.url("/p1")).url) <= 2)
                }
                // The shortcut's two connections beside the general client's two.
                #expect(server.maximumOpenConnections <= 4)
                for name in names {
                    #expect(server.requests(for: "/\(name)").count == 1)
                    #expect(try readFile(directory + "/" + name) == resources[name]?.content)
                }
            }
        }
    }

    @Test func aConnectionLostMidAnswerIsClosedAndTheMachineTakesTheFile() async throws {
        try await HaulTestServer.withRunning { server in
            let names = ["a", "b", "cut", "d"]
            let resources = WholeAnswerTests.small(server, names)
            server.script("/cut", [[.closeAfter(bytes: 5000)]])
            try await withTemporaryDirectory { directory in
                try await withDownloader { downloader in
                    try await Self.fetchAll(names, server, downloader, into: directory)
                    // a went the machine's way and b the shortcut's; cut's answer broke off there, and
                    // the machine fetched it again (whole: the origin's files are small once more),
                    // so d took the shortcut over a new connection.
                    #expect(downloader.smallAnswers.finishedCount == 2)
                }
                #expect(server.requests(for: "/cut").count == 2)
                // The broken connection was not used again.
                let over = { (name: String) in server.requests(for: "/\(name)").first?.connection }
                #expect(over("d") != over("b"))
                for name in names { #expect(try readFile(directory + "/" + name) == resources[name]?.content) }
                #expect(listDirectory(directory).sorted() == names.sorted())
            }
        }
    }

    @Test func aConnectionTheServerWillCloseIsNotUsedAgain() async throws {
        try await HaulTestServer.withRunning { server in
            let names = ["a", "b", "closing", "d", "e"]
            let resources = WholeAnswerTests.small(server, names)
            // The server says it closes the connection after this answer (this test server keeps
            // it open all the same).
            server.setStandingFaults("/closing", [.setHeader("Connection", "close")])
            try await withTemporaryDirectory { directory in
                try await withDownloader { downloader in
                    try await Self.fetchAll(names, server, downloader, into: directory)
                    #expect(downloader.smallAnswers.finishedCount == 4)
                }
                let over = { (name: String) in server.requests(for: "/\(name)").first?.connection }
                #expect(over("closing") == over("b"))
                #expect(over("d") != over("closing") && over("e") == over("d"))
                for name in names { #expect(try readFile(directory + "/" + name) == resources[name]?.content) }
            }
        }
    }

    @Test func overHTTPSTheShortcutSpeaksHTTP1AndChecksTheCertificate() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            let names = ["a", "b", "c"]
            let resources = WholeAnswerTests.small(server, names)
            WholeAnswerTests.small(server, ["n1", "n2"])
            try await withTemporaryDirectory { directory in
                let folder = directory + "/files"
                try await withDownloader(try trustingTestServer(testConfiguration(), in: directory)) { downloader in
                    try await Self.fetchAll(names, server, downloader, into: folder)
                    #expect(downloader.smallAnswers.finishedCount == 2)
                    // By name: sent for Server Name Indication, and the certificate checked against it.
                    for name in ["n1", "n2"] {
                        try await downloader.download(
                            DownloadRequest(
                                url: server.url("/\(name)", host: "localhost"), destination: .directory(folder)))
                    }
                    #expect(downloader.smallAnswers.finishedCount == 3)
                }
                #expect(server.requests(for: "/n2").map(\.version) == ["HTTP/1.1"])
                #expect(try readFile(folder + "/n2") == server.resource("/n2")?.content)
                // The general client speaks HTTP/2 where offered; the shortcut HTTP/1.1.
                #expect(server.requests(for: "/a").map(\.version) == ["HTTP/2"])
                #expect(server.requests(for: "/b").map(\.version) == ["HTTP/1.1"])
                #expect(server.requests(for: "/c").map(\.version) == ["HTTP/1.1"])
                for name in names { #expect(try readFile(folder + "/" + name) == resources[name]?.content) }
                // Without the authority that signed the server's certificate, the shortcut's
                // handshake fails, and the machine's way reports it.
                try await withDownloader(testConfiguration(retries: 0)) { downloader in
                    downloader.smallAnswers.note(try DownloadURL(server.url("/a")).origin, small: true)
                    await expectHaulError(.tls) {
                        try await WholeAnswerTests.fetch("a", server, downloader, into: directory + "/other")
                    }
                    #expect(downloader.smallAnswers.finishedCount == 0)
                }
                #expect(server.requests(for: "/a").count == 1)
                #expect(!POSIX.exists(directory + "/other/a"))
            }
        }
    }

    @Test func requestsThroughAProxyGoTheGeneralWay() async throws {
        try await HaulTestServer.withRunning { server in
            try await TestProxy.withRunning(.http) { proxy in
                let names = ["a", "b", "c"]
                let resources = WholeAnswerTests.small(server, names)
                try await withTemporaryDirectory { directory in
                    var configuration = testConfiguration()
                    configuration.proxy.http = try Proxy(parsing: "http://127.0.0.1:\(proxy.port)")
                    try await withDownloader(configuration) { downloader in
                        try await Self.fetchAll(names, server, downloader, into: directory)
                        #expect(downloader.smallAnswers.finishedCount == 2)
                        let transport = try #require(downloader.wholeAnswerTransport)
                        #expect(transport.openConnections(to: try DownloadURL(server.url("/a")).url) == 0)
                    }
                    #expect(proxy.seen.map(\.target) == names.map { server.url("/\($0)") })
                    for name in names { #expect(try readFile(directory + "/" + name) == resources[name]?.content) }
                }
            }
        }
    }

    @Test func anIdleConnectionClosesAfterItsTimeoutAndAShutdownClosesTheRest() async throws {
        try await HaulTestServer.withRunning { server in
            let resources = WholeAnswerTests.small(server, ["a", "b"])
            let url = try DownloadURL(server.url("/a")).url
            try await withDownloader { downloader in
                let quick = WholeAnswerTransport(
                    configuration: testConfiguration(), fallback: downloader.transport, bodyLimit: 64 * 1024,
                    clock: downloader.clock, idleTimeout: .milliseconds(20))
                let lasting = WholeAnswerTransport(
                    configuration: testConfiguration(), fallback: downloader.transport, bodyLimit: 64 * 1024,
                    clock: downloader.clock)
                for transport in [quick, lasting] {
                    let body = try await transport.send(TransportRequest(url: url, headers: [])) { response in
                        #expect(response.status == 200)
                        var bytes: [UInt8] = []
                        do {
                            for try await chunk in response.body { bytes += chunk.readableBytesView }
                        } catch {
                            Issue.record("the body failed: \(error)")
                        }
                        return bytes
                    }
                    #expect(body == resources["a"]?.content)
                }
                try await waitUntil("the idle connection closes", timeout: .seconds(20)) {
                    quick.openConnections(to: url) == 0
                }
                #expect(lasting.openConnections(to: url) == 1)
                try await lasting.shutdown()
                try await waitUntil("the shut down transport's connection closes", timeout: .seconds(20)) {
                    lasting.openConnections(to: url) == 0
                }
                try await quick.shutdown()
            }
            #expect(server.requests(for: "/a").count == 2)
        }
    }

    @Test func aCapPerHostLeavesTheShortcutToTheGeneralClient() async throws {
        var configuration = testConfiguration()
        configuration.maxConnectionsPerHost = 2
        try await withDownloader(configuration) { #expect($0.wholeAnswerTransport == nil) }
        try await withDownloader { #expect($0.wholeAnswerTransport != nil) }
    }
}
