import AsyncHTTPClient
import Foundation
import Haul
import HaulTestServer
import NIOHTTP1
import Synchronization
import Testing

@testable import HaulDaemon

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Each rule of the daemon's access checks, with a test that fails when the rule is removed.
@Suite(.timeLimit(.minutes(1)))
struct DaemonSecurityTests {
    /// Every API route, with a body where it needs one.
    static let routes: [(HTTPMethod, String, String?)] = [
        (.GET, "/api/v1/downloads", nil),
        (.POST, "/api/v1/downloads", #"{"downloads": [{"url": "http://127.0.0.1:9/a"}]}"#),
        (.GET, "/api/v1/downloads/1", nil),
        (.POST, "/api/v1/downloads/1/pause", nil),
        (.POST, "/api/v1/downloads/1/resume", nil),
        (.POST, "/api/v1/downloads/1/retry", nil),
        (.DELETE, "/api/v1/downloads/1", nil),
        (.POST, "/api/v1/pause-all", nil),
        (.POST, "/api/v1/resume-all", nil),
        (.GET, "/api/v1/options", nil),
        (.PATCH, "/api/v1/options", #"{"maxConcurrentDownloads": 7}"#),
        (.GET, "/api/v1/stats", nil),
        (.GET, "/api/v1/rules", nil),
        (.PUT, "/api/v1/rules", #"{"startWindows": [{"from": "01:00", "to": "02:00"}]}"#),
        (.GET, "/api/v1/events", nil),
        (.GET, "/metrics", nil),
    ]

    @Test func everyRouteNeedsTheTokenAndDoesNothingWithoutIt() async throws {
        try await withDaemon { daemon in
            for (method, path, body) in Self.routes {
                for token: String? in [nil, "0123456789abcdef0123456789abcdef", String(daemon.token.dropLast()) + "x"] {
                    let answer = try await daemon.send(method, path, json: body, token: .some(token))
                    #expect(answer.status == 401, "\(method) \(path) with token \(token ?? "none")")
                    #expect(answer.errorCode == "unauthorized")
                    #expect(answer.headers["WWW-Authenticate"].first?.hasPrefix("Bearer") == true)
                }
            }
            // Nothing was added or changed.
            let list = try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self)
            #expect(list.downloads.isEmpty)
            #expect(try await daemon.send(.GET, "/api/v1/options").body.contains(#""maxConcurrentDownloads":3"#))
            // The right token works, also with a scheme written in another case.
            let lower = try await daemon.send(
                .GET, "/api/v1/stats", token: .some(nil), headers: [("Authorization", "bearer \(daemon.token)")])
            #expect(lower.status == 200)
        }
    }

    @Test func aRequestForAnotherHostNameIsRefusedAsDNSRebinding() async throws {
        try await withDaemon({ $0.allowedHosts = ["nas.home.arpa"] }, live: true) { daemon in
            let add = #"{"downloads": [{"url": "http://127.0.0.1:9/a"}]}"#
            for host in ["attacker.example:\(daemon.port)", "attacker.example", "127.0.0.1.attacker.example"] {
                let answer = try await daemon.send(.POST, "/api/v1/downloads", json: add, headers: [("Host", host)])
                #expect(answer.status == 421, "Host: \(host)")
                #expect(answer.errorCode == "forbiddenHost")
            }
            #expect(try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).downloads.isEmpty)
            for host in [
                "localhost:\(daemon.port)", "127.0.0.1:\(daemon.port)", "LOCALHOST", "nas.home.arpa:\(daemon.port)",
            ] {
                let answer = try await daemon.send(.GET, "/api/v1/stats", headers: [("Host", host)])
                #expect(answer.status == 200, "Host: \(host)")
            }
        }
    }

    @Test func aPageOfAnotherSiteCannotChangeAnything() async throws {
        try await withDaemon(live: true) { daemon in
            let add = #"{"downloads": [{"url": "http://127.0.0.1:9/a"}]}"#
            for origin in ["http://attacker.example", "null", "http://localhost:\(daemon.port + 1)"] {
                let answer = try await daemon.send(.POST, "/api/v1/downloads", json: add, headers: [("Origin", origin)])
                #expect(answer.status == 403, "Origin: \(origin)")
                #expect(answer.errorCode == "forbiddenOrigin")
                let patch = try await daemon.send(
                    .PATCH, "/api/v1/options", json: #"{"maxConcurrentDownloads": 9}"#, headers: [("Origin", origin)])
                #expect(patch.status == 403)
            }
            #expect(try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).downloads.isEmpty)
            // The daemon's own page may.
            let own = try await daemon.send(
                .POST, "/api/v1/downloads", json: add, headers: [("Origin", "http://127.0.0.1:\(daemon.port)")])
            #expect(own.status == 201, "\(own.body)")
        }
    }

    @Test func anOriginGivenWithAllowOriginMayChangeTheQueueWithTheToken() async throws {
        let extensionOrigin = "chrome-extension://abcdefghijklmnopabcdefghijklmnop"
        try await withDaemon({ $0.allowedOrigins = [extensionOrigin] }, live: true) { daemon in
            let add = #"{"downloads": [{"url": "http://127.0.0.1:9/a"}]}"#
            let other = try await daemon.send(
                .POST, "/api/v1/downloads", json: add,
                headers: [("Origin", "chrome-extension://ponmlkjihgfedcbaponmlkjihgfedcba")])
            #expect(other.status == 403 && other.errorCode == "forbiddenOrigin")
            let tokenless = try await daemon.send(
                .POST, "/api/v1/downloads", json: add, token: .some(nil), headers: [("Origin", extensionOrigin)])
            #expect(tokenless.status == 401)
            #expect(try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).downloads.isEmpty)
            let allowed = try await daemon.send(
                .POST, "/api/v1/downloads", json: add, headers: [("Origin", extensionOrigin)])
            #expect(allowed.status == 201, "\(allowed.body)")
        }
        // Only an origin is taken: a URL with a path, or a bare name, is refused at start.
        for given in ["https://example.com/page", "example.com", "chrome-extension://"] {
            await #expect(throws: HaulError.self, "\(given)") {
                try await withDaemon({ $0.allowedOrigins = [given] }) { _ in }
            }
        }
    }

    @Test func thePageIsServedWithoutATokenAndMayNotBeFramed() async throws {
        try await withDaemon(live: true) { daemon in
            for (path, type) in [("/", "text/html"), ("/app.js", "text/javascript"), ("/app.css", "text/css")] {
                let answer = try await daemon.send(.GET, path, token: .some(nil))
                #expect(answer.status == 200, "\(path)")
                #expect(answer.headers["Content-Type"].first?.hasPrefix(type) == true, "\(path)")
                #expect(!answer.body.contains(daemon.token))
            }
            // Every answer, errors too, forbids framing and foreign scripts.
            for path in ["/", "/api/v1/stats"] {
                let answer = try await daemon.send(.GET, path, token: .some(nil))
                let policy = answer.headers["Content-Security-Policy"].first ?? ""
                #expect(policy.contains("frame-ancestors 'none'") && policy.contains("script-src 'self'"), "\(path)")
                #expect(answer.headers["X-Frame-Options"].first == "DENY")
                #expect(answer.headers["X-Content-Type-Options"].first == "nosniff")
            }
            // The page's Host rule holds for it as for the API.
            let rebound = try await daemon.send(.GET, "/", token: .some(nil), headers: [("Host", "attacker.example")])
            #expect(rebound.status == 421)
        }
    }

    @Test func requestsOverTheRateCapGet429AndDoNothing() async throws {
        let clock = ManualClock()
        try await withDaemon({ $0.requestsPerSecond = 10 }, clock: clock) { daemon in
            // Twice the rate at once, then nothing until the clock moves.
            for index in 0..<20 {
                #expect(try await daemon.send(.GET, "/api/v1/stats").status == 200, "request \(index)")
            }
            let refused = try await daemon.send(
                .POST, "/api/v1/downloads", json: #"{"downloads": [{"url": "http://127.0.0.1:9/a"}]}"#)
            #expect(refused.status == 429 && refused.errorCode == "tooManyRequests")
            #expect(refused.headers["Retry-After"].first == "1")
            // A tenth of a second later, one more.
            clock.advance(by: .milliseconds(100))
            #expect(try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).total == 0)
            #expect(try await daemon.send(.GET, "/api/v1/stats").status == 429)
        }
    }

    @Test func aBodyOverTheCapIsRefusedUnread() async throws {
        try await withDaemon({ $0.maxBodyBytes = 4096 }) { daemon in
            let padding = String(repeating: " ", count: 5000)
            let answer = try await daemon.send(
                .POST, "/api/v1/downloads", json: #"{"downloads": [{"url": "http://127.0.0.1:9/a"}]}"# + padding)
            #expect(answer.status == 413)
            #expect(answer.errorCode == "bodyTooLarge")
            #expect(try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).downloads.isEmpty)
        }
    }

    @Test func destinationsOutsideTheDownloadRootsAreRefused() async throws {
        try await withDaemon { daemon in
            // Beside the root, in the test's temporary directory.
            let outside = String(daemon.root.dropLast("files".count)) + "outside"
            mkdir(outside, 0o755)
            symlink(outside, daemon.root + "/link")
            let refused: [(String, Int, String)] = [
                (#""destination": "/etc/passwd.copy""#, 403, "outsideDownloadRoot"),
                (#""destination": "\#(outside)/authorized_keys""#, 403, "outsideDownloadRoot"),
                (#""directory": "/tmp""#, 403, "outsideDownloadRoot"),
                (#""destination": "link/authorized_keys""#, 403, "outsideDownloadRoot"),
                (#""directory": "link/deeper""#, 403, "outsideDownloadRoot"),
                (#""destination": "../escape""#, 403, "outsideDownloadRoot"),
                (#""destination": "a/../../escape""#, 403, "outsideDownloadRoot"),
                // The slash before a combining mark still separates (the mark joins it in one character).
                (#""destination": "../\u0301escape""#, 403, "outsideDownloadRoot"),
                (#""directory": "a/../../\u0301x""#, 403, "outsideDownloadRoot"),
            ]
            for (field, status, code) in refused {
                let answer = try await daemon.send(
                    .POST, "/api/v1/downloads", json: #"{"downloads": [{"url": "http://127.0.0.1:9/a", \#(field)}]}"#)
                #expect(answer.status == status, "\(field): \(answer.body)")
                #expect(answer.errorCode == code, "\(field)")
            }
            // One bad item refuses the whole request.
            let mixed = try await daemon.send(
                .POST, "/api/v1/downloads",
                json:
                    #"{"downloads": [{"url": "http://127.0.0.1:9/a"}, {"url": "http://127.0.0.1:9/b", "destination": "/etc/b"}]}"#
            )
            #expect(mixed.status == 403 && mixed.body.contains("downloads.1"))
            #expect(try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListAnswer.self).downloads.isEmpty)
            // Hidden files and directories (keys, settings) are refused inside the root too.
            for field in [
                #""destination": ".bashrc""#, #""destination": ".ssh/authorized_keys""#, #""directory": "a/.config""#,
            ] {
                let answer = try await daemon.send(
                    .POST, "/api/v1/downloads", json: #"{"downloads": [{"url": "http://127.0.0.1:9/a", \#(field)}]}"#)
                #expect(answer.status == 403 && answer.errorCode == "outsideDownloadRoot", "\(field)")
            }
            // Inside the root: relative paths start there.
            let ids = try await daemon.add(#"{"url": "http://127.0.0.1:9/a", "destination": "sub/a.bin"}"#)
            #expect(try await daemon.download(ids[0]).destination == daemon.root + "/sub/a.bin")
        }
    }

    @Test func theStateDirectoryIsNeverADestinationEvenInsideARoot() async throws {
        try await withTemporaryDirectory { directory in
            // The state directory inside the download root, as with a root of the home directory.
            try await withDaemon({ $0.downloadRoots = [directory] }, stateDirectory: directory + "/state") { daemon in
                for field in [#""destination": "state/daemon.token""#, #""directory": "state""#] {
                    let answer = try await daemon.send(
                        .POST, "/api/v1/downloads",
                        json: #"{"downloads": [{"url": "http://127.0.0.1:9/a", "overwrite": true, \#(field)}]}"#)
                    #expect(answer.status == 403 && answer.errorCode == "outsideDownloadRoot", "\(field)")
                }
                #expect(try await daemon.add(#"{"url": "http://127.0.0.1:9/a", "destination": "ok.bin"}"#).count == 1)
            }
        }
    }

    /// On Linux, "café" spelt with a combined é and with an e and an accent are two folders, though
    /// Swift's `==` takes them for one: the API's roots hold the paths their bytes hold (the
    /// manager's confinement refuses such a path too, see ``ConfinementTests``).
    #if os(Linux)
        @Test func aRootHoldsThePathsItsBytesHold() async throws {
            try await withTemporaryDirectory { directory in
                let root = directory + "/caf\u{E9}"
                let twin = directory + "/cafe\u{301}"
                mkdir(root, 0o755)
                mkdir(twin, 0o755)
                let roots = try DownloadRoots([root])
                #expect {
                    try roots.confine(twin + "/f", isDirectory: false)
                } throws: { error in
                    (error as? APIError)?.code == HaulError.Code.outsideDownloadRoot.name
                }
                #expect(try roots.confine(root + "/f", isDirectory: false).utf8.elementsEqual((root + "/f").utf8))
            }
        }
    #endif

    @Test func aRootOfSlashAcceptsAnyPathButHiddenOnes() throws {
        let roots = try DownloadRoots(["/"])
        #expect(try roots.confine("/srv/files/a.iso", isDirectory: false) == "/srv/files/a.iso")
        #expect(try roots.confine(".", isDirectory: true) == "/")
        #expect(throws: APIError.self) { try roots.confine("/root/.ssh/authorized_keys", isDirectory: false) }
    }

    @Test func theTokenFileIsPrivateAndTheTokenAppearsInNoLogAndNoDatabase() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "f", size: 100_000))
            try await withDaemon { daemon in
                var status = stat()
                #expect(stat(daemon.stateDirectory + "/" + DaemonFiles.tokenName, &status) == 0)
                #expect(status.st_mode & 0o777 == 0o600)
                let ids = try await daemon.add(#"{"url": "\#(server.url("/f"))"}"#)
                _ = try await daemon.waitFor(ids[0], "completed")
                _ = try await daemon.send(.GET, "/api/v1/downloads/999")
                _ = try await daemon.send(.GET, "/api/v1/stats", token: .some("wrong"))
                #expect(!daemon.logs.wholeLines.isEmpty)
                for line in daemon.logs.wholeLines { #expect(!line.contains(daemon.token), "\(line)") }
                for name in listDirectory(daemon.stateDirectory) where name != DaemonFiles.tokenName {
                    let bytes = (try? readFile(daemon.stateDirectory + "/" + name)) ?? []
                    #expect(!String(decoding: bytes, as: UTF8.self).contains(daemon.token), "\(name)")
                }
            }
        }
    }

    @Test func aTokenFileOthersCanReadIsRefused() async throws {
        try await withTemporaryDirectory { directory in
            let token = try DaemonFiles.token(in: directory)
            #expect(try DaemonFiles.token(in: directory) == token)
            chmod(directory + "/" + DaemonFiles.tokenName, 0o644)
            #expect {
                try DaemonFiles.token(in: directory)
            } throws: { error in
                (error as? HaulError)?.message.contains("chmod 600") == true
            }
        }
    }

    @Test func tokensCompareWholly() {
        let token = "0123456789abcdef0123456789abcdef"
        #expect(DaemonFiles.tokensMatch(token, token))
        #expect(!DaemonFiles.tokensMatch(String(token.dropLast()), token))
        #expect(!DaemonFiles.tokensMatch(token + "0", token))
        #expect(!DaemonFiles.tokensMatch("", token))
        #expect(!DaemonFiles.tokensMatch("1123456789abcdef0123456789abcdef", token))
    }

    @Test func aSecondDaemonOnTheSameStateDirectoryNamesTheFirst() async throws {
        try await withTemporaryDirectory { directory in
            try await withDaemon(stateDirectory: directory, live: true) { daemon in
                #expect(DaemonFiles.runningDaemon(in: directory)?.url == daemon.url)
                #expect {
                    try Daemon(options: Daemon.Options(stateDirectory: directory, downloadRoots: [daemon.root]))
                } throws: { error in
                    guard let error = error as? HaulError else { return false }
                    return error.code == .locked && error.message.contains(daemon.url)
                        && error.message.contains("pid \(getpid())")
                }
            }
            // Stopped: no daemon is found, and another starts.
            #expect(DaemonFiles.runningDaemon(in: directory) == nil)
            try await withDaemon(stateDirectory: directory, live: true) { daemon in
                #expect(DaemonFiles.runningDaemon(in: directory)?.url == daemon.url)
            }
        }
    }

    /// A daemon that finds its state directory locked closes the lock file it opened, once: a
    /// second close would close whatever another thread opened meanwhile under the same number
    /// (in a daemon, a download's socket or file). Another thread opens and checks descriptors
    /// while the lock is refused again and again.
    @Test func aRefusedLockClosesOnlyItsOwnDescriptor() async throws {
        try await withTemporaryDirectory { directory in
            let held = try DaemonLock(stateDirectory: directory)
            let stop = Atomic(false)
            let lost = Atomic(0)
            let checked = Atomic(0)
            let checker = Thread {
                while !stop.load(ordering: .acquiring) {
                    let descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC)
                    guard descriptor >= 0 else { continue }
                    // Held for a moment, as a socket would be, and looked at all along.
                    var open = true
                    for _ in 0..<200 where open { open = fcntl(descriptor, F_GETFD) != -1 }
                    if open { close(descriptor) } else { lost.add(1, ordering: .relaxed) }
                    checked.add(1, ordering: .relaxed)
                }
            }
            checker.start()
            for _ in 0..<3_000 {
                #expect(throws: HaulError.self) { try DaemonLock(stateDirectory: directory) }
            }
            stop.store(true, ordering: .releasing)
            while !checker.isFinished { try await Task.sleep(for: .milliseconds(1)) }
            #expect(checked.load(ordering: .relaxed) > 0)
            #expect(lost.load(ordering: .relaxed) == 0, "descriptors of another thread were closed")
            withExtendedLifetime(held) {}
        }
    }

    @Test func listeningBeyondLoopbackNeedsToBeAllowed() async throws {
        try await withTemporaryDirectory { directory in
            var options = Daemon.Options(stateDirectory: directory + "/state", downloadRoots: [directory])
            options.host = "0.0.0.0"
            #expect {
                try Daemon(options: options)
            } throws: { error in
                (error as? HaulError)?.code == .invalidArgument
            }
            for host in ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"] {
                #expect(Daemon.isLoopback(host), "\(host)")
            }
            // Names that only look like loopback addresses may resolve anywhere.
            for host in ["0.0.0.0", "::", "192.168.1.2", "127.evil.example", "127.0.0.1.nip.io", "::2"] {
                #expect(!Daemon.isLoopback(host), "\(host)")
            }
        }
    }
}
