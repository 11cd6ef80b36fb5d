import HaulTestServer
import Testing

@testable import Haul

/// Writes the test server's certificate authority into `directory` and returns a configuration trusting it.
func trustingTestServer(_ configuration: DownloaderConfiguration, in directory: String) throws
    -> DownloaderConfiguration
{
    let path = directory + "/test-authority.pem"
    try writeFile(path, Array(HaulTestServer.certificateAuthorityPEM.utf8))
    var configuration = configuration
    configuration.tls.trustedCertificateFiles = [path]
    return configuration
}

/// `configuration`, trusting the test server's authority when `server` speaks TLS.
func reaching(_ server: HaulTestServer, _ configuration: DownloaderConfiguration, in directory: String) throws
    -> DownloaderConfiguration
{
    server.transport == .plain ? configuration : try trustingTestServer(configuration, in: directory)
}

/// Downloads every resource (each served at its name) into `directory` at once, with one downloader.
func downloadAtOnce(
    _ server: HaulTestServer, _ resources: [TestResource], into directory: String,
    configuration: DownloaderConfiguration
) async throws {
    try await withDownloader(configuration) { downloader in
        try await withThrowingTaskGroup(of: Void.self) { group in
            for resource in resources {
                group.addTask {
                    try await downloader.download(
                        DownloadRequest(
                            url: server.url("/\(resource.name)"), destination: .file(directory + "/" + resource.name)))
                }
            }
            try await group.waitForAll()
        }
    }
    for resource in resources { #expect(try readFile(directory + "/" + resource.name) == resource.content) }
}

/// Throttled resources served at their names, so that downloads of them overlap.
func throttled(_ server: HaulTestServer, _ names: [String], size: Int64, rate: Int) -> [TestResource] {
    names.enumerated().map { index, name in
        let resource = TestResource(name: name, size: size + Int64(index))
        server.add("/\(name)", resource)
        server.setStandingFaults("/\(name)", [.throttle(bytesPerSecond: rate)])
        return resource
    }
}

/// Over TLS the test server offers HTTP/2, so every request should speak it.
func expectHTTP2OverTLS(_ server: HaulTestServer, sourceLocation: SourceLocation = #_sourceLocation) {
    guard server.transport == .tls else { return }
    #expect(server.requests.allSatisfy { $0.version == "HTTP/2" }, sourceLocation: sourceLocation)
}

@Suite("Connection reuse: keep-alive, TLS and HTTP/2") struct ConnectionReuseTests {
    @Test("downloads one after another reuse one kept-alive HTTP/1.1 connection")
    func keepAlive() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                // Larger than a block, so none takes the small-answer shortcut, whose connections are
                // its own (WholeAnswerTransportTests).
                let resources = (0..<5).map { TestResource(name: "kept\($0)", size: 100_000 + Int64($0)) }
                for resource in resources { server.add("/\(resource.name)", resource) }
                try await withDownloader { downloader in
                    for resource in resources {
                        try await downloader.download(
                            DownloadRequest(
                                url: server.url("/\(resource.name)"),
                                destination: .file(directory + "/" + resource.name)))
                    }
                }
                for resource in resources { #expect(try readFile(directory + "/" + resource.name) == resource.content) }
                #expect(server.requests.count == 5)
                #expect(server.connectionsAccepted == 1)
                #expect(server.requests.allSatisfy { $0.version == "HTTP/1.1" })
            }
        }
    }

    @Test("over https with HTTP/2 offered, each connection of a download is a TCP connection of its own")
    func connectionsOverHTTP2() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "multiplexed", size: 6 * 1024 * 1024 + 77)
                server.add("/multiplexed", resource)
                server.setStandingFaults("/multiplexed", [.throttle(bytesPerSecond: 2 << 20)])
                try await download(
                    server, "/multiplexed", to: directory + "/multiplexed",
                    configuration: try trustingTestServer(segmentedConfiguration(), in: directory))
                #expect(try readFile(directory + "/multiplexed") == resource.content)
                let requests = server.requests(for: "/multiplexed")
                #expect(requests.count >= 4)
                #expect(requests.first?.header("Range") == "bytes=0-")
                // Every range after the first answer carries the validator; a first request sent again
                // (its TLS handshake timed out on a loaded machine) asks for the whole file anew.
                for request in requests.dropFirst() where request.header("Range") != "bytes=0-" {
                    #expect(request.header("If-Range") == resource.entityTagValue)
                }
                // Four connections are four TCP connections (not four streams sharing one congestion
                // window), each speaking HTTP/2.
                #expect(requests.allSatisfy { $0.version == "HTTP/2" })
                #expect(server.connectionsAccepted == 4)
                #expect(Set(requests.map(\.connection)).count == 4)
            }
        }
    }

    @Test("a request that asks for more connections than configured gets as many TCP connections over HTTP/2")
    func requestedConnectionsOverHTTP2() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "wider", size: 6 * 1024 * 1024 + 77)
                server.add("/wider", resource)
                server.setStandingFaults("/wider", [.throttle(bytesPerSecond: 2 << 20)])
                let configuration = try trustingTestServer(segmentedConfiguration(connections: 1), in: directory)
                var request = DownloadRequest(url: server.url("/wider"), destination: .file(directory + "/wider"))
                request.connections = 3
                try await withDownloader(configuration) { downloader in try await downloader.download(request) }
                #expect(try readFile(directory + "/wider") == resource.content)
                let requests = server.requests(for: "/wider")
                #expect(requests.allSatisfy { $0.version == "HTTP/2" })
                // One HTTP client per connection, the two beyond the configured one made on demand.
                #expect(server.connectionsAccepted == 3)
                #expect(Set(requests.map(\.connection)).count == 3)
            }
        }
    }

    @Test("several downloads from one HTTP/2 host share its connection")
    func downloadsMultiplexed() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            try await withTemporaryDirectory { directory in
                let resources = throttled(server, (0..<6).map { "shared\($0)" }, size: 300_000, rate: 1 << 20)
                let configuration = try trustingTestServer(testConfiguration(), in: directory)
                try await downloadAtOnce(server, resources, into: directory, configuration: configuration)
                #expect(server.requests.count == 6)
                #expect(server.requests.allSatisfy { $0.version == "HTTP/2" })
                #expect(server.connectionsAccepted == 1)
            }
        }
    }

    @Test("a limit of connections per host holds over the clients of a download's connections")
    func connectionsPerHostIsShared() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resources = throttled(server, (0..<4).map { "limited\($0)" }, size: 200_000, rate: 1 << 20)
                // Two connections to the host, over four downloads of one connection each: two at a time.
                var configuration = testConfiguration()
                configuration.segmentation.connections = 1
                configuration.connectionsPerHost = 2
                try await downloadAtOnce(server, resources, into: directory, configuration: configuration)
                #expect(server.maximumOpenConnections == 2)
            }
        }
    }

    @Test("over https without HTTP/2, segments use several HTTP/1.1 connections, closed without waiting")
    func tlsWithoutHTTP2() async throws {
        try await HaulTestServer.withRunning(transport: .tlsHTTP1Only) { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "tls1", size: 8 * 1024 * 1024)
                server.add("/tls1", resource)
                server.setStandingFaults("/tls1", [.throttle(bytesPerSecond: 2 << 20)])
                try await download(
                    server, "/tls1", to: directory + "/tls1",
                    configuration: try trustingTestServer(segmentedConfiguration(), in: directory))
                #expect(try readFile(directory + "/tls1") == resource.content)
                // The first request asked for everything and was cut at the end of its range, the first
                // quarter (1 s at the throttled rate): closing it must not wait for the server to send
                // the rest of the file, as TLS would for its close_notify. What the server sends past
                // the quarter depends on how soon a loaded machine gets to the close; the whole file
                // would take three more seconds.
                #expect(server.requests.first?.header("Range") == "bytes=0-")
                #expect(server.bodyBytesSent(answering: 0) < resource.size)
                #expect(server.requests.allSatisfy { $0.version == "HTTP/1.1" })
                #expect(server.maximumOpenConnections >= 4)
            }
        }
    }

    @Test("allowHTTP2 = false keeps to HTTP/1.1 where the server offers HTTP/2")
    func http2Declined() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "declined", size: 100_000)
                server.add("/declined", resource)
                var configuration = try trustingTestServer(testConfiguration(), in: directory)
                configuration.tls.allowHTTP2 = false
                try await download(server, "/declined", to: directory + "/declined", configuration: configuration)
                #expect(try readFile(directory + "/declined") == resource.content)
                #expect(server.requests.map(\.version) == ["HTTP/1.1"])
            }
        }
    }

    @Test("a stream cut short over HTTP/2 is resumed from its stored bytes on the same connection")
    func streamResetResumes() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "reset", size: 2 * 1024 * 1024)
                server.add("/reset", resource)
                server.script("/reset", [[.closeAfter(bytes: 700_000)]])
                let configuration = try trustingTestServer(testConfiguration(), in: directory)
                let result = try await download(
                    server, "/reset", to: directory + "/reset", configuration: configuration)
                #expect(try readFile(directory + "/reset") == resource.content)
                let requests = server.requests(for: "/reset")
                #expect(requests.count == 2)
                let resumedAt = try #require(requests.last?.header("Range"))
                let offset = try #require(Int64(resumedAt.dropFirst("bytes=".count).dropLast()))
                #expect(offset > 0 && offset <= 700_000)
                #expect(requests.last?.header("If-Range") == resource.entityTagValue)
                #expect(result.bytes == resource.size)
                #expect(requests.allSatisfy { $0.version == "HTTP/2" })
                #expect(server.connectionsAccepted == 1)
            }
        }
    }

    @Test("a certificate nobody vouches for fails with a TLS error, without retrying or leaving files")
    func untrustedCertificate() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            try await withTemporaryDirectory { directory in
                server.add("/secret", TestResource(name: "secret", size: 1000))
                let error = await expectHaulError(.tls) {
                    try await download(server, "/secret", to: directory + "/secret")
                }
                #expect(
                    error?.message
                        == "TLS with 127.0.0.1 failed: its certificate could not be verified (not valid for 127.0.0.1, "
                        + "expired, or signed by no trusted authority)")
                #expect(server.requests.isEmpty)
                #expect(server.connectionsAccepted == 1)
                #expect(listDirectory(directory).isEmpty)
            }
        }
    }

    @Test("a trusted-certificate file that is missing or not PEM is reported by name")
    func badCertificateFile() async throws {
        try await withTemporaryDirectory { directory in
            let missing = directory + "/missing.pem"
            let unreadable = #expect(throws: HaulError.self) {
                try DownloaderConfiguration.TLS.checkCertificateFile(missing)
            }
            #expect(unreadable?.code == .invalidArgument)
            #expect(unreadable?.message == "cannot read the certificate file \(missing)")
            let garbage = directory + "/garbage.pem"
            try writeFile(garbage, Array("not a certificate\n".utf8))
            do {
                try DownloaderConfiguration.TLS.checkCertificateFile(garbage)
                Issue.record("a file without a certificate was accepted")
            } catch let error as HaulError {
                #expect(error.code == .invalidArgument)
                #expect(error.message.contains(garbage))
            }
            // Given to a downloader unchecked, the same file fails the download as a TLS error.
            try await HaulTestServer.withRunning(transport: .tls) { server in
                server.add("/f", TestResource(name: "f", size: 1000))
                var configuration = testConfiguration()
                configuration.tls.trustedCertificateFiles = [missing]
                await expectHaulError(.tls) {
                    try await download(server, "/f", to: directory + "/f", configuration: configuration)
                }
                #expect(server.requests.isEmpty)
            }
            let good = directory + "/good.pem"
            try writeFile(good, Array(HaulTestServer.certificateAuthorityPEM.utf8))
            try DownloaderConfiguration.TLS.checkCertificateFile(good)
        }
    }
}
