import Haul
import HaulTestServer
import NIOHTTP1
import Testing

@testable import HaulDaemon

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// aria2's JSON-RPC interface on the daemon: its secret, the access rules it shares with the API,
/// and what Haul does where aria2's queue works otherwise. (`scripts/aria2-rpc-test.py` drives it
/// with aria2p and compares every answer with aria2c's.)
@Suite(.timeLimit(.minutes(1)))
struct Aria2RPCTests {
    /// A call's answer: HTTP status and the JSON-RPC body.
    struct Answer: Decodable {
        struct Failure: Decodable {
            var code: Int
            var message: String
        }
        var error: Failure?
        var result: JSONValue?
    }

    /// The status line of the daemon's answer to a request to open a WebSocket, read without
    /// blocking a thread of the task pool (the daemon in this process needs them to answer).
    static func upgradeAnswer(_ connection: RawConnection) async throws -> String {
        var text = ""
        let deadline = ContinuousClock.now + .seconds(10)
        while !text.contains("\r\n\r\n"), ContinuousClock.now < deadline {
            let (more, closed) = connection.readToEnd(timeout: .milliseconds(1))
            text += more
            if closed { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        return String(text.split(separator: "\r\n").first ?? "")
    }

    static func call(
        _ daemon: DaemonHarness, _ method: String, _ params: String, headers: [(String, String)] = []
    ) async throws -> (status: Int, answer: Answer?) {
        let answer = try await daemon.send(
            .POST, "/jsonrpc", json: #"{"jsonrpc": "2.0", "id": "t", "method": "\#(method)", "params": \#(params)}"#,
            token: .some(nil), headers: headers)
        return (answer.status, try? JSONDecoder().decode(Answer.self, from: Data(answer.body.utf8)))
    }

    @Test func theSecretIsTheDaemonsTokenAndNothingHappensWithoutIt() async throws {
        try await withDaemon { daemon in
            let add = #"["http://127.0.0.1:9/a"]"#
            for secret in [nil, "token:0123456789abcdef0123456789abcdef", "token:" + daemon.token.dropLast() + "x"] {
                let given = secret.map { [#""\#($0)""#] } ?? []
                for (method, rest) in [
                    ("aria2.addUri", [add]), ("aria2.pauseAll", []), ("aria2.tellActive", []),
                    ("aria2.changeGlobalOption", [#"{"max-concurrent-downloads": "7"}"#]),
                ] {
                    let params = "[" + (given + rest).joined(separator: ", ") + "]"
                    let (status, answer) = try await Self.call(daemon, method, params)
                    #expect(status == 400, "\(method) with \(secret ?? "no secret")")
                    #expect(answer?.error?.code == 1 && answer?.error?.message == "Unauthorized")
                }
                // Inside a multicall each call is checked.
                let inner =
                    #"[[{"methodName": "aria2.addUri", "params": [\#((given + [add]).joined(separator: ", "))]}]]"#
                let (_, answer) = try await Self.call(daemon, "system.multicall", inner)
                #expect(answer?.result == .array([.object(["code": .integer(1), "message": "Unauthorized"])]))
            }
            let list = try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self)
            #expect(list.downloads.isEmpty)
            #expect(try await daemon.send(.GET, "/api/v1/options").body.contains(#""maxConcurrentDownloads":3"#))
            // The methods' names need no secret, as in aria2; the token works as the secret.
            #expect(try await Self.call(daemon, "system.listMethods", "[]").status == 200)
            let (status, answer) = try await Self.call(daemon, "aria2.getGlobalStat", #"["token:\#(daemon.token)"]"#)
            #expect(status == 200 && answer?.result?["numActive"] == "0")
        }
    }

    @Test func aPageOfAnotherSiteCannotCallOrListenAndAnotherHostIsRefused() async throws {
        try await withDaemon(live: true) { daemon in
            let params = #"["token:\#(daemon.token)", ["http://127.0.0.1:9/a"]]"#
            for origin in ["http://attacker.example", "null"] {
                let (status, _) = try await Self.call(daemon, "aria2.addUri", params, headers: [("Origin", origin)])
                #expect(status == 403, "Origin: \(origin)")
            }
            let (rebound, _) = try await Self.call(
                daemon, "aria2.addUri", params, headers: [("Host", "attacker.example:\(daemon.port)")])
            #expect(rebound == 421)
            #expect(try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).downloads.isEmpty)

            // A WebSocket opens for the daemon's own origin and for a client without one, not for
            // another site's page or another host name.
            func opening(origin: String?, host: String = "127.0.0.1:\(daemon.port)") async throws -> String {
                let connection = try RawConnection(port: daemon.port)
                defer { connection.close() }
                connection.send(
                    "GET /jsonrpc HTTP/1.1\r\nHost: \(host)\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                        + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                        + (origin.map { "Origin: \($0)\r\n" } ?? "") + "\r\n")
                return try await Self.upgradeAnswer(connection)
            }
            #expect(try await opening(origin: "http://127.0.0.1:\(daemon.port)") == "HTTP/1.1 101 Switching Protocols")
            #expect(try await opening(origin: nil) == "HTTP/1.1 101 Switching Protocols")
            #expect(try await opening(origin: "http://attacker.example") == "HTTP/1.1 400 Bad Request")
            #expect(try await opening(origin: nil, host: "attacker.example") == "HTTP/1.1 400 Bad Request")
        }
    }

    @Test func webSocketsHaveACapOfTheirOwnAndLeaveTheEventStreamsAlone() async throws {
        try await withDaemon({ $0.connections.maximumWebSockets = 2 }, live: true) { daemon in
            func open() async throws -> (RawConnection, String) {
                let connection = try RawConnection(port: daemon.port)
                connection.send(
                    "GET /jsonrpc HTTP/1.1\r\nHost: 127.0.0.1:\(daemon.port)\r\nConnection: Upgrade\r\n"
                        + "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                        + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
                return (connection, try await Self.upgradeAnswer(connection))
            }
            let first = try await open()
            let second = try await open()
            let third = try await open()
            defer { for (connection, _) in [first, second, third] { connection.close() } }
            #expect(first.1 == "HTTP/1.1 101 Switching Protocols" && second.1 == "HTTP/1.1 101 Switching Protocols")
            #expect(third.1 == "HTTP/1.1 400 Bad Request")
            // The page's event stream still opens.
            let events = try await daemon.openEvents()
            #expect(events.status == .ok)
        }
    }

    @Test func eachStateChangeIsToldOnce() {
        var notifier = Aria2Notifier()
        let info = DownloadInfo(
            id: DownloadID(26), request: DownloadRequest(url: "http://127.0.0.1:9/a", destination: .directory("/tmp")),
            destination: nil, state: .running, priority: .normal, bytes: 0, totalBytes: nil, bytesPerSecond: nil,
            secondsRemaining: nil, error: nil, createdAt: Date(), finishedAt: nil, hook: nil)
        func event(_ state: DownloadState, _ kind: DownloadManagerEvent.Kind = .stateChanged) -> DownloadManagerEvent {
            var download = info
            download.state = state
            return DownloadManagerEvent(kind: kind, download: download)
        }
        let start = #"{"jsonrpc":"2.0","method":"aria2.onDownloadStart","params":[{"gid":"000000000000001a"}]}"#
        #expect(notifier.notification(for: event(.running)) == start)
        // The same state written again (progress stored, a hook's result) is not told again.
        #expect(notifier.notification(for: event(.running)) == nil)
        #expect(notifier.notification(for: event(.running, .added)) == nil)
        #expect(notifier.notification(for: event(.paused))?.contains("aria2.onDownloadPause") == true)
        #expect(notifier.notification(for: event(.queued)) == nil)
        #expect(notifier.notification(for: event(.running)) == start)
        #expect(notifier.notification(for: event(.completed))?.contains("aria2.onDownloadComplete") == true)
        #expect(notifier.notification(for: event(.completed)) == nil)
        #expect(notifier.notification(for: event(.failed))?.contains("aria2.onDownloadError") == true)
        #expect(notifier.notification(for: event(.cancelled))?.contains("aria2.onDownloadStop") == true)
    }

    @Test func changePositionMovesADownloadInTheLineThatStarts() async throws {
        try await HaulTestServer.withRunning { server in
            for name in ["a", "b", "c", "d"] { server.add("/" + name, TestResource(name: name, size: 1000)) }
            server.add("/busy", TestResource(name: "busy", size: 4_000_000))
            server.setStandingFaults("/busy", [.throttle(bytesPerSecond: 100_000)])
            try await withDaemon({ $0.manager.maxConcurrentDownloads = 1 }) { daemon in
                let secret = "token:\(daemon.token)"
                func add(_ name: String) async throws -> String {
                    let (_, answer) = try await Self.call(
                        daemon, "aria2.addUri", #"["\#(secret)", ["\#(server.url("/" + name))"]]"#)
                    guard case .string(let gid)? = answer?.result else {
                        throw TestFailure("\(name): \(answer as Any)")
                    }
                    return gid
                }
                let busy = try await add("busy")
                _ = try await daemon.waitFor(Int64(busy, radix: 16)!, "running")
                let (a, b, c, d) = (try await add("a"), try await add("b"), try await add("c"), try await add("d"))
                func line() async throws -> [String] {
                    let (_, answer) = try await Self.call(
                        daemon, "aria2.tellWaiting", #"["\#(secret)", 0, 10, ["gid"]]"#)
                    guard case .array(let rows)? = answer?.result else { throw TestFailure("\(answer as Any)") }
                    return rows.compactMap { if case .string(let gid)? = $0["gid"] { gid } else { nil } }
                }
                func move(_ gid: String, _ position: Int, _ how: String) async throws -> JSONValue? {
                    try await Self.call(
                        daemon, "aria2.changePosition", #"["\#(secret)", "\#(gid)", \#(position), "\#(how)"]"#
                    )
                    .answer?.result
                }
                #expect(try await line() == [a, b, c, d])
                #expect(try await move(d, 0, "POS_SET") == .integer(0))
                #expect(try await line() == [d, a, b, c])
                // Between two of equal priority: those before it move up.
                #expect(try await move(c, 1, "POS_SET") == .integer(1))
                #expect(try await line() == [d, c, a, b])
                #expect(try await move(d, 2, "POS_CUR") == .integer(2))
                #expect(try await line() == [c, a, d, b])
                #expect(try await move(c, -1, "POS_END") == .integer(2))
                #expect(try await line() == [a, d, c, b])
                #expect(try await move(a, 0, "POS_END") == .integer(3))
                #expect(try await line() == [d, c, b, a])
                // A negative offset counts from the end, backwards.
                let (_, tail) = try await Self.call(daemon, "aria2.tellWaiting", #"["\#(secret)", -1, 2, ["gid"]]"#)
                #expect(tail?.result == .array([.object(["gid": .string(a)]), .object(["gid": .string(b)])]))
                // The line is the order they start in: once the busy one is removed, d runs first.
                _ = try await Self.call(daemon, "aria2.remove", #"["\#(secret)", "\#(busy)"]"#)
                _ = try await daemon.waitFor(Int64(a, radix: 16)!, "completed")
                let paths = server.requests.map(\.path)
                let order = ["/d", "/c", "/b", "/a"].map { paths.firstIndex(of: $0) ?? .max }
                #expect(order == order.sorted(), "the waiting downloads started in the line's order: \(paths)")
            }
        }
    }

    @Test func addedPausedItAsksNothingAndHeadersAreNotGivenTwice() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/later", TestResource(name: "later", size: 1000))
            try await withDaemon { daemon in
                let secret = "token:\(daemon.token)"
                let (_, added) = try await Self.call(
                    daemon, "aria2.addUri",
                    #"["\#(secret)", ["\#(server.url("/later"))"], {"pause": "true", "user-agent": "one", "#
                        + #""header": ["User-Agent: two", "X-A: 1"], "referer": "http://127.0.0.1/page"}]"#)
                guard case .string(let gid)? = added?.result, let id = Int64(gid, radix: 16) else {
                    throw TestFailure("\(added as Any)")
                }
                #expect(try await daemon.download(id).state == "paused")
                #expect(server.requests(for: "/later").isEmpty)
                // One User-Agent: the later option wins ("header" comes before "user-agent").
                let shown = try await daemon.send(.GET, "/api/v1/downloads/\(id)").body
                #expect(shown.components(separatedBy: "User-Agent").count == 2, "\(shown)")
                #expect(shown.contains(#""value":"one""#) && !shown.contains(#""value":"two""#), "\(shown)")
                let (_, unpaused) = try await Self.call(daemon, "aria2.unpause", #"["\#(secret)", "\#(gid)"]"#)
                #expect(unpaused?.result == .string(gid))
                _ = try await daemon.waitFor(id, "completed")
                #expect(server.requests(for: "/later").first?.header("user-agent") == "one")
            }
        }
    }

    @Test func aRunningDownloadsLimitChangesWithoutARestart() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "slow", size: 3_000_000)
            server.add("/slow", resource)
            server.setStandingFaults("/slow", [.throttle(bytesPerSecond: 1_000_000)])
            try await withDaemon({ $0.downloader.segmentation.connections = 1 }) { daemon in
                let secret = "token:\(daemon.token)"
                let (_, added) = try await Self.call(
                    daemon, "aria2.addUri",
                    #"["\#(secret)", ["\#(server.url("/slow"))"], {"max-download-limit": "100K"}]"#)
                guard case .string(let gid)? = added?.result, let id = Int64(gid, radix: 16) else {
                    throw TestFailure("\(added as Any)")
                }
                _ = try await daemon.waitFor(id, "running")
                try await waitUntilAsync("bytes arrive") { try await daemon.download(id).bytes > 0 }
                let (_, before) = try await Self.call(daemon, "aria2.getOption", #"["\#(secret)", "\#(gid)"]"#)
                #expect(before?.result?["max-download-limit"] == "102400")
                // Anything else waits for a pause: the running download is left as it is.
                let (refusedStatus, refused) = try await Self.call(
                    daemon, "aria2.changeOption", #"["\#(secret)", "\#(gid)", {"header": "X-B: 2"}]"#)
                #expect(refusedStatus == 400 && refused?.error?.message.contains("pause it first") == true)
                let (status, changed) = try await Self.call(
                    daemon, "aria2.changeOption", #"["\#(secret)", "\#(gid)", {"max-download-limit": "0"}]"#)
                #expect(status == 200 && changed?.result == "OK")
                let (_, options) = try await Self.call(daemon, "aria2.getOption", #"["\#(secret)", "\#(gid)"]"#)
                #expect(options?.result?["max-download-limit"] == "0")
                _ = try await daemon.waitFor(id, "completed", timeout: .seconds(30))
                #expect(try readFile(daemon.root + "/slow") == resource.content)
                // At 100 KiB/s the file would take half a minute: it finished on its first request.
                #expect(server.requests(for: "/slow").count == 1)
            }
        }
    }
}
