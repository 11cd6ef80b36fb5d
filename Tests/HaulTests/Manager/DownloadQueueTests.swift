import Haul
import HaulTestServer
import Synchronization
import Testing

@testable import HaulDaemon

/// One scenario, written once against ``DownloadQueue``, run on a manager in this process and on a
/// haul daemon through its client: both queues must do the same.
@Suite(.timeLimit(.minutes(1)))
struct DownloadQueueTests {
    enum Kind: String, CaseIterable, Sendable { case manager, daemon }

    @Test(arguments: Kind.allCases)
    func everyVerbDoesTheSameOnEitherQueue(_ kind: Kind) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "q", size: 600_000)
            server.add("/q", resource)
            server.setStandingFaults("/q", [.throttle(bytesPerSecond: 400_000)])
            switch kind {
            case .manager:
                try await withTemporaryDirectory { directory in
                    try await withManager(directory + "/state") { manager in
                        try await whileRunning(manager) {
                            try await Self.exercise(manager, root: directory, server: server, resource: resource)
                        }
                    }
                }
            case .daemon:
                try await withDaemon({ $0.downloader.segmentation.connections = 1 }, live: true) { daemon in
                    let client = DaemonClient(url: daemon.url, token: daemon.token)
                    defer { Task { try? await client.shutdown() } }
                    try await Self.exercise(client, root: daemon.root, server: server, resource: resource)
                }
            }
        }
    }

    static func exercise(
        _ queue: some DownloadQueue, root: String, server: HaulTestServer, resource: TestResource
    ) async throws {
        let events = try await queue.queueEvents()
        let seen = Mutex<[String]>([])
        let reader = Task {
            for try await case .download(let event) in events {
                seen.withLock { $0.append("\(event.download.id) \(event.download.state)") }
            }
        }
        defer { reader.cancel() }

        let request = DownloadRequest(
            url: server.url("/q"), destination: .file(root + "/q.bin"), connections: 1, label: "queue test")
        let added = try await queue.add([request], priority: .high)
        #expect(added.count == 1 && added[0].priority == .high && added[0].request.label == "queue test")
        let id = added[0].id
        let page = try await queue.downloads(in: nil, offset: 0, limit: 10)
        #expect(page.total == 1 && page.downloads.map(\.id) == [id])
        #expect(try await queue.downloads(in: [.failed], offset: 0, limit: 10).total == 0)

        try await waitUntilAsync("it runs") {
            let info = try await queue.download(id: id)
            return info.state == .running && info.bytes > 0
        }
        let paused = try await queue.pause(id)
        #expect(paused.state == .paused)
        let resumed = try await queue.resume(id, with: ResumeChange(headers: [(name: "X-Trace", value: "again")]))
        #expect(resumed.state == .queued || resumed.state == .running)
        try await waitUntilAsync("it completes") { try await queue.download(id: id).state == .completed }
        #expect(try readFile(root + "/q.bin") == resource.content)
        #expect(server.requests(for: "/q").last?.header("x-trace") == "again")
        await #expect {
            try await queue.retry(id)
        } throws: { error in
            (error as? HaulError)?.code == .invalidState
        }
        await #expect {
            try await queue.download(id: DownloadID(999))
        } throws: { error in
            (error as? HaulError)?.code == .unknownDownload
        }

        let changed = try await queue.changeOptions(
            QueueOptions.Change(maxConcurrentDownloads: 5, totalBytesPerSecondLimit: .some(1_000_000)))
        #expect(changed == QueueOptions(maxConcurrentDownloads: 5, totalBytesPerSecondLimit: 1_000_000))
        let cleared = try await queue.changeOptions(QueueOptions.Change(totalBytesPerSecondLimit: .some(nil)))
        #expect(cleared == QueueOptions(maxConcurrentDownloads: 5, totalBytesPerSecondLimit: nil))
        #expect(try await queue.options() == cleared)
        await #expect {
            try await queue.changeOptions(QueueOptions.Change(maxConcurrentDownloads: 0))
        } throws: { error in
            (error as? HaulError)?.code == .invalidArgument
        }

        try await waitUntilAsync("the events tell the story") {
            let states = seen.withLock { $0 }
            return ["paused", "queued", "completed"].allSatisfy { states.contains("\(id) \($0)") }
        }
        try await queue.remove(id, deletingFiles: true)
        #expect(try await queue.downloads(in: nil, offset: 0, limit: 10).total == 0)
        #expect(!POSIX.exists(root + "/q.bin"))
    }
}
