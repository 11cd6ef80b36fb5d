import AsyncHTTPClient
import Foundation
import Haul
import HaulTestServer
import NIOHTTP1
import Testing

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

    @Test func pauseAndResumeContinueFromTheStoredBytes() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "slow", size: 2_000_000)
            server.add("/slow", resource)
            server.setStandingFaults("/slow", [.throttle(bytesPerSecond: 2_000_000)])
            try await withDaemon { daemon in
                let id = try await daemon.add(#"{"url": "\#(server.url("/slow"))"}"#)[0]
                _ = try await daemon.waitFor(id, "running")
                try await waitUntilAsync("bytes arrive") { try await daemon.download(id).bytes > 0 }
                let paused = try await daemon.send(.POST, "/api/v1/downloads/\(id)/pause")
                #expect(paused.status == 200, "\(paused.body)")
                #expect(try paused.json(DownloadAnswer.self).state == "paused")
                let kept = try await daemon.download(id).bytes
                #expect(kept > 0 && kept < 2_000_000)
                server.setStandingFaults("/slow", [])
                let resumed = try await daemon.send(.POST, "/api/v1/downloads/\(id)/resume")
                #expect(resumed.status == 200)
                #expect(try ["queued", "running"].contains(resumed.json(DownloadAnswer.self).state))
                _ = try await daemon.waitFor(id, "completed")
                #expect(try readFile(daemon.root + "/slow") == resource.content)
                // The resume asked for the rest, with the validator.
                let last = try #require(server.requests(for: "/slow").last)
                #expect(last.header("range") == "bytes=\(kept)-" || (last.header("range")?.hasPrefix("bytes=") == true))
                #expect(last.header("if-range") == resource.entityTagValue)
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
                try await waitUntilAsync("every download has failed") {
                    try await daemon.send(.GET, "/api/v1/downloads?state=failed").json(DownloadListAnswer.self).total
                        == 5
                }
                let some = try await daemon.send(.GET, "/api/v1/downloads?state=failed,completed&limit=3")
                #expect(try some.json(DownloadListAnswer.self).downloads.count == 3)
            }
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
            #expect(served.count == 14)
        }
    }

    @Test func optionsAreReadAndChanged() async throws {
        try await withDaemon { daemon in
            #expect(try await daemon.send(.GET, "/api/v1/options").json(OptionsAnswer.self).maxConcurrentDownloads == 3)
            let changed = try await daemon.send(.PATCH, "/api/v1/options", json: #"{"maxConcurrentDownloads": 5}"#)
            #expect(changed.status == 200)
            #expect(try changed.json(OptionsAnswer.self).maxConcurrentDownloads == 5)
            #expect(try await daemon.send(.GET, "/api/v1/options").json(OptionsAnswer.self).maxConcurrentDownloads == 5)
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

struct OptionsAnswer: Decodable {
    let maxConcurrentDownloads: Int?
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
