import Foundation
import HaulTestServer
import Synchronization
import Testing

@testable import Haul

/// A queue longer than what a manager holds in memory: it holds what runs and what starts next,
/// reads the rest from the database, and still starts everything in order.
@Suite("A long queue", .timeLimit(.minutes(2)))
struct LongQueueTests {
    /// `count` requests into `directory`, of URLs on a port nothing listens on.
    static func requests(_ count: Int, into directory: String, from first: Int = 0) -> [DownloadRequest] {
        (first..<first + count).map {
            DownloadRequest(url: "http://127.0.0.1:9/f\($0)", destination: .directory(directory))
        }
    }

    @Test("a manager holds a bounded number of downloads, added or found at opening, and pages them from the store")
    func holdsABoundedWindow() async throws {
        try await withTemporaryDirectory { directory in
            let state = directory + "/state"
            let count = 3 * DownloadManager.windowSize + 100
            let ids = try await withManager(state) { manager in
                let ids = try await manager.enqueue(Self.requests(count, into: directory))
                #expect(ids.count == count && ids == ids.sorted())
                #expect(await manager.heldCount <= DownloadManager.windowSize)
                // The same list again names the same downloads and adds nothing.
                #expect(try await manager.enqueue(Self.requests(count, into: directory)) == ids)
                #expect(try await manager.counts() == [.queued: count])
                #expect(await manager.heldCount <= DownloadManager.windowSize)
                return ids
            }
            // A manager that takes them over holds no more than its window either.
            try await withManager(state) { manager in
                #expect(await manager.heldCount <= DownloadManager.windowSize)
                let page = try await manager.downloads(in: [.queued], offset: 700, limit: 10)
                #expect(page.total == count)
                #expect(page.downloads.map(\.id) == Array(ids[700..<710]))
                let keyset = try await manager.downloads(in: nil, after: ids[1_000], limit: 3)
                #expect(keyset.map(\.id) == Array(ids[1_001...1_003]))
                #expect(try await manager.downloads(in: [.failed], offset: 0, limit: 10).total == 0)
                #expect(await manager.download(ids[count - 1])?.state == .queued)
                #expect(await manager.heldCount <= DownloadManager.windowSize + 1)
                // Many by ID, in the order asked, unknown ones left out, read without holding them all.
                let asked = Array(ids.reversed()) + [DownloadID(ids[count - 1].rawValue + 1)]
                let answered = await manager.downloads(ids: asked)
                #expect(answered.map(\.id) == Array(ids.reversed()))
                #expect(answered.allSatisfy { $0.state == .queued })
                // Only those in the states asked for.
                #expect(await manager.downloads(ids: asked, in: [.completed, .failed]).isEmpty)
                let queued = await manager.downloads(ids: Array(ids[5..<8]).reversed(), in: [.queued])
                #expect(queued.map(\.id) == Array(ids[5..<8]).reversed())
                #expect(await manager.heldCount <= 2 * DownloadManager.windowSize + 500)
            }
        }
    }

    @Test("a list read a chunk at a time is checked whole before anything is added, then added in order")
    func aListIsCheckedWholeThenAdded() async throws {
        try await withTemporaryDirectory { directory in
            let count = 2 * DownloadManager.enqueueBatch + 500
            let reads = Mutex(0)
            // Read in chunks of 700, counting each read of the whole list; `failingAt` throws there.
            func list(failingAt failure: Int? = nil) -> DownloadRequestList {
                DownloadRequestList { chunk in
                    reads.withLock { $0 += 1 }
                    for start in stride(from: 0, to: count, by: 700) {
                        if let failure, (start..<start + 700).contains(failure) {
                            throw HaulError(.invalidArgument, "list:\(failure + 1): not a request")
                        }
                        try chunk(
                            (start..<min(count, start + 700)).map {
                                DownloadRequest(
                                    url: "http://127.0.0.1:9/f\($0)", destination: .file(directory + "/q\($0)"))
                            })
                    }
                }
            }
            // A file Haul did not download in the way of one of the last requests: nothing is added.
            let blocker = directory + "/q\(count - 10)"
            try Data("mine".utf8).write(to: URL(fileURLWithPath: blocker))
            try await withManager(directory + "/state") { manager in
                await #expect(throws: HaulError.self) { try await manager.enqueue(list()) }
                #expect(try await manager.counts() == [:])
                #expect(reads.withLock { $0 } == 1, "the list is not read again once a request is refused")
                // A list that cannot be read to its end adds nothing either.
                let unreadable = await #expect(throws: HaulError.self) {
                    try await manager.enqueue(list(failingAt: count - 3))
                }
                #expect(unreadable?.message == "list:\(count - 2): not a request")
                #expect(try await manager.counts() == [:])
                try FileManager.default.removeItem(atPath: blocker)
                reads.withLock { $0 = 0 }
                let ids = try await manager.enqueue(list())
                #expect(reads.withLock { $0 } == 2, "checked, then added")
                #expect(ids.count == count && ids == ids.sorted())
                #expect(try await manager.counts() == [.queued: count])
                #expect(await manager.heldCount <= DownloadManager.windowSize)
                let last = try await manager.download(id: ids[count - 1])
                #expect(last.destination == directory + "/q\(count - 1)")
                // A list read in one chunk is checked and added from that one reading.
                let short = Mutex(0)
                let shortIDs = try await manager.enqueue(
                    DownloadRequestList { chunk in
                        short.withLock { $0 += 1 }
                        try chunk(
                            (0..<700).map {
                                DownloadRequest(
                                    url: "http://127.0.0.1:9/s\($0)", destination: .file(directory + "/s\($0)"))
                            })
                    })
                #expect(short.withLock { $0 } == 1)
                #expect(shortIDs.count == 700 && Set(shortIDs).isDisjoint(with: ids))
                #expect(try await manager.counts() == [.queued: count + 700])
                #expect(try await manager.download(id: shortIDs[699]).destination == directory + "/s699")
            }
        }
    }

    @Test("a file named again in a later chunk of one list is one download, of the first URL, as in one chunk")
    func aFileNamedInTwoChunksIsOneDownload() async throws {
        try await withTemporaryDirectory { directory in
            let count = DownloadManager.enqueueBatch + 10
            let again = DownloadManager.enqueueBatch + 5
            let requests = (0..<count).map { position in
                DownloadRequest(
                    url: "http://127.0.0.1:9/f\(position)",
                    destination: .file(directory + "/q\(position == again ? 5 : position)"))
            }
            try await withManager(directory + "/state") { manager in
                let ids = try await manager.enqueue(requests)
                #expect(ids[again] == ids[5])
                #expect(Set(ids).count == count - 1)
                #expect(try await manager.counts() == [.queued: count - 1])
                #expect(try await manager.download(id: ids[5]).url == "http://127.0.0.1:9/f5")
            }
        }
    }

    @Test("a file another process's download learns while a list is added stays that download's")
    func aFileLearntElsewhereDuringAnAddIsKnown() async throws {
        try await withTemporaryDirectory { directory in
            let state = directory + "/state"
            let count = DownloadManager.enqueueBatch + 10
            let learnt = DownloadManager.enqueueBatch + 3
            let reads = Mutex(0)
            let other = Mutex<DownloadID?>(nil)
            let list = DownloadRequestList { chunk in
                // Between the check and the add, another process's download into the directory
                // learns the name of a file of the list's second chunk.
                if reads.withLock({
                    $0 += 1; return $0
                }) == 2 {
                    let store = try SQLiteQueueStore(path: state + "/" + DownloadManager.databaseName)
                    var record = StoredDownload(
                        key: StoredDownload.directoryKeyPrefix + directory + "\nhttp://127.0.0.1:9/other",
                        definition: DownloadRequest(
                            url: "http://127.0.0.1:9/other", destination: .directory(directory)),
                        destination: nil, priority: 0, owner: nil, now: 1)
                    record.destination = directory + "/q\(learnt)"
                    try record.move(to: .paused, at: 2)
                    other.withLock { $0 = try? store.insert([record])[0] }
                }
                // In two chunks: a list read in one is not read again.
                for range in [0..<DownloadManager.enqueueBatch, DownloadManager.enqueueBatch..<count] {
                    try chunk(
                        range.map {
                            DownloadRequest(
                                url: "http://127.0.0.1:9/f\($0)", destination: .file(directory + "/q\($0)"))
                        })
                }
            }
            try await withManager(state) { manager in
                let ids = try await manager.enqueue(list)
                let otherID = try #require(other.withLock { $0 })
                #expect(ids[learnt] == otherID)
                #expect(Set(ids).count == count)
                #expect(try await manager.counts() == [.queued: count])
            }
        }
    }

    @Test("downloads beyond the window start in order of priority, then as added, and the manager holds few")
    func startsBeyondTheWindowInOrder() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let count = DownloadManager.windowSize + 200
                for position in 0..<count + 3 {
                    server.add("/f\(position)", TestResource(name: "f\(position)", size: 100))
                }
                let request = { (position: Int) in
                    DownloadRequest(url: server.url("/f\(position)"), destination: .directory(directory))
                }
                try await withManager(directory + "/state", managerConfiguration(limit: 4)) { manager in
                    let normal = try await manager.enqueue((0..<count).map(request))
                    // Added last, beyond the window: the high ones still go first, the low one last.
                    let high = try await manager.enqueue((count..<count + 2).map(request), priority: .high)
                    let low = try await manager.enqueue(request(count + 2), priority: .low)
                    let started = Mutex<[DownloadID]>([])
                    let events = manager.events()
                    let watcher = Task {
                        for await event in events where event.kind.isStateChange && event.download.state == .running {
                            started.withLock { $0.append(event.download.id) }
                        }
                    }
                    await manager.runUntilIdle()
                    #expect(try await manager.counts() == [.completed: count + 3])
                    await manager.close()
                    await watcher.value
                    let order = started.withLock { $0 }
                    #expect(order.count == count + 3)
                    #expect(Set(order.prefix(2)) == Set(high))
                    #expect(order.last == low)
                    // Within a priority, as added: starts of four at a time, so compare the sorted runs.
                    let normalOrder = order.filter { normal.contains($0) }
                    #expect(normalOrder.count == count)
                    #expect(zip(normalOrder, normalOrder.dropFirst(4)).allSatisfy { $0 < $1 })
                    #expect(await manager.heldCount <= 2 * DownloadManager.windowSize + 4)
                }
            }
        }
    }
}

extension DownloadManagerEvent.Kind {
    fileprivate var isStateChange: Bool {
        if case .stateChanged = self { return true }
        return false
    }
}
