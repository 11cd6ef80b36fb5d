import AsyncHTTPClient
import Haul
import HaulTestServer
import NIOCore
import Testing

@testable import HaulDaemon

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif
#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// `--webhook URL`: an event POSTed once per end, retried on the daemon's clock, with no credential.
@Suite(.timeLimit(.minutes(1)))
struct DaemonWebhookTests {
    /// The JSON a receiver gets.
    struct Event: Decodable {
        struct Download: Decodable {
            var id: Int64
            var gid: String
            var name: String
            var url: String
            var file: String?
            var bytes: Int64
            var error: DownloadAnswer.Failure?
        }
        var event: String
        var title: String
        var message: String
        var priority: Int
        var download: Download
    }

    static func events(_ server: HaulTestServer, _ path: String) throws -> [Event] {
        try server.requests(for: path).filter { $0.method == "POST" }.map {
            try JSONDecoder().decode(Event.self, from: Data($0.body))
        }
    }

    @Test func aCompletionAndAFailureAreEachPostedOnceWithoutCredentials() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/file.iso", TestResource(name: "file.iso", size: 20_000))
            server.add("/hook", TestResource(name: "hook", size: 2))
            // A program hook too: its recorded result changes the download again, and must not
            // send the event a second time.
            try await withTemporaryDirectory { directory in
                let program = directory + "/hook.sh"
                try Data("#!/bin/sh\nexit 0\n".utf8).write(to: URL(fileURLWithPath: program))
                chmod(program, 0o755)
                try await withDaemon({
                    $0.webhooks = [server.url("/hook") + "?token=receivers-own"]
                    $0.hooks.onComplete = program
                    $0.hooks.onError = program
                }) { daemon in
                    let url = server.url("/file.iso") + "?signature=s3cr3t-signature"
                    let done = try await daemon.add(
                        #"{"url": "\#(url)", "headers": [{"name": "Authorization", "value": "Bearer t0ken-value"}]}"#)[
                            0]
                    let failed = try await daemon.add(#"{"url": "\#(server.url("/missing"))"}"#)[0]
                    _ = try await daemon.waitFor(done, "completed")
                    _ = try await daemon.waitFor(failed, "failed")
                    try await waitUntilAsync("both hooks' results are recorded") {
                        let first = try await daemon.download(done).hook
                        let second = try await daemon.download(failed).hook
                        return first != nil && second != nil
                    }
                    try await waitUntil("both events arrive") { (try? Self.events(server, "/hook").count) == 2 }
                    let events = try Self.events(server, "/hook")
                    let completed = try #require(events.first { $0.event == "completed" })
                    #expect(completed.download.id == done && completed.download.gid == Aria2RPC.gid(DownloadID(done)))
                    #expect(completed.download.name == "file.iso" && completed.download.bytes == 20_000)
                    #expect(completed.download.file == daemon.root + "/file.iso")
                    #expect(completed.download.url == server.url("/file.iso"))
                    #expect(completed.title == "Haul: file.iso completed" && completed.priority == 5)
                    let failure = try #require(events.first { $0.event == "failed" })
                    #expect(failure.download.id == failed && failure.download.error?.code == "httpStatus")
                    #expect(failure.message == "missing failed: the server answered 404 Not Found")
                    // Nothing a credential: not the header, not the link's signature.
                    for request in server.requests(for: "/hook") {
                        let text = String(decoding: request.body, as: UTF8.self)
                        #expect(!text.contains("t0ken") && !text.contains("s3cr3t"), "\(text)")
                        #expect(request.header("authorization") == nil && request.header("cookie") == nil)
                        #expect(["Haul: file.iso completed", "Haul: missing failed"].contains(request.header("title")))
                        #expect(request.uri.hasSuffix("?token=receivers-own"))
                    }
                    // Still once each, after the hooks' results changed the downloads: a third download's
                    // event, sent after theirs, is the third and last.
                    let third = try await daemon.add(
                        #"{"url": "\#(server.url("/file.iso"))", "destination": "again.iso"}"#)[0]
                    _ = try await daemon.waitFor(third, "completed")
                    try await waitUntil("the third event arrives") { server.requests(for: "/hook").count >= 3 }
                    try await waitUntilAsync("its hook's result is recorded") {
                        try await daemon.download(third).hook != nil
                    }
                    #expect(server.requests(for: "/hook").count == 3)
                    #expect(
                        try Self.events(server, "/hook").map(\.download.id).sorted() == [done, failed, third].sorted())
                }
            }
        }
    }

    @Test func aReceiverThatFailsIsTriedAgainOnTheClockAndOneThatRefusesIsNot() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/busy", TestResource(name: "busy", size: 2))
            server.add("/gone", TestResource(name: "gone", size: 2))
            server.script("/busy", [[.status(503)], [.status(429)], []])
            server.setStandingFaults("/gone", [.status(404)])
            // The sender alone on its clock: each sleep there is one of its waits.
            let clock = ManualClock()
            let logs = LogRecorder(level: .trace)
            let sender = WebhookSender(urls: [], logger: logs.logger, clock: clock)
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            let body = ByteBuffer(string: #"{"event": "completed"}"#)
            async let busy: Void = sender.deliver(body, title: "t", to: server.url("/busy"), with: client)
            async let gone: Void = sender.deliver(body, title: "t", to: server.url("/gone"), with: client)
            // The second try waits a second on the clock, the third two more.
            try await clock.waitForSleep(until: .seconds(1))
            #expect(server.requests(for: "/busy").count == 1)
            clock.advance(by: .milliseconds(999))
            #expect(server.requests(for: "/busy").count == 1)
            clock.advance(by: .milliseconds(1))
            try await clock.waitForSleep(until: .seconds(3))
            #expect(server.requests(for: "/busy").count == 2)
            clock.advance(by: .seconds(2))
            _ = await (busy, gone)
            #expect(
                server.requests(for: "/busy").map(\.body) == Array(repeating: Array(body.readableBytesView), count: 3))
            #expect(clock.requestedSleeps == [.seconds(1), .seconds(2)])
            // The 404 was never tried again.
            #expect(server.requests(for: "/gone").count == 1)
            #expect(logs.all.contains { $0.1.contains("refused the event with 404; it is not sent again") })
            #expect(logs.all.contains { $0.1.contains("took the event (200)") })
            try await client.shutdown()
        }
    }

    @Test func noURLsQueryReachesAReceiverOrTheLog() {
        #expect(
            WebhookSender.withoutQueries(in: "redirect loop at https://a.example/f?X-Amz-Signature=s3cr3t#x (3 times)")
                == "redirect loop at https://a.example/f (3 times)")
        #expect(WebhookSender.receiver("https://user:pw@ntfy.example/secret-topic?auth=t") == "https://ntfy.example")
    }

    @Test func aWebhookThatIsNotAnHTTPURLIsRefusedAtStart() async throws {
        for given in ["ftp://example.com/hook", "example.com/hook", "http:///hook"] {
            await #expect(throws: HaulError.self, "\(given)") {
                try await withDaemon({ $0.webhooks = [given] }) { _ in }
            }
        }
    }
}
