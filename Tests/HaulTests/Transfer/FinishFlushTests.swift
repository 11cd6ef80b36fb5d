import HaulTestServer
import Synchronization
import Testing

@testable import Haul

/// Which finished files a flush of their file system may stand for: only those every byte of which
/// this session wrote.
@Suite("How a finished download's data is flushed", .timeLimit(.minutes(1)))
struct FinishFlushTests {
    /// Counts the finished files' own flushes and the flushes of their file system (real ones).
    final class Counts: Sendable {
        let files = Mutex<[String]>([])
        let fileSystems = Atomic<Int>(0)

        func configuration() -> DownloaderConfiguration {
            var configuration = testConfiguration()
            configuration.flushFinishedData = { file in
                self.files.withLock { $0.append(file.path) }
                try file.syncDataNow()
            }
            configuration.flushFinishedFileSystem = FileFinisher.FileSystemFlush(
                suits: { _ in true },
                flush: { folder in
                    self.fileSystems.add(1, ordering: .relaxed)
                    #if os(Linux)
                        try folder.syncFileSystem()
                    #endif
                    return true
                })
            return configuration
        }
    }

    @Test("a fresh download joins a flush of its file system; a resumed one is flushed on its own")
    func aResumedDownloadIsFlushedOnItsOwn() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "f", size: 256 * 1024)
                server.add("/f", resource)
                let other = TestResource(name: "g", size: 256 * 1024)
                server.add("/g", other)
                // An earlier session wrote part of f, and may never have flushed it: a flush of the
                // file system now may not report that its writing failed, the file's own flush does.
                try await interruptedSession(server, destination: directory + "/f", bytes: 100_000)
                let counts = Counts()
                try await download(server, "/f", to: directory + "/f", configuration: counts.configuration())
                #expect(counts.files.withLock { $0 } == [directory + "/f.haul.part"])
                #expect(counts.fileSystems.load(ordering: .relaxed) == 0)
                #expect(try readFile(directory + "/f") == resource.content)
                #expect(server.requests(for: "/f").last?.header("Range")?.hasPrefix("bytes=") == true)

                try await download(server, "/g", to: directory + "/g", configuration: counts.configuration())
                #expect(counts.files.withLock { $0.count } == 1)
                #expect(counts.fileSystems.load(ordering: .relaxed) == 1)
                #expect(try readFile(directory + "/g") == other.content)
                #expect(!POSIX.exists(directory + "/g.haul.part"))
            }
        }
    }
}
