import AsyncHTTPClient
import Haul
import HaulTestServer
import NIOCore
import NIOHTTP1
import Testing

@testable import HaulDaemon

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One parsed Server-Sent Event.
struct ReceivedEvent: Sendable {
    var id: String?
    var name: String
    var data: String

    var download: DownloadAnswer? {
        struct Body: Decodable { let download: DownloadAnswer }
        return (try? JSONDecoder.api.decode(Body.self, from: Data(data.utf8)))?.download
    }
}

/// Reads `text/event-stream` from the daemon, one event at a time.
final class EventReader: @unchecked Sendable {
    // Used by one test task at a time.
    private var iterator: HTTPClientResponse.Body.AsyncIterator
    private var pending = ""
    let status: Int

    init(_ daemon: DaemonHarness, lastEventID: String? = nil) async throws {
        let response = try await daemon.openEvents(lastEventID: lastEventID)
        status = Int(response.status.code)
        iterator = response.body.makeAsyncIterator()
    }

    /// The next event (comments and the `retry` field skipped); `nil` when the stream ends.
    func next() async throws -> ReceivedEvent? {
        while true {
            if let end = pending.range(of: "\n\n") {
                let block = String(pending[..<end.lowerBound])
                pending = String(pending[end.upperBound...])
                var event = ReceivedEvent(id: nil, name: "message", data: "")
                var isEvent = false
                for line in block.split(separator: "\n", omittingEmptySubsequences: false) {
                    if line.hasPrefix("id: ") { event.id = String(line.dropFirst(4)) }
                    if line.hasPrefix("event: ") {
                        event.name = String(line.dropFirst(7))
                        isEvent = true
                    }
                    if line.hasPrefix("data: ") { event.data = String(line.dropFirst(6)) }
                }
                if isEvent { return event }
                continue
            }
            guard let buffer = try await iterator.next() else { return nil }
            pending += String(buffer: buffer)
        }
    }

    /// Reads events until one satisfies `condition`; returns them all, that one last.
    func read(until condition: (ReceivedEvent) -> Bool) async throws -> [ReceivedEvent] {
        var events: [ReceivedEvent] = []
        while let event = try await next() {
            events.append(event)
            if condition(event) { return events }
        }
        throw TestFailure("the event stream ended after \(events.map(\.name))")
    }
}

@Suite(.timeLimit(.minutes(1)))
struct DaemonEventTests {
    @Test func theStreamShowsEveryChangeAndAReconnectMissesNone() async throws {
        try await HaulTestServer.withRunning { server in
            let first = TestResource(name: "first", size: 400_000)
            let second = TestResource(name: "second", size: 300_000)
            server.add("/first", first)
            server.add("/second", second)
            try await withDaemon(live: true) { daemon in
                let reader = try await EventReader(daemon)
                #expect(reader.status == 200)
                let id = try await daemon.add(#"{"url": "\#(server.url("/first"))"}"#)[0]
                let events = try await reader.read { $0.name == "state" && $0.download?.state == "completed" }
                #expect(events.allSatisfy { $0.download?.id == id })
                #expect(events.first?.name == "added")
                let states = events.filter { $0.name == "state" }.compactMap { $0.download?.state }
                #expect(states.last == "completed" && states.contains("running"), "\(states)")
                #expect(events.last?.download?.bytes == 400_000)
                let numbers = events.compactMap { $0.id?.split(separator: "-").last.flatMap { UInt64($0) } }
                #expect(numbers == Array(numbers[0]..<numbers[0] + UInt64(numbers.count)), "no gaps")
                let lastSeen = try #require(events.last?.id)

                // While nobody listens, a second download runs to its end.
                let secondID = try await daemon.add(#"{"url": "\#(server.url("/second"))"}"#)[0]
                _ = try await daemon.waitFor(secondID, "completed")
                let again = try await EventReader(daemon, lastEventID: lastSeen)
                let missed = try await again.read { $0.download?.id == secondID && $0.download?.state == "completed" }
                #expect(missed.first?.name == "added" && missed.first?.download?.id == secondID)
                let after = missed.compactMap { $0.id?.split(separator: "-").last.flatMap { UInt64($0) } }
                #expect(after.first == numbers.last! + 1, "the replay starts right after the last event seen")
                #expect(missed.contains { $0.name == "state" && $0.download?.state == "running" })
            }
        }
    }

    @Test func anUnknownLastEventIDGetsAReset() async throws {
        try await withDaemon(live: true) { daemon in
            for lastEventID in ["other-5", "garbage", "\(UInt64.max)"] {
                let reader = try await EventReader(daemon, lastEventID: lastEventID)
                let first = try await reader.next()
                #expect(first?.name == "reset", "Last-Event-ID: \(lastEventID)")
            }
        }
    }

    @Test func anIdleStreamSendsKeepAliveComments() async throws {
        try await withDaemon({ $0.keepAlive = .milliseconds(20) }, live: true) { daemon in
            let response = try await daemon.openEvents()
            #expect(response.headers["Content-Type"].first?.hasPrefix("text/event-stream") == true)
            var text = ""
            for try await buffer in response.body {
                text += String(buffer: buffer)
                if text.components(separatedBy: ": keep-alive").count > 2 { break }
            }
            #expect(text.hasPrefix("retry: "))
        }
    }

    @Test func theEventsRouteNeedsTheToken() async throws {
        try await withDaemon(live: true) { daemon in
            let answer = try await daemon.send(.GET, "/api/v1/events", token: .some(nil))
            #expect(answer.status == 401)
        }
    }
}

/// The hub's ring and listeners, without sockets.
struct EventHubTests {
    @Test func aListenerGetsWhatItMissedWhileTheRingHoldsIt() async {
        let hub = EventHub(capacity: 3)
        for index in 1...5 { hub.publish("state", "{\"n\":\(index)}") }
        // The ring holds 3, 4 and 5.
        let (fromThree, position, _) = hub.listen(after: 2)
        #expect(fromThree == .replay([3, 4, 5].map { EventHub.Event(id: $0, name: "state", data: "{\"n\":\($0)}") }))
        // Every event up to the last one published is in the replay or the stream.
        #expect(position == 5)
        let (fromFour, _, _) = hub.listen(after: 4)
        #expect(fromFour == .replay([EventHub.Event(id: 5, name: "state", data: "{\"n\":5}")]))
        let (upToDate, _, _) = hub.listen(after: 5)
        #expect(upToDate == .replay([]))
        // Event 2 fell out of the ring: whoever saw only 1 must reload.
        let (tooOld, _, _) = hub.listen(after: 1)
        #expect(tooOld == .reset)
        let (future, _, _) = hub.listen(after: 6)
        #expect(future == .reset)
        #expect(hub.number(ofLastEventID: "\(hub.run)-4") == 4)
        #expect(hub.number(ofLastEventID: "x\(hub.run)-4") == nil)
        // Nothing seen of this run: a new client gets only new events, a returning one a reset.
        #expect(hub.listen(after: nil, fresh: true).0 == .replay([]))
        #expect(hub.listen(after: nil).0 == .reset)
    }

    @Test func aListenerThatFallsTooFarBehindIsCutOff() async {
        let hub = EventHub(capacity: 10)
        let (_, _, stream) = hub.listen(after: nil, fresh: true)
        for index in 0..<(EventHub.listenerBuffer + 1) { hub.publish("progress", "\(index)") }
        var received = 0
        for await _ in stream { received += 1 }
        // Its stream ended after what it could hold; reconnecting replays or resets.
        #expect(received == EventHub.listenerBuffer)
    }

    @Test func closingEndsEveryListener() async {
        let hub = EventHub()
        let (_, _, stream) = hub.listen(after: nil)
        hub.publish("added", "{}")
        hub.close()
        var names: [String] = []
        for await event in stream { names.append(event.name) }
        #expect(names == ["added"])
        let (_, _, late) = hub.listen(after: nil)
        for await _ in late { Issue.record("a closed hub sends nothing") }
    }
}
