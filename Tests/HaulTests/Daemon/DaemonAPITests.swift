import AsyncHTTPClient
import Foundation
import HaulTestServer
import NIOHTTP1
import Testing

@testable import Haul
@testable import HaulDaemon

/// The API's operations against the test server, through a real HTTP client.
@Suite(.timeLimit(.minutes(1)))
struct DaemonAPITests {
    @Test func addedDownloadsCompleteWithTheServersBytes() async throws {
        try await HaulTestServer.withRunning { server in
            let first = TestResource(name: "one", size: 300_000)
            let second = TestResource(name: "two", size: 200_000)
            server.add("/one", first)
            server.add("/two", second)
            try await withDaemon { daemon in
                let answer = try await daemon.send(
                    .POST, "/api/v1/downloads",
                    json: #"""
                        {"downloads": [{"url": "\#(server.url("/one"))", "priority": 10},
                                       {"url": "\#(server.url("/two"))", "destination": "named.bin",
                                        "checksum": "sha256=\#(hex(second.sha256(0..<second.size)))"}]}
                        """#)
                #expect(answer.status == 201, "\(answer.body)")
                #expect(answer.headers["Content-Type"].first?.hasPrefix("application/json") == true)
                let added = try answer.json(DownloadListAnswer.self).downloads
                #expect(added.map(\.priority) == [10, 0])
                let done = try await daemon.waitFor(added[0].id, "completed")
                #expect(try readFile(daemon.root + "/one") == first.content)
                #expect(done.bytes == 300_000 && done.totalBytes == 300_000 && done.name == "one")
                _ = try await daemon.waitFor(added[1].id, "completed")
                #expect(try readFile(daemon.root + "/named.bin") == second.content)
                let stats = try await daemon.send(.GET, "/api/v1/stats").json(StatsAnswer.self)
                #expect(stats.counts["completed"] == 2 && stats.counts["failed"] == 0 && stats.bytes == 500_000)
            }
        }
    }

    /// A long list with a priority of its own in the middle is added whole, in the request's
    /// order, each download with its priority and a new ID after the one before.
    @Test func aLongListOfMixedPrioritiesIsAddedInItsOrder() async throws {
        try await HaulTestServer.withRunning { server in
            // More than one transaction's worth, with one item of another priority between.
            let count = DownloadManager.enqueueBatch + 500
            let special = DownloadManager.enqueueBatch + 100
            let items = (0..<count).map { index in
                let priority = index == special ? #", "priority": 3"# : ""
                return #"{"url": "\#(server.url("/none\(index)"))"\#(priority)}"#
            }
            try await withDaemon({ $0.manager.maxConcurrentDownloads = 1 }) { daemon in
                let answer = try await daemon.send(
                    .POST, "/api/v1/downloads", json: #"{"downloads": [\#(items.joined(separator: ","))]}"#)
                #expect(answer.status == 201, "\(answer.body.prefix(300))")
                let added = try answer.json(DownloadListAnswer.self).downloads
                #expect(added.map(\.url) == (0..<count).map { server.url("/none\($0)") })
                #expect(added.map(\.priority) == (0..<count).map { $0 == special ? 3 : 0 })
                #expect(zip(added, added.dropFirst()).allSatisfy { $0.id < $1.id })
            }
        }
    }

    @Test func pauseAndResumeContinueFromTheStoredBytes() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "slow", size: 2_000_000)
            server.add("/slow", resource)
            server.setStandingFaults("/slow", [.throttle(bytesPerSecond: 2_000_000)])
            // One connection: the file is written in order, and the resume asks for the rest of it.
            try await withDaemon({ $0.downloader.segmentation.connections = 1 }) { daemon in
                let id = try await daemon.add(#"{"url": "\#(server.url("/slow"))"}"#)[0]
                _ = try await daemon.waitFor(id, "running")
                try await waitUntilAsync("bytes arrive") { try await daemon.download(id).bytes > 0 }
                let paused = try await daemon.send(.POST, "/api/v1/downloads/\(id)/pause")
                #expect(paused.status == 200, "\(paused.body)")
                #expect(try paused.json(DownloadAnswer.self).state == "paused")
                let kept = try await daemon.download(id).bytes
                #expect(kept > 0 && kept < 2_000_000)
                server.setStandingFaults("/slow", [])
                let before = server.requests(for: "/slow").count
                let resumed = try await daemon.send(.POST, "/api/v1/downloads/\(id)/resume")
                #expect(resumed.status == 200)
                #expect(try ["queued", "running"].contains(resumed.json(DownloadAnswer.self).state))
                _ = try await daemon.waitFor(id, "completed")
                #expect(try readFile(daemon.root + "/slow") == resource.content)
                // The resume asked for the rest, from the byte the pause stored, with the validator.
                let resume = try #require(server.requests(for: "/slow").dropFirst(before).first)
                #expect(resume.header("range") == "bytes=\(kept)-")
                #expect(resume.header("if-range") == resource.entityTagValue)
            }
        }
    }

    @Test func aFailedDownloadIsRetriedAndARemovedOneIsGone() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "late", size: 50_000)
            try await withDaemon { daemon in
                let id = try await daemon.add(#"{"url": "\#(server.url("/late"))"}"#)[0]
                let failed = try await daemon.waitFor(id, "failed")
                #expect(failed.error?.code == "httpStatus")
                server.add("/late", resource)
                let retried = try await daemon.send(.POST, "/api/v1/downloads/\(id)/retry")
                #expect(retried.status == 200, "\(retried.body)")
                _ = try await daemon.waitFor(id, "completed")
                #expect(try readFile(daemon.root + "/late") == resource.content)
                // Retrying a completed download is a conflict.
                let again = try await daemon.send(.POST, "/api/v1/downloads/\(id)/retry")
                #expect(again.status == 409 && again.errorCode == "invalidState", "\(again.body)")
                let removed = try await daemon.send(.DELETE, "/api/v1/downloads/\(id)?deleteFiles=true")
                #expect(removed.status == 204)
                #expect((try? readFile(daemon.root + "/late")) == nil)
                let gone = try await daemon.send(.GET, "/api/v1/downloads/\(id)")
                #expect(gone.status == 404 && gone.errorCode == "unknownDownload")
            }
        }
    }

    @Test func anotherURLForATakenFileIsAConflictUnlessItOverwrites() async throws {
        try await HaulTestServer.withRunning { server in
            let first = TestResource(name: "a", size: 400_000)
            let second = TestResource(name: "b", size: 300_000)
            server.add("/a", first)
            server.add("/b", second)
            server.script("/a", [[.stall(afterBytes: 100_000, seconds: 30)]])
            try await withDaemon { daemon in
                let running = try await daemon.add(#"{"url": "\#(server.url("/a"))", "destination": "same.bin"}"#)[0]
                _ = try await daemon.waitFor(running, "running")
                let refused = try await daemon.send(
                    .POST, "/api/v1/downloads",
                    json: #"{"downloads": [{"url": "\#(server.url("/b"))", "destination": "same.bin"}]}"#)
                #expect(refused.status == 409 && refused.errorCode == "destinationExists", "\(refused.body)")
                #expect(refused.body.contains(#""downloadId":\#(running)"#), "\(refused.body)")
                let list = try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).downloads
                #expect(list.map(\.id) == [running] && list[0].url == server.url("/a"))

                // Overwriting replaces the running download with one of the new URL.
                let replaced = try await daemon.add(
                    #"{"url": "\#(server.url("/b"))", "destination": "same.bin", "overwrite": true}"#)[0]
                #expect(replaced != running)
                #expect(try await daemon.send(.GET, "/api/v1/downloads/\(running)").status == 404)
                #expect(try await daemon.waitFor(replaced, "completed").url == server.url("/b"))
                #expect(try readFile(daemon.root + "/same.bin") == second.content)

                // A completed file of another URL is not taken over either, and is replaced only when asked.
                let again = try await daemon.send(
                    .POST, "/api/v1/downloads",
                    json: #"{"downloads": [{"url": "\#(server.url("/a"))", "destination": "same.bin"}]}"#)
                #expect(again.status == 409 && again.body.contains(#""downloadId":\#(replaced)"#), "\(again.body)")
                server.script("/a", [])
                let last = try await daemon.add(
                    #"{"url": "\#(server.url("/a"))", "destination": "same.bin", "overwrite": true}"#)[0]
                _ = try await daemon.waitFor(last, "completed")
                #expect(try readFile(daemon.root + "/same.bin") == first.content)
                // A batch that replaces a download and is then refused for another item changes nothing.
                try writeFile(daemon.root + "/foreign.bin", Array("not haul's".utf8))
                let batch = try await daemon.send(
                    .POST, "/api/v1/downloads",
                    json: #"""
                        {"downloads": [{"url": "\#(server.url("/b"))", "destination": "same.bin", "overwrite": true},
                                       {"url": "\#(server.url("/a"))", "destination": "foreign.bin"}]}
                        """#)
                #expect(batch.status == 409 && batch.body.contains("downloads.1"), "\(batch.body)")
                #expect(try await daemon.download(last).url == server.url("/a"))
                // The same URL and file still name the download there is.
                #expect(try await daemon.add(#"{"url": "\#(server.url("/a"))", "destination": "same.bin"}"#) == [last])
            }
        }
    }

    @Test func listsFilterByStateAndPage() async throws {
        try await HaulTestServer.withRunning { server in
            try await withDaemon { daemon in
                // Five downloads of files the server does not have: each fails with 404.
                let items = (0..<5).map { index in #"{"url": "\#(server.url("/missing\(index)"))"}"# }
                    .joined(separator: ",")
                let ids = try await daemon.add(items)
                #expect(ids.count == 5)
                let page = try await daemon.send(.GET, "/api/v1/downloads?offset=1&limit=2").json(
                    DownloadListAnswer.self)
                #expect(page.downloads.map(\.id) == Array(ids[1...2]) && page.total == 5)
                let bad = try await daemon.send(.GET, "/api/v1/downloads?state=sleeping")
                #expect(bad.status == 400 && bad.errorCode == "invalidArgument" && bad.body.contains("sleeping"))
                let badLimit = try await daemon.send(.GET, "/api/v1/downloads?limit=0")
                #expect(badLimit.status == 400)
                // The message gives both bounds, so a client asking for too many knows how many it may.
                let tooMany = try await daemon.send(.GET, "/api/v1/downloads?limit=2000")
                #expect(tooMany.status == 400 && tooMany.body.contains("from 1 to 1000"), "\(tooMany.body)")
                try await waitUntilAsync("every download has failed") {
                    try await daemon.send(.GET, "/api/v1/downloads?state=failed").json(DownloadListAnswer.self).total
                        == 5
                }
                let some = try await daemon.send(.GET, "/api/v1/downloads?state=failed,completed&limit=3")
                #expect(try some.json(DownloadListAnswer.self).downloads.count == 3)
            }
        }
    }

    @Test func pagesOfALongQueueComeFromTheDatabase() async throws {
        try await withTemporaryDirectory { directory in
            let state = directory + "/state"
            // Paused downloads, so that the daemon leaves them as they are; more than its manager holds.
            let count = 3 * DownloadManager.windowSize
            try POSIX.makePrivateDirectory(state, marker: DownloadManager.databaseName)
            let store = try SQLiteQueueStore(path: state + "/" + DownloadManager.databaseName)
            let ids = try store.insert(
                (0..<count).map { position in
                    var record = StoredDownload(
                        key: "file:/d/\(position)",
                        definition: DownloadRequest(
                            url: "http://127.0.0.1:9/\(position)", destination: .file("/d/\(position)")),
                        destination: nil, priority: 0, owner: nil, now: 1)
                    try? record.move(to: .paused, at: 1)
                    return record
                })
            try await withDaemon(stateDirectory: state) { daemon in
                let page = try await daemon.send(.GET, "/api/v1/downloads?offset=1000&limit=50").json(
                    DownloadListAnswer.self)
                #expect(page.downloads.map(\.id) == ids[1_000..<1_050].map(\.rawValue) && page.total == count)
                let last = try await daemon.send(
                    .GET, "/api/v1/downloads?state=paused,failed&offset=\(count - 10)&limit=50"
                )
                .json(DownloadListAnswer.self)
                #expect(last.downloads.map(\.id) == ids[(count - 10)...].map(\.rawValue) && last.total == count)
                let none = try await daemon.send(.GET, "/api/v1/downloads?state=queued").json(DownloadListAnswer.self)
                #expect(none.downloads.isEmpty && none.total == 0)
                let stats = try await daemon.send(.GET, "/api/v1/stats")
                #expect(stats.body.contains(#""paused":\#(count)"#), "\(stats.body)")
                #expect(await daemon.daemon.manager.heldCount <= DownloadManager.windowSize)
            }
        }
    }

    @Test func aBatchWithOneItemTheQueueRefusesAddsNothing() async throws {
        try await withDaemon { daemon in
            // Given twice: refused before anything is added.
            let twice = try await daemon.send(
                .POST, "/api/v1/downloads",
                json:
                    #"{"downloads": [{"url": "http://127.0.0.1:9/a", "destination": "x.bin"}, {"url": "http://127.0.0.1:9/b", "destination": "x.bin"}]}"#
            )
            #expect(twice.status == 409 && twice.errorCode == "destinationExists" && twice.body.contains("downloads.1"))
            // Refused by the queue itself after the first was added: the first is taken back.
            let refused = try await daemon.send(
                .POST, "/api/v1/downloads",
                json: #"{"downloads": [{"url": "http://127.0.0.1:9/a"}, {"url": "http://[::1/b"}]}"#)
            #expect(refused.status == 400 && refused.errorCode == "invalidURL", "\(refused.body)")
            #expect(try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).total == 0)
        }
    }

    @Test func badInputGetsAClearErrorAndChangesNothing() async throws {
        try await withDaemon { daemon in
            let cases: [(HTTPMethod, String, String?, Int, String)] = [
                (.POST, "/api/v1/downloads", "not json", 400, "invalidArgument"),
                (.POST, "/api/v1/downloads", #"{"downloads": []}"#, 400, "invalidArgument"),
                (.POST, "/api/v1/downloads", #"{"downloads": [{"destination": "x"}]}"#, 400, "invalidArgument"),
                (.POST, "/api/v1/downloads", #"{"downloads": [{"url": "ftp://example.com/a"}]}"#, 400, "invalidURL"),
                (
                    .POST, "/api/v1/downloads",
                    #"{"downloads": [{"url": "http://127.0.0.1:9/a", "checksum": "md7=00"}]}"#,
                    400, "invalidArgument"
                ),
                (
                    .POST, "/api/v1/downloads",
                    #"{"downloads": [{"url": "http://127.0.0.1:9/a", "headers": [{"name": "X\nY", "value": "1"}]}]}"#,
                    400, "invalidArgument"
                ),
                (
                    .POST, "/api/v1/downloads", #"{"downloads": [{"url": "http://127.0.0.1:9/a", "limitRate": 0}]}"#,
                    400, "invalidArgument"
                ),
                (
                    .POST, "/api/v1/downloads",
                    #"{"downloads": [{"url": "http://127.0.0.1:9/a", "label": "a\u202Eb"}]}"#, 400, "invalidArgument"
                ),
                (.GET, "/api/v1/downloads/12345", nil, 404, "unknownDownload"),
                (.GET, "/api/v1/downloads/abc", nil, 400, "invalidArgument"),
                (.POST, "/api/v1/downloads/77/pause", nil, 404, "unknownDownload"),
                (.DELETE, "/api/v1/downloads/77?deleteFiles=maybe", nil, 400, "invalidArgument"),
                (.PATCH, "/api/v1/options", #"{"maxConcurrentDownloads": 0}"#, 400, "invalidArgument"),
            ]
            for (method, path, body, status, code) in cases {
                let answer = try await daemon.send(method, path, json: body)
                #expect(answer.status == status, "\(method) \(path) \(body ?? ""): \(answer.body)")
                #expect(answer.errorCode == code, "\(method) \(path) \(body ?? "")")
                #expect(!answer.body.contains("\n"), "one line")
            }
            #expect(try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).total == 0)
        }
    }

    @Test func theOpenAPIDocumentListsEveryRouteAndIsServedWithoutAToken() async throws {
        try await withDaemon { daemon in
            let answer = try await daemon.send(.GET, "/api/v1/openapi.json", token: .some(nil))
            #expect(answer.status == 200)
            let document = try #require(
                try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])
            #expect(document["openapi"] as? String == "3.1.0")
            let paths = try #require(document["paths"] as? [String: [String: Any]])
            let methods: Set<String> = ["get", "put", "post", "delete", "patch", "head", "options"]
            var documented: [String] = []
            for (path, item) in paths {
                for method in item.keys where methods.contains(method) {
                    documented.append("\(method.uppercased()) \(path)")
                }
            }
            let served = daemon.daemon.routes.map { "\($0.method) /\($0.path)" }
            #expect(documented.sorted() == served.sorted())
            #expect(served.count == 16)
        }
    }

    /// The document and the code cannot drift apart: every field a request writes is described in
    /// the schema of a download to add and of a download shown, each described field is one the
    /// request writes, and a download the API shows has no field its schema leaves out.
    @Test func theDocumentDescribesEveryFieldOfARequestAndADownload() async throws {
        try await withDaemon { daemon in
            let answer = try await daemon.send(.GET, "/api/v1/openapi.json", token: .some(nil))
            let document = try #require(
                try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])
            let schemas = try #require((document["components"] as? [String: Any])?["schemas"] as? [String: Any])
            func properties(_ name: String) throws -> Set<String> {
                let schema = try #require(schemas[name] as? [String: Any])
                return Set(try #require(schema["properties"] as? [String: Any]).keys)
            }
            var full = DownloadRequest(
                url: "http://127.0.0.1:9/a", destination: .file("a"), headers: [("X-Trace", "1")],
                overwrite: true, checksum: try Checksum(parsing: "sha256=" + String(repeating: "0", count: 64)),
                bytesPerSecondLimit: 5, connections: 2, mirrors: ["http://127.0.0.1:9/b"], label: "l")
            full.credentials = BasicCredentials(user: "u", password: "p")
            let encoder = JSONEncoder()
            encoder.userInfo[DownloadRequest.includesSecrets] = true
            var written = try #require(
                try JSONSerialization.jsonObject(with: encoder.encode(full)) as? [String: Any])
            var folder = full
            folder.destination = .directory("d")
            written.merge(
                try #require(try JSONSerialization.jsonObject(with: encoder.encode(folder)) as? [String: Any])
            ) { first, _ in first }
            #expect(Set(written.keys) == Set(DownloadRequest.fieldSchemas.map(\.name)))
            #expect(Set(written.keys).isSubset(of: try properties("NewDownload")))
            #expect(Set(written.keys).isSubset(of: try properties("Download")))

            let id = try await daemon.add(
                #"{"url": "http://127.0.0.1:9/a", "destination": "a", "headers": [{"name": "X-Trace", "value": "1"}], "#
                    + #""overwrite": true, "checksum": "sha256=\#(String(repeating: "0", count: 64))", "#
                    + #""limitRate": 5, "connections": 2, "mirrors": ["http://127.0.0.1:9/b"], "label": "l"}"#)[0]
            let body = try await daemon.send(.GET, "/api/v1/downloads/\(id)").body
            let shown = try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])
            #expect(Set(shown.keys).isSubset(of: try properties("Download")), "\(shown.keys)")
            for field in ["headers", "overwrite", "checksum", "limitRate", "connections", "mirrors", "label"] {
                #expect(shown[field] != nil, "\(field) is shown")
            }
        }
    }

    @Test func metricsCountBytesStatesAndFailures() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "f", size: 100_000))
            try await withDaemon { daemon in
                let ids = try await daemon.add(
                    #"{"url": "\#(server.url("/f"))"}, {"url": "\#(server.url("/missing"))"}"#)
                _ = try await daemon.waitFor(ids[0], "completed")
                _ = try await daemon.waitFor(ids[1], "failed")
                try await waitUntilAsync("the metrics count both") {
                    let text = try await daemon.send(.GET, "/metrics").body
                    return text.contains("haul_failures_total{code=\"httpStatus\"} 1")
                        && text.contains("haul_received_bytes_total 100000\n")
                }
                let answer = try await daemon.send(.GET, "/metrics")
                #expect(answer.headers["Content-Type"].first?.hasPrefix("text/plain; version=0.0.4") == true)
                for line in [
                    "# TYPE haul_received_bytes_total counter", "haul_downloads{state=\"completed\"} 1",
                    "haul_downloads{state=\"failed\"} 1", "haul_downloads{state=\"running\"} 0",
                    "haul_download_speed_bytes_per_second 0",
                ] {
                    #expect(answer.body.split(separator: "\n").contains(Substring(line)), "\(line)")
                }
            }
        }
    }

    @Test func aDownloadAsksForItsConnectionsAndTheMetricsCountThoseOpen() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "wide", size: 6 * 1024 * 1024 + 123)
            server.add("/wide", resource)
            server.setStandingFaults("/wide", [.throttle(bytesPerSecond: 1 << 20)])
            // The daemon's default is one connection: the download's own count decides.
            try await withDaemon({ $0.downloader.segmentation.connections = 1 }) { daemon in
                let answer = try await daemon.send(
                    .POST, "/api/v1/downloads",
                    json: #"{"downloads": [{"url": "\#(server.url("/wide"))", "connections": 3}]}"#)
                #expect(answer.status == 201, "\(answer.body)")
                let id = try #require(try answer.json(DownloadListAnswer.self).downloads.first?.id)
                try await waitUntilAsync("three connections are open") {
                    try await daemon.download(id).openConnections == 3
                }
                #expect(try await daemon.download(id).connections == 3)
                try await waitUntilAsync("the metrics count them") {
                    try await daemon.send(.GET, "/metrics").body.contains("\nhaul_active_connections 3\n")
                }
                server.setStandingFaults("/wide", [])
                let done = try await daemon.waitFor(id, "completed")
                #expect(done.openConnections == nil && done.connections == 3)
                #expect(try readFile(daemon.root + "/wide") == resource.content)
                let ranges = server.requests(for: "/wide").compactMap { $0.header("Range") }
                #expect(Set(ranges.dropFirst().prefix(2)) == ["bytes=2097152-4194303", "bytes=4194304-6291578"])
                #expect(try await daemon.send(.GET, "/metrics").body.contains("\nhaul_active_connections 0\n"))
                for bad in [0, 65] {
                    let refused = try await daemon.send(
                        .POST, "/api/v1/downloads",
                        json: #"{"downloads": [{"url": "\#(server.url("/x"))", "connections": \#(bad)}]}"#)
                    #expect(refused.status == 400 && refused.errorCode == "invalidArgument", "\(refused.body)")
                }
            }
        }
    }

    @Test func aDownloadsMirrorsAreTakenKeptAndUsed() async throws {
        try await withServers(2) { servers in
            let resource = TestResource(name: "mirrored", size: 4 << 20, fixedEntityTag: "\"first\"")
            servers[0].add("/m", resource)
            servers[1].add("/m", TestResource(name: "mirrored", size: 4 << 20, fixedEntityTag: "\"second\""))
            for server in servers { server.setStandingFaults("/m", [.throttle(bytesPerSecond: 4 << 20)]) }
            let checksum = Checksum(algorithm: .sha256, digest: resource.sha256(0..<resource.size))
            try await withDaemon { daemon in
                let answer = try await daemon.send(
                    .POST, "/api/v1/downloads",
                    json:
                        #"{"downloads": [{"url": "\#(servers[0].url("/m"))", "mirrors": ["\#(servers[1].url("/m"))"], "checksum": "\#(checksum)", "connections": 2}]}"#
                )
                #expect(answer.status == 201, "\(answer.body)")
                let id = try #require(try answer.json(DownloadListAnswer.self).downloads.first?.id)
                let done = try await daemon.waitFor(id, "completed")
                #expect(done.mirrors == [servers[1].url("/m")])
                #expect(try readFile(daemon.root + "/m") == resource.content)
                #expect(servers[0].bodyBytesSent > 0 && servers[1].bodyBytesSent > 0)
                let refused = try await daemon.send(
                    .POST, "/api/v1/downloads",
                    json: #"{"downloads": [{"url": "\#(servers[0].url("/x"))", "mirrors": ["ftp://127.0.0.1/x"]}]}"#)
                #expect(refused.status == 400 && refused.errorCode == "unsupportedScheme", "\(refused.body)")
            }
        }
    }

    @Test func optionsAreReadAndChanged() async throws {
        try await withDaemon { daemon in
            let start = try await daemon.send(.GET, "/api/v1/options")
            #expect(start.body == #"{"maxConcurrentDownloads":3,"totalLimitRate":null}"#)
            let changed = try await daemon.send(.PATCH, "/api/v1/options", json: #"{"maxConcurrentDownloads": 5}"#)
            #expect(changed.status == 200)
            #expect(changed.body == #"{"maxConcurrentDownloads":5,"totalLimitRate":null}"#)
            // A field left out stays; null removes the limit.
            let limited = try await daemon.send(.PATCH, "/api/v1/options", json: #"{"totalLimitRate": 1048576}"#)
            #expect(limited.body == #"{"maxConcurrentDownloads":5,"totalLimitRate":1048576}"#)
            #expect(daemon.daemon.manager.rateLimiter.bytesPerSecond == 1_048_576)
            let bad = try await daemon.send(
                .PATCH, "/api/v1/options", json: #"{"maxConcurrentDownloads": 2, "totalLimitRate": 0}"#)
            #expect(bad.status == 400)
            let unlimited = try await daemon.send(.PATCH, "/api/v1/options", json: #"{"totalLimitRate": null}"#)
            #expect(unlimited.body == #"{"maxConcurrentDownloads":5,"totalLimitRate":null}"#)
            #expect(daemon.daemon.manager.rateLimiter.bytesPerSecond == nil)
        }
    }
}

func hex(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef")
    return String(bytes.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0xf)]] })
}

struct StatsAnswer: Decodable {
    let bytesPerSecond: Double
    let bytes: Int64
    let totalBytes: Int64
    let counts: [String: Int]
}

/// Polls an async condition until it holds; fails after `timeout`.
func waitUntilAsync(
    _ what: String, timeout: Duration = .seconds(20), _ condition: () async throws -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while try await !condition() {
        guard ContinuousClock.now < deadline else { throw TestFailure("timed out waiting until \(what)") }
        try await Task.sleep(for: .milliseconds(10))
    }
}
