import HaulTestServer
import Testing

@testable import Haul

/// Runs `body` with `count` test servers running at once (each its own origin: its own port).
func withServers<Result: Sendable>(
    _ count: Int, transport: HaulTestServer.Transport = .plain,
    _ body: @escaping @Sendable ([HaulTestServer]) async throws -> Result
) async throws -> Result {
    try await withServers(count, started: [], transport: transport, body)
}

private func withServers<Result: Sendable>(
    _ count: Int, started: [HaulTestServer], transport: HaulTestServer.Transport,
    _ body: @escaping @Sendable ([HaulTestServer]) async throws -> Result
) async throws -> Result {
    guard started.count < count else { return try await body(started) }
    return try await HaulTestServer.withRunning(transport: transport) { server in
        try await withServers(count, started: started + [server], transport: transport, body)
    }
}

/// The same file on three servers: each has an ETag of its own, as copies on different servers do.
/// `change` adjusts the resource of each server (by index) before it is added.
private func serveMirrored(
    _ servers: [HaulTestServer], size: Int64 = 6 << 20, bytesPerSecond: Int = 3 << 20,
    _ change: (Int, inout TestResource) -> Void = { _, _ in }
) -> TestResource {
    var reference = TestResource(name: "mirrored", size: size)
    for (index, server) in servers.enumerated() {
        var resource = TestResource(name: "mirrored", size: size, fixedEntityTag: "\"copy-\(index)\"")
        change(index, &resource)
        if index == 0 { reference = resource }
        server.add("/file", resource)
        server.setStandingFaults("/file", [.throttle(bytesPerSecond: bytesPerSecond)])
    }
    return reference
}

private func sha256(_ resource: TestResource) throws -> Checksum {
    Checksum(algorithm: .sha256, digest: resource.sha256(0..<resource.size))
}

private func mirrorReports(_ log: EventLog) -> [MirrorReport] {
    log.all.compactMap { if case .mirror(let report) = $0 { report } else { nil } }
}

private func droppedURLs(_ log: EventLog) -> [String] {
    mirrorReports(log).compactMap { if case .dropped(let url, _) = $0 { url } else { nil } }
}

/// Downloads `/file` of the first server, with the same path on the others as mirrors, into
/// `directory` over as many connections as servers; returns the events, the file's bytes and the result.
private func downloadMirrored(
    _ servers: [HaulTestServer], into directory: String, checksum: Checksum? = nil,
    _ change: (inout DownloadRequest) -> Void = { _ in }
) async throws -> (log: EventLog, bytes: [UInt8], result: DownloadResult) {
    let log = EventLog()
    let destination = directory + "/file"
    var request = DownloadRequest(url: servers[0].url("/file"), destination: .file(destination), checksum: checksum)
    request.mirrors = servers.dropFirst().map { $0.url("/file") }
    change(&request)
    let result = try await withDownloader(segmentedConfiguration(connections: servers.count)) { downloader in
        try await downloader.download(request, observing: log.record)
    }
    return (log, try readFile(destination), result)
}

@Suite("Mirrors: one file from several URLs", .timeLimit(.minutes(2)))
struct MirrorTests {
    @Test("with a checksum the ranges are spread over every mirror, each asked with its own validator")
    func mixedWithChecksum() async throws {
        try await withServers(3) { servers in
            try await withTemporaryDirectory { directory in
                let resource = serveMirrored(servers)
                let (log, bytes, _) = try await downloadMirrored(
                    servers, into: directory, checksum: try sha256(resource))
                #expect(bytes == resource.content)
                guard case .mixed = mirrorReports(log).first else {
                    Issue.record("expected the mirrors mixed, got \(mirrorReports(log))")
                    return
                }
                #expect(droppedURLs(log).isEmpty)
                for (index, server) in servers.enumerated() {
                    // Every server sent part of the file; none was asked with another's validator.
                    #expect(server.bodyBytesSent > 0, "server \(index) sent nothing")
                    let ifRanges = server.requests(for: "/file").compactMap { $0.header("if-range") }
                    #expect(ifRanges.allSatisfy { $0 == "\"copy-\(index)\"" }, "server \(index): \(ifRanges)")
                }
                // The mirrors were asked for ranges, not the file from its start.
                for server in servers.dropFirst() {
                    let ranges = server.requests(for: "/file").map { $0.header("range") }
                    #expect(ranges.allSatisfy { $0 != nil && $0 != "bytes=0-" }, "\(ranges)")
                }
            }
        }
    }

    @Test("with the same Repr-Digest from every server the mirrors mix without a checksum")
    func mixedByDigest() async throws {
        try await withServers(3) { servers in
            try await withTemporaryDirectory { directory in
                let resource = serveMirrored(servers) { _, resource in resource.reprDigest = true }
                let (log, bytes, _) = try await downloadMirrored(servers, into: directory)
                #expect(bytes == resource.content)
                guard case .mixed = mirrorReports(log).first else {
                    Issue.record("expected the mirrors mixed, got \(mirrorReports(log))")
                    return
                }
                for server in servers { #expect(server.bodyBytesSent > 0) }
            }
        }
    }

    @Test("without a checksum or a common digest the mirrors are not mixed: one line says so")
    func noProofNoMixing() async throws {
        try await withServers(3) { servers in
            try await withTemporaryDirectory { directory in
                let resource = serveMirrored(servers)
                let (log, bytes, _) = try await downloadMirrored(servers, into: directory)
                #expect(bytes == resource.content)
                #expect(mirrorReports(log).count == 1)
                guard case .inTurn(let reason) = mirrorReports(log).first else {
                    Issue.record("expected the mirrors used in turn, got \(mirrorReports(log))")
                    return
                }
                #expect(reason.contains("Repr-Digest"))
                #expect(servers[1].requests.isEmpty && servers[2].requests.isEmpty)
            }
        }
    }

    @Test("mirrors used in turn: when the first URL fails part-way the next serves the whole file, never a splice")
    func inTurnFallbackNeverSplices() async throws {
        try await withServers(2) { servers in
            try await withTemporaryDirectory { directory in
                // The first server holds another version; it breaks off its first answer part-way, then
                // answers 404.
                let size: Int64 = 3 << 20
                servers[0].add("/file", TestResource(name: "mirrored", size: size, version: 2))
                servers[0].script("/file", [[.closeAfter(bytes: 700_000)]] + Array(repeating: [.status(404)], count: 8))
                let good = TestResource(name: "mirrored", size: size)
                servers[1].add("/file", good)
                let (log, bytes, _) = try await downloadMirrored(servers, into: directory)
                #expect(bytes == good.content)
                #expect(log.restartKinds == ["mirrorFallback"])
                #expect(droppedURLs(log) == [servers[0].url("/file")])
                // The second server's first request asked for the file from byte 0.
                let first = try #require(servers[1].requests(for: "/file").first)
                #expect(first.header("range") == nil || first.header("range") == "bytes=0-")
                #expect(first.header("if-range") == nil)
            }
        }
    }

    @Test("a mirror that dies part-way is dropped and the others fetch its ranges")
    func mirrorDiesPartWay() async throws {
        try await withServers(3) { servers in
            try await withTemporaryDirectory { directory in
                let resource = serveMirrored(servers)
                // The third breaks off its first answer part-way, then answers 503 to every request.
                servers[2].script(
                    "/file", [[.closeAfter(bytes: 200_000)]] + Array(repeating: [.status(503)], count: 8))
                let (log, bytes, _) = try await downloadMirrored(
                    servers, into: directory, checksum: try sha256(resource))
                #expect(bytes == resource.content)
                #expect(droppedURLs(log) == [servers[2].url("/file")])
                #expect(servers[2].requests(for: "/file").count == TransferMachine.sourceFailureLimit)
            }
        }
    }

    @Test("a mirror with another version is caught by its Repr-Digest and dropped; the file is right")
    func otherVersionCaughtByDigest() async throws {
        try await withServers(3) { servers in
            try await withTemporaryDirectory { directory in
                let resource = serveMirrored(servers) { index, resource in
                    resource.reprDigest = true
                    if index == 1 { resource.version = 2 }
                }
                let (log, bytes, _) = try await downloadMirrored(servers, into: directory)
                #expect(bytes == resource.content)
                #expect(droppedURLs(log) == [servers[1].url("/file")])
                #expect(servers[1].requests(for: "/file").count == 1)
            }
        }
    }

    @Test(
        "a mirror with another version of the same length is caught by the checksum and a piece compared; its bytes are fetched again"
    )
    func otherVersionCaughtByChecksum() async throws {
        try await withServers(3) { servers in
            try await withTemporaryDirectory { directory in
                let resource = serveMirrored(servers) { index, resource in
                    if index == 2 { resource.version = 2 }
                }
                let (log, bytes, result) = try await downloadMirrored(
                    servers, into: directory, checksum: try sha256(resource))
                #expect(bytes == resource.content)
                // A piece of what each mirror wrote was compared with the first URL: only the one that
                // differs is dropped.
                #expect(droppedURLs(log) == [servers[2].url("/file")])
                #expect(result.bytes == resource.size)
            }
        }
    }

    @Test("a mirror that answers a range with the whole file is dropped")
    func mirrorRefusesRanges() async throws {
        try await withServers(3) { servers in
            try await withTemporaryDirectory { directory in
                let resource = serveMirrored(servers)
                servers[1].setStandingFaults("/file", [.ignoreRange])
                let (log, bytes, _) = try await downloadMirrored(
                    servers, into: directory, checksum: try sha256(resource))
                #expect(bytes == resource.content)
                #expect(droppedURLs(log) == [servers[1].url("/file")])
                #expect(servers[1].requests(for: "/file").count == 1)
            }
        }
    }

    @Test("credentials go to the first URL's origin only, never to a mirror elsewhere")
    func credentialsStayWithTheirOrigin() async throws {
        try await withServers(2) { servers in
            try await withTemporaryDirectory { directory in
                let resource = serveMirrored(servers) { index, resource in
                    if index == 0 { resource.requiredAuthorization = "Basic dXNlcjpzZWNyZXQ=" }
                }
                let (_, bytes, _) = try await downloadMirrored(
                    servers, into: directory, checksum: try sha256(resource)
                ) { $0.credentials = BasicCredentials(user: "user", password: "secret") }
                #expect(bytes == resource.content)
                #expect(servers[1].bodyBytesSent > 0)
                #expect(servers[1].requests.allSatisfy { $0.header("authorization") == nil })
                #expect(servers[0].requests.allSatisfy { $0.header("authorization") == "Basic dXNlcjpzZWNyZXQ=" })
            }
        }
    }

    @Test("a mirror that is not an http(s) URL, or that repeats one, is refused before any request")
    func invalidMirrors() async throws {
        var request = DownloadRequest(url: "http://127.0.0.1:1/file", destination: .file("/tmp/never"))
        request.mirrors = ["ftp://127.0.0.1/file"]
        #expect { try request.check() } throws: { ($0 as? HaulError)?.code == .unsupportedScheme }
        request.mirrors = ["http://127.0.0.1:1/file"]
        #expect { try request.check() } throws: { ($0 as? HaulError)?.code == .invalidArgument }
        request.mirrors = ["http://127.0.0.1:2/file", "http://127.0.0.1:2/file"]
        #expect { try request.check() } throws: { ($0 as? HaulError)?.code == .invalidArgument }
        request.mirrors = (1...17).map { "http://127.0.0.1:\($0)/file" }
        #expect { try request.check() } throws: { ($0 as? HaulError)?.code == .invalidArgument }
    }
}
