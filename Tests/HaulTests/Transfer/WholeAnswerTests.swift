import HaulTestServer
import Synchronization
import Testing

@testable import Haul

/// A fresh download from an origin whose last file came small and whole in one answer takes that
/// answer in one write; any other answer goes the transfer machine's way, with the same outcome.
@Suite("Small whole answers take a shortcut", .timeLimit(.minutes(1)))
struct WholeAnswerTests {
    /// Small resources served at `/NAME`, each of its own size (the test limit is a 64 KiB block).
    @discardableResult
    static func small(_ server: HaulTestServer, _ names: [String]) -> [String: TestResource] {
        var resources: [String: TestResource] = [:]
        for (index, name) in names.enumerated() {
            let resource = TestResource(name: name, size: 20_000 + Int64(index))
            server.add("/\(name)", resource)
            resources[name] = resource
        }
        return resources
    }

    /// Downloads `/NAME` into `directory`, named by the answer.
    @discardableResult
    static func fetch(_ name: String, _ server: HaulTestServer, _ downloader: Downloader, into directory: String)
        async throws -> DownloadResult
    {
        try await downloader.download(DownloadRequest(url: server.url("/\(name)"), destination: .directory(directory)))
    }

    @Test func smallFilesFromOneOriginTakeItAfterTheFirst() async throws {
        try await HaulTestServer.withRunning { server in
            let names = (1...6).map { "s\($0).bin" }
            let resources = Self.small(server, names)
            server.setStandingFaults(
                "/s4.bin", [.setHeader("Content-Disposition", "attachment; filename=\"named.bin\"")])
            try await withTemporaryDirectory { directory in
                try await withDownloader { downloader in
                    for name in names { try await Self.fetch(name, server, downloader, into: directory) }
                    // The first went the machine's way and showed the origin's files small; the rest
                    // took the shortcut, one request each.
                    #expect(downloader.smallAnswers.finishedCount == 5)
                    // Finished, by either way: none of them is remembered as a partial download.
                    #expect(downloader.partials.count == 0)
                }
                for name in names {
                    #expect(server.requests(for: "/\(name)").count == 1)
                    let file = name == "s4.bin" ? "named.bin" : name
                    #expect(try readFile(directory + "/" + file) == resources[name]?.content)
                }
                #expect(listDirectory(directory).count == names.count)
            }
        }
    }

    @Test func aLargeAnswerIsDeclinedAndTheMachineTakesIt() async throws {
        try await HaulTestServer.withRunning { server in
            let resources = Self.small(server, ["a", "b", "c", "d"])
            let large = TestResource(name: "large", size: 300_000)
            server.add("/large", large)
            try await withTemporaryDirectory { directory in
                try await withDownloader { downloader in
                    try await Self.fetch("a", server, downloader, into: directory)
                    try await Self.fetch("b", server, downloader, into: directory)
                    #expect(downloader.smallAnswers.finishedCount == 1)
                    let result = try await Self.fetch("large", server, downloader, into: directory)
                    #expect(result.bytes == 300_000 && result.restarts == 0)
                    // After a large file, the next small one goes the machine's way, the one after it
                    // the shortcut's.
                    try await Self.fetch("c", server, downloader, into: directory)
                    #expect(downloader.smallAnswers.finishedCount == 1)
                    try await Self.fetch("d", server, downloader, into: directory)
                    #expect(downloader.smallAnswers.finishedCount == 2)
                }
                #expect(try readFile(directory + "/large") == large.content)
                // The declined answer cost one request; the machine asked the same first.
                let asked = server.requests(for: "/large").map { $0.header("range") }
                #expect(asked.count == 2 && asked[0] == asked[1])
                for name in ["a", "b", "c", "d"] {
                    #expect(try readFile(directory + "/" + name) == resources[name]?.content)
                    #expect(server.requests(for: "/\(name)").count == 1)
                }
                #expect(listDirectory(directory).count == 5)
            }
        }
    }

    @Test func theCallerIsToldOfTheHandOverThenRightBeforeTheRename() async throws {
        try await HaulTestServer.withRunning { server in
            let resources = Self.small(server, ["a", "b"])
            try await withTemporaryDirectory { directory in
                // What each hook saw: which hook, the final name, and the partial file's size.
                let seen = Mutex<[(hook: String, named: Bool, partial: Int?)]>([])
                try await withDownloader { downloader in
                    for name in ["a", "b"] {
                        @Sendable func look(_ hook: String) {
                            let partial = POSIX.fileStatus(directory + "/\(name).haul.part").map { Int($0.st_size) }
                            seen.withLock { $0.append((hook, POSIX.exists(directory + "/" + name), partial)) }
                        }
                        _ = try await downloader.download(
                            DownloadRequest(url: server.url("/\(name)"), destination: .directory(directory)),
                            observing: { _ in },
                            finishing: FinishingHooks(
                                handedOver: { look("handed over") }, beforeRename: { _ in look("rename") }))
                    }
                    #expect(downloader.smallAnswers.finishedCount == 1)
                }
                // On the machine's path (a) and the shortcut (b) alike: handed over complete, then the
                // record's hook, both before the final name.
                let sizes = ["a", "b"].compactMap { resources[$0].map { Int($0.size) } }
                #expect(seen.withLock { $0.map(\.hook) } == ["handed over", "rename", "handed over", "rename"])
                #expect(seen.withLock { $0.map(\.named) } == [false, false, false, false])
                #expect(seen.withLock { $0.map(\.partial) } == [sizes[0], sizes[0], sizes[1], sizes[1]])
                for name in ["a", "b"] { #expect(try readFile(directory + "/" + name) == resources[name]?.content) }
            }
        }
    }

    @Test func aStalePartialFileUnderTheNameIsNotWrittenOver() async throws {
        try await HaulTestServer.withRunning { server in
            let resources = Self.small(server, ["a", "b"])
            try await withTemporaryDirectory { directory in
                // A partial file with no manifest, longer than b, left by a process that died, with
                // the temporary manifest it was writing.
                try writeFile(directory + "/b.haul.part", [UInt8](repeating: 7, count: 50_000))
                try writeFile(directory + "/b.haul.json.tmp", Array("{\"version\":".utf8))
                try await withDownloader { downloader in
                    try await Self.fetch("a", server, downloader, into: directory)
                    try await Self.fetch("b", server, downloader, into: directory)
                    #expect(downloader.smallAnswers.finishedCount == 0)
                }
                // The machine took it from the shortcut's answer's name and asked again.
                #expect(try readFile(directory + "/b") == resources["b"]?.content)
                #expect(server.requests(for: "/b").count == 2)
                #expect(listDirectory(directory).sorted() == ["a", "b"])
            }
        }
    }

    /// A download that ends unfinished, its partial file removed for want of a manifest, takes away
    /// the temporary manifest a killed process left beside it: nothing is left to outlive the
    /// download that finishes the file later.
    @Test func aDownloadThatFailsTakesAwayATemporaryManifestLeftBeside() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                try writeFile(directory + "/f.haul.json.tmp", Array("{\"version\":".utf8))
                try await withDownloader { downloader in
                    await expectHaulError(.httpStatus) {
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")))
                    }
                }
                #expect(listDirectory(directory).isEmpty)
            }
        }
    }

    @Test func anEmptyFileComesWhole() async throws {
        try await HaulTestServer.withRunning { server in
            Self.small(server, ["a"])
            server.add("/empty", TestResource(name: "empty", size: 0))
            try await withTemporaryDirectory { directory in
                try await withDownloader { downloader in
                    try await Self.fetch("a", server, downloader, into: directory)
                    let result = try await Self.fetch("empty", server, downloader, into: directory)
                    #expect(result.bytes == 0 && result.destination == directory + "/empty")
                    #expect(downloader.smallAnswers.finishedCount == 1)
                }
                #expect(try readFile(directory + "/empty").isEmpty)
                #expect(listDirectory(directory).sorted() == ["a", "empty"])
            }
        }
    }

    /// A fleet's worker (one with a write permit) always takes the machine's path, where the file's
    /// name reaches the queue with the first answer; and one whose lease may have run out writes
    /// nothing.
    @Test func aFleetsWorkerTakesTheMachinesPath() async throws {
        try await HaulTestServer.withRunning { server in
            let resources = Self.small(server, ["a", "b", "c"])
            try await withTemporaryDirectory { directory in
                let allowed = Atomic<Bool>(true)
                var configuration = testConfiguration()
                configuration.writePermit = { allowed.load(ordering: .relaxed) }
                try await withDownloader(configuration) { downloader in
                    try await Self.fetch("a", server, downloader, into: directory)
                    try await Self.fetch("b", server, downloader, into: directory)
                    #expect(downloader.smallAnswers.finishedCount == 0)
                    allowed.store(false, ordering: .relaxed)
                    let error = await expectHaulError(.locked) {
                        try await Self.fetch("c", server, downloader, into: directory)
                    }
                    #expect(error?.message.contains("lease") == true)
                }
                #expect(try readFile(directory + "/b") == resources["b"]?.content)
                for name in ["a", "b", "c"] { #expect(server.requests(for: "/\(name)").count == 1) }
                #expect(listDirectory(directory).sorted() == ["a", "b"])
            }
        }
    }

    @Test func anErrorIsLeftToTheMachine() async throws {
        try await HaulTestServer.withRunning { server in
            Self.small(server, ["a"])
            server.add("/gone", TestResource(name: "gone", size: 1000))
            server.script("/gone", [[.status(404)], [.status(404)]])
            try await withTemporaryDirectory { directory in
                try await withDownloader { downloader in
                    try await Self.fetch("a", server, downloader, into: directory)
                    let error = await expectHaulError(.httpStatus) {
                        try await Self.fetch("gone", server, downloader, into: directory)
                    }
                    #expect(error?.status == 404)
                }
                #expect(server.requests(for: "/gone").count == 2)
                #expect(listDirectory(directory) == ["a"])
            }
        }
    }

    @Test func aStalledAnswerGivesWayAfterTheStallTimeout() async throws {
        try await HaulTestServer.withRunning { server in
            let resources = Self.small(server, ["a", "b", "slow"])
            server.script("/slow", [[.stall(afterBytes: 1000, seconds: 60)]])
            try await withTemporaryDirectory { directory in
                let clock = ManualClock()
                try await withDownloader(testConfiguration(stall: .seconds(20)), clock: clock) { downloader in
                    // The second opens the shortcut's connection, which the stalled answer comes over
                    // again: it is not asked for a second time.
                    try await Self.fetch("a", server, downloader, into: directory)
                    try await Self.fetch("b", server, downloader, into: directory)
                    let slow = Task { try await Self.fetch("slow", server, downloader, into: directory) }
                    let stalls = try #require(downloader.wholeAnswerTransport?.stalls)
                    try await waitUntil("the shortcut's connection watches the stalled answer on the clock") {
                        server.requests(for: "/slow").count == 1 && stalls.count == 1 && clock.sleeperCount > 0
                    }
                    // The whole answer did not come within the stall timeout: the machine asks again
                    // and gets the file.
                    clock.advance(by: .seconds(20))
                    let result = try await slow.value
                    #expect(result.bytes == resources["slow"]?.size)
                    #expect(downloader.smallAnswers.finishedCount == 1)
                }
                #expect(server.requests(for: "/slow").count == 2)
                #expect(try readFile(directory + "/slow") == resources["slow"]?.content)
            }
        }
    }

    @Test func aCancelledShortcutLeavesNothing() async throws {
        try await HaulTestServer.withRunning { server in
            Self.small(server, ["a", "slow"])
            server.script("/slow", [[.stall(afterBytes: 1000, seconds: 60)]])
            try await withTemporaryDirectory { directory in
                let clock = ManualClock()
                try await withDownloader(testConfiguration(), clock: clock) { downloader in
                    try await Self.fetch("a", server, downloader, into: directory)
                    let slow = Task { try await Self.fetch("slow", server, downloader, into: directory) }
                    try await waitUntil("the shortcut waits for the stalled answer") {
                        server.requests(for: "/slow").count == 1 && clock.sleeperCount > 0
                    }
                    slow.cancel()
                    let error = await expectHaulError(.cancelled) { try await slow.value }
                    #expect(error != nil)
                }
                #expect(server.requests(for: "/slow").count == 1)
                #expect(listDirectory(directory) == ["a"])
            }
        }
    }
}
