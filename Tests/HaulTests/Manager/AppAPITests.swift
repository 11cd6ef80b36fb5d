import Foundation
import HaulTestServer
import Observation
import Synchronization
import Testing

@testable import Haul

/// The calls an app makes: keyed by URL, `start()`/`stop()` without a task group, observable models
/// and closures, against the test server and a real state directory.
@Suite("The app-facing API", .timeLimit(.minutes(1)))
struct AppAPITests {
    @Test("a download by URL is found by URL in a second manager, as after an app relaunch")
    func downloadByURLSurvivesARelaunch() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "report.pdf", size: 300_000)
                server.add("/report.pdf", resource)
                let url = try #require(URL(string: server.url("/report.pdf")))
                let folder = URL(fileURLWithPath: directory + "/files", isDirectory: true)
                try POSIX.makeDirectories(folder.path)
                let state = URL(fileURLWithPath: directory + "/state")
                let first = try DownloadManager(location: state, configuration: managerConfiguration())
                #expect(await first.info(for: url) == nil)
                #expect(await first.isCompleted(url) == false)
                let id = try await first.download(url, to: .directory(folder))
                await first.start()
                let done = try await waitFor(first, id) { $0.state == .completed }
                #expect(done.fileURL?.path == folder.path + "/report.pdf")
                await first.close()

                let second = try DownloadManager(location: state, configuration: managerConfiguration())
                let info = try #require(await second.info(for: url))
                #expect(info.id == id && info.state == .completed && info.bytes == 300_000)
                #expect(await second.fileURL(for: url)?.path == folder.path + "/report.pdf")
                #expect(await second.isCompleted(url))
                #expect(try readFile(folder.path + "/report.pdf") == resource.content)
                // Asked again: the same download, complete, not fetched again.
                #expect(try await second.download(url, to: .directory(folder)) == id)
                await second.start()
                #expect(await second.info(for: url)?.state == .completed)
                await second.close()
                #expect(server.requests(for: "/report.pdf").count == 1)
                // A file that went away is not complete any more.
                try FileManager.default.removeItem(atPath: folder.path + "/report.pdf")
                let third = try DownloadManager(location: state, configuration: managerConfiguration())
                #expect(await third.isCompleted(url) == false)
                await third.close()
            }
        }
    }

    @Test("pause, resume and remove by URL; an unknown URL is a clear error")
    func pauseResumeAndRemoveByURL() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "movie", size: 2_000_000)
                server.add("/movie", resource)
                server.setStandingFaults("/movie", [.throttle(bytesPerSecond: 1_000_000)])
                let url = try #require(URL(string: server.url("/movie")))
                let file = URL(fileURLWithPath: directory + "/movie.mp4")
                try await withManager(directory + "/state", downloader: segmentedConfiguration(connections: 1)) {
                    manager in
                    let id = try await manager.download(url, to: .file(file))
                    await manager.start()
                    try await waitFor(manager, id) { $0.bytes > 0 }
                    try await manager.pause(url)
                    let paused = try #require(await manager.info(for: url))
                    #expect(paused.state == .paused && paused.bytes > 0 && paused.bytes < 2_000_000)
                    server.setStandingFaults("/movie", [])
                    let before = server.requests(for: "/movie").count
                    try await manager.resume(url)
                    try await waitFor(manager, id) { $0.state == .completed }
                    #expect(try readFile(file.path) == resource.content)
                    let resumed = try #require(server.requests(for: "/movie").dropFirst(before).first)
                    #expect(resumed.header("Range") == "bytes=\(paused.bytes)-")
                    #expect(resumed.header("If-Range") == resource.entityTagValue)
                    try await manager.remove(url, deletingFiles: true)
                    #expect(await manager.info(for: url) == nil && !POSIX.exists(file.path))
                    let unknown = try #require(URL(string: server.url("/never")))
                    await expectHaulError(.unknownDownload) { try await manager.pause(unknown) }
                    await expectHaulError(.unknownDownload) { try await manager.resume(unknown) }
                }
            }
        }
    }

    @Test("a screen shown anew attaches to a paused download without resuming it, and follows it on the main actor")
    func attachingChangesNothing() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "episode", size: 2_000_000)
                server.add("/episode", resource)
                server.setStandingFaults("/episode", [.throttle(bytesPerSecond: 1_000_000)])
                let url = try #require(URL(string: server.url("/episode")))
                let file = URL(fileURLWithPath: directory + "/episode.mp4")
                try await withManager(directory + "/state", downloader: segmentedConfiguration(connections: 1)) {
                    manager in
                    let id = try await manager.download(url, to: .file(file))
                    await manager.start()
                    try await waitFor(manager, id) { $0.bytes > 0 }
                    try await manager.pause(url)
                    let asked = server.requests(for: "/episode").count
                    // The screen comes back and asks for the same download: it stays paused.
                    #expect(try await manager.download(url, to: .file(file)) == id)
                    #expect(await manager.info(for: url)?.state == .paused)
                    // A view model follows it on the main actor, in order, without a Task wrapper.
                    let model = await MainActor.run { RowModel() }
                    let following = Task { @MainActor in
                        for await info in try await manager.updates(of: url) { model.rows[url] = info }
                    }
                    try await waitUntilAsync("the model shows it paused") {
                        await model.rows[url]?.state == .paused
                    }
                    #expect(server.requests(for: "/episode").count == asked)
                    server.setStandingFaults("/episode", [])
                    try await manager.resume(url)
                    try await waitUntilAsync("the model shows it complete") {
                        await model.rows[url]?.state == .completed
                    }
                    following.cancel()
                    #expect(try readFile(file.path) == resource.content)
                    let totals = await manager.aggregateProgress()
                    #expect(totals.completed == 1 && totals.paused == 0)
                }
            }
        }
    }

    @Test("a row shows sizes, speed and time left as Foundation formats them, in the user's language")
    func formattedSizesSpeedAndTimeLeft() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "show", size: 2_500_000)
                server.add("/show", resource)
                server.setStandingFaults("/show", [.throttle(bytesPerSecond: 1_000_000)])
                let url = try #require(URL(string: server.url("/show")))
                let english = Locale(identifier: "en_US")
                try await withManager(directory + "/state") { manager in
                    let id = try await manager.download(url, to: .directory(URL(fileURLWithPath: directory)))
                    await manager.start()
                    let running = try await waitFor(manager, id) {
                        $0.bytes > 0 && $0.bytesPerSecond != nil && $0.secondsRemaining != nil
                    }
                    let size = running.formattedSize(locale: english)
                    #expect(size.wholeMatch(of: /[0-9.]+ (kB|MB) \/ 2.5 MB/) != nil, "\(size)")
                    let speed = try #require(running.formattedSpeed(locale: english))
                    #expect(speed.wholeMatch(of: /[0-9.]+ (kB|MB)\/s/) != nil, "\(speed)")
                    let left = try #require(running.formattedTimeRemaining(locale: english))
                    #expect(left.wholeMatch(of: /[0-9]+ (sec|min(, [0-9]+ sec)?)/) != nil, "\(left)")
                    server.setStandingFaults("/show", [])
                    let done = try await waitFor(manager, id) { $0.state == .completed }
                    #expect(done.formattedSize(locale: english) == "2.5 MB / 2.5 MB")
                    // The user's language is used: German writes a decimal comma.
                    #expect(done.formattedSize(locale: Locale(identifier: "de_DE")) == "2,5 MB / 2,5 MB")
                    #expect(done.formattedSpeed(locale: english) == nil)
                    #expect(done.formattedTimeRemaining(locale: english) == nil)
                    let totals = await manager.aggregateProgress()
                    #expect(totals.formattedSize(locale: english) == "2.5 MB / 2.5 MB")
                    #expect(totals.formattedSpeed(locale: english).hasSuffix("B/s"))
                }
            }
        }
    }

    @Test("the library fetches over one connection unless told to ramp, as Getting Started says")
    func oneConnectionUnlessAskedForMore() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "plain", size: 3_000_000)
                server.add("/plain", resource)
                let request = DownloadRequest(url: server.url("/plain"), destination: .file(directory + "/plain"))
                let downloader = Downloader()
                try await downloader.download(request)
                try await downloader.shutdown()
                #expect(try readFile(directory + "/plain") == resource.content)
                // One request, for the whole file: no probe for ranges.
                #expect(server.requests.map { $0.header("range") } == [nil])
                // The configuration the article gives asks whether ranges are served, to ramp up.
                var configuration = DownloaderConfiguration()
                configuration.segmentation.connections = 4
                configuration.segmentation.adaptive = true
                let ramping = Downloader(configuration: configuration)
                try await ramping.download(
                    DownloadRequest(url: server.url("/plain"), destination: .file(directory + "/ramped")))
                try await ramping.shutdown()
                #expect(try readFile(directory + "/ramped") == resource.content)
                #expect(server.requests.dropFirst().first?.header("range") == "bytes=0-")
            }
        }
    }

    @Test("a paused download counts as paused in the queue's totals")
    func pausedDownloadsAreCounted() async throws {
        try await withTemporaryDirectory { directory in
            try await withManager(directory + "/state") { manager in
                let url = try #require(URL(string: "http://127.0.0.1:9/later.bin"))
                _ = try await manager.download(url, to: .directory(URL(fileURLWithPath: directory)))
                try await manager.pause(url)
                let totals = await manager.aggregateProgress()
                #expect(totals.paused == 1 && totals.queued == 0 && totals.downloads == 1)
            }
        }
    }

    @Test("a finished file deleted between launches fails with no bytes, and a new download starts from 0")
    func aDeletedFileStartsOver() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "gone.bin", size: 300_000)
                server.add("/gone.bin", resource)
                let url = try #require(URL(string: server.url("/gone.bin")))
                let file = URL(fileURLWithPath: directory + "/gone.bin")
                try await withManager(directory + "/state") { manager in
                    let id = try await manager.download(url, to: .file(file))
                    await manager.start()
                    try await waitFor(manager, id) { $0.state == .completed }
                }
                try FileManager.default.removeItem(at: file)
                try await withManager(directory + "/state") { manager in
                    let info = try #require(await manager.info(for: url))
                    #expect(info.state == .failed && info.bytes == 0 && info.fraction == 0)
                    // Asked again, it runs from byte 0: no progress past what is on disk.
                    let events = manager.events()
                    let id = try await manager.download(url, to: .file(file))
                    await manager.start()
                    try await waitFor(manager, id) { $0.state == .completed }
                    #expect(try readFile(file.path) == resource.content)
                    var shown: [Int64] = []
                    for await event in events {
                        guard event.download.id == id else { continue }
                        shown.append(event.download.bytes)
                        if event.download.state == .completed { break }
                    }
                    #expect(shown.first == 0, "\(shown)")
                }
            }
        }
    }

    @Test("options make a file's folders and replace a file left in the way, as Alamofire's do")
    func optionsForTheDestination() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "photo.jpg", size: 50_000)
                server.add("/photo.jpg", resource)
                let url = try #require(URL(string: server.url("/photo.jpg")))
                let file = URL(fileURLWithPath: directory + "/albums/2026/photo.jpg")
                try await withManager(directory + "/state") { manager in
                    await manager.start()
                    let id = try await manager.download(url, to: .file(file), options: .createIntermediateDirectories)
                    try await waitFor(manager, id) { $0.state == .completed }
                    // Forgotten, its file kept: asked again, the file in the way is refused unless
                    // it may be replaced.
                    try await manager.remove(url, deletingFiles: false)
                    await expectHaulError(.destinationExists) { try await manager.download(url, to: .file(file)) }
                    let again = try await manager.download(url, to: .file(file), options: .removePreviousFile)
                    try await waitFor(manager, again) { $0.state == .completed }
                    #expect(try readFile(file.path) == resource.content)
                    #expect(server.requests(for: "/photo.jpg").count == 2)
                }
            }
        }
    }

    @Test("cancel by URL deletes the partial data; removeAll clears the queue, files too when asked")
    func cancelByURLAndRemoveAll() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                server.add("/slow", TestResource(name: "slow", size: 2_000_000))
                server.setStandingFaults("/slow", [.throttle(bytesPerSecond: 500_000)])
                server.add("/done", TestResource(name: "done", size: 10_000))
                let slow = try #require(URL(string: server.url("/slow")))
                let done = try #require(URL(string: server.url("/done")))
                try await withManager(directory + "/state", downloader: segmentedConfiguration(connections: 1)) {
                    manager in
                    let slowID = try await manager.download(slow, to: .file(URL(fileURLWithPath: directory + "/slow")))
                    let doneID = try await manager.download(done, to: .file(URL(fileURLWithPath: directory + "/done")))
                    await manager.start()
                    try await waitFor(manager, slowID) { $0.bytes > 0 }
                    try await waitFor(manager, doneID) { $0.state == .completed }
                    #expect(FileManager.default.fileExists(atPath: directory + "/slow.haul.part"))
                    try await manager.cancel(slow)
                    #expect(await manager.info(for: slow)?.state == .cancelled)
                    #expect(!FileManager.default.fileExists(atPath: directory + "/slow.haul.part"))
                    // Cleared: no download is left, and the finished file goes too when asked.
                    #expect(await manager.removeAll(deletingFiles: true) == 2)
                    #expect(await manager.info(for: slow) == nil)
                    #expect(await manager.info(for: done) == nil)
                    #expect(!FileManager.default.fileExists(atPath: directory + "/done"))
                    #expect(await manager.aggregateProgress().downloads == 0)
                    let unknown = try #require(URL(string: server.url("/never")))
                    await expectHaulError(.unknownDownload) { try await manager.cancel(unknown) }
                }
            }
        }
    }

    @Test("stop() checkpoints what runs; the next start() goes on from the stored bytes, as does a new manager")
    func startAndStopWithDownloadsInFlight() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resources = ["a", "b"].map { TestResource(name: $0, size: 3_000_000) }
                for resource in resources {
                    server.add("/\(resource.name)", resource)
                    server.setStandingFaults("/\(resource.name)", [.throttle(bytesPerSecond: 1_000_000)])
                }
                let state = directory + "/state"
                let urls = try resources.map { try #require(URL(string: server.url("/\($0.name)"))) }
                let manager = try DownloadManager(
                    stateDirectory: state, configuration: managerConfiguration(),
                    downloaderConfiguration: segmentedConfiguration(connections: 1))
                var ids: [DownloadID] = []
                for url in urls {
                    ids.append(try await manager.download(url, to: .directory(URL(fileURLWithPath: directory))))
                }
                await manager.start()
                for id in ids { try await waitFor(manager, id) { $0.bytes > 0 } }
                await manager.stop()
                var stored: [Int64] = []
                for id in ids {
                    let info = try #require(await manager.download(id))
                    #expect(info.state == .queued && info.bytes > 0 && info.bytes < 3_000_000)
                    stored.append(info.bytes)
                }
                // The next start() takes them back and goes on from where each stopped.
                let before = server.requests.count
                await manager.start()
                for id in ids { try await waitFor(manager, id) { $0.bytes > stored[ids.firstIndex(of: id)!] } }
                for (index, resource) in resources.enumerated() {
                    let next = try #require(server.requests.dropFirst(before).first { $0.path == "/\(resource.name)" })
                    #expect(next.header("Range") == "bytes=\(stored[index])-", "\(resource.name)")
                }
                await manager.stop()
                await manager.close()
                // A new manager on the same state (an app relaunched) finishes them.
                for resource in resources { server.setStandingFaults("/\(resource.name)", []) }
                let relaunched = try DownloadManager(
                    stateDirectory: state, configuration: managerConfiguration(),
                    downloaderConfiguration: segmentedConfiguration(connections: 1))
                await relaunched.start()
                for id in ids { try await waitFor(relaunched, id) { $0.state == .completed } }
                await relaunched.close()
                for resource in resources {
                    #expect(try readFile(directory + "/\(resource.name)") == resource.content)
                }
            }
        }
    }

    @Test("stop() with more downloads than slots leaves each queued, none stranded running; start() finishes them")
    func stopWithAWaitingLine() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resources = (0..<3).map { TestResource(name: "line\($0)", size: 1_000_000) }
                for resource in resources {
                    server.add("/\(resource.name)", resource)
                    server.setStandingFaults("/\(resource.name)", [.throttle(bytesPerSecond: 500_000)])
                }
                try await withManager(directory + "/state", managerConfiguration(limit: 1)) { manager in
                    var ids: [DownloadID] = []
                    for resource in resources {
                        let url = try #require(URL(string: server.url("/\(resource.name)")))
                        ids.append(try await manager.download(url, to: .directory(URL(fileURLWithPath: directory))))
                    }
                    await manager.start()
                    try await waitFor(manager, ids[0]) { $0.bytes > 0 }
                    await manager.stop()
                    for id in ids { #expect(await manager.download(id)?.state == .queued, "\(id)") }
                    // Nothing waits on a transfer that does not exist.
                    try await manager.pause(ids[1])
                    try await manager.resume(ids[1])
                    for resource in resources { server.setStandingFaults("/\(resource.name)", []) }
                    await manager.start()
                    for id in ids { try await waitFor(manager, id) { $0.state == .completed } }
                }
            }
        }
    }

    @Test("a start() made while stop() waits begins once the stop is over; after close() nothing starts or is added")
    func startDuringStopAndAfterClose() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "again", size: 2_000_000)
                server.add("/again", resource)
                server.setStandingFaults("/again", [.throttle(bytesPerSecond: 1_000_000)])
                let url = try #require(URL(string: server.url("/again")))
                let manager = try DownloadManager(
                    stateDirectory: directory + "/state", configuration: managerConfiguration(),
                    downloaderConfiguration: segmentedConfiguration(connections: 1))
                do {
                    let id = try await manager.download(url, to: .directory(URL(fileURLWithPath: directory)))
                    await manager.start()
                    try await waitFor(manager, id) { $0.bytes > 0 }
                    let stopping = Task { await manager.stop() }
                    // Caught while the stop waits for the download to checkpoint.
                    var chained = false
                    for _ in 0..<100_000 {
                        let underWay = await manager.lifecycle.stopping != nil
                        if underWay {
                            await manager.start()
                            chained = true
                            break
                        }
                        await Task.yield()
                    }
                    await stopping.value
                    #expect(chained, "start() was made while the stop was under way")
                    server.setStandingFaults("/again", [])
                    try await waitFor(manager, id) { $0.state == .completed }
                    await manager.close()
                    await manager.start()
                    #expect(await manager.lifecycle.owned == nil, "a closed manager runs nothing")
                    await expectHaulError(.invalidState) {
                        try await manager.download(url, to: .directory(URL(fileURLWithPath: directory + "/other")))
                    }
                } catch {
                    await manager.close()
                    throw error
                }
            }
        }
    }

    @Test("a second manager in the same process takes over what a closed one left part-way")
    func secondManagerAfterClose() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "handover", size: 2_000_000)
                server.add("/handover", resource)
                server.setStandingFaults("/handover", [.throttle(bytesPerSecond: 1_000_000)])
                let url = try #require(URL(string: server.url("/handover")))
                let state = URL(fileURLWithPath: directory + "/state")
                let first = try DownloadManager(location: state, configuration: managerConfiguration())
                try await first.download(url, to: .directory(URL(fileURLWithPath: directory)))
                await first.start()
                while (await first.info(for: url)?.bytes ?? 0) == 0 { try await Task.sleep(for: .milliseconds(10)) }
                await first.close()
                server.setStandingFaults("/handover", [])
                let second = try DownloadManager(location: state, configuration: managerConfiguration())
                let left = try #require(await second.info(for: url))
                #expect(left.state == .queued && left.bytes > 0 && left.bytes < 2_000_000)
                try await second.resume(url)
                await second.start()
                while await second.isCompleted(url) == false { try await Task.sleep(for: .milliseconds(10)) }
                await second.close()
                let identical = try readFile(directory + "/handover") == resource.content
                #expect(identical)
                let resumed = try #require(server.requests(for: "/handover").last)
                #expect(resumed.header("Range") != nil && resumed.header("If-Range") == resource.entityTagValue)
            }
        }
    }

    @Test("the observable models change as the download goes and end completed")
    func observableModels() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "big", size: 1_500_000)
                server.add("/big", resource)
                server.setStandingFaults("/big", [.throttle(bytesPerSecond: 1_500_000)])
                let url = try #require(URL(string: server.url("/big")))
                try await withManager(directory + "/state", downloader: segmentedConfiguration(connections: 1)) {
                    manager in
                    let id = try await manager.download(url, to: .directory(URL(fileURLWithPath: directory)))
                    let model = try await manager.observe(url)
                    let queue = await manager.observeQueue()
                    let start = await model.info
                    #expect(start.id == id && start.state == .queued && start.bytes == 0)
                    #expect(await queue.downloads.map(\.id) == [id])
                    #expect(await queue.queued == 1)
                    let changes = Changes()
                    await Self.track(model, changes)
                    await manager.start()
                    var seen: [Int64] = []
                    while await model.state != .completed {
                        let bytes = await model.bytes
                        if bytes > (seen.last ?? 0) { seen.append(bytes) }
                        try await Task.sleep(for: .milliseconds(5))
                    }
                    #expect(seen.count >= 2, "bytes seen in between: \(seen)")
                    #expect(changes.count > 0, "Observation reported changes")
                    let (fraction, bytes, total) = await (model.fraction, model.bytes, model.totalBytes)
                    #expect(fraction == 1 && bytes == 1_500_000 && total == 1_500_000)
                    let (file, error) = await (model.fileURL, model.error)
                    #expect(file?.path == directory + "/big" && error == nil)
                    while await queue.completed != 1 { try await Task.sleep(for: .milliseconds(5)) }
                    let (queueFraction, running) = await (queue.fraction, queue.running)
                    #expect(queueFraction == 1 && running == 0)
                    #expect(await queue.downloads.first?.state == .completed)
                    let missing = try #require(URL(string: server.url("/none")))
                    await expectHaulError(.unknownDownload) { try await manager.observe(missing) }
                }
            }
        }
    }

    @Test("a model that is let go stops listening to the manager")
    func releasedModelsStopListening() async throws {
        try await withTemporaryDirectory { directory in
            try await withManager(directory + "/state") { manager in
                let url = try #require(URL(string: "http://127.0.0.1:9/never"))
                let id = try await manager.download(url, to: .directory(URL(fileURLWithPath: directory)))
                let before = manager.subscribers.count
                var model: ObservedDownload? = try await manager.observe(id)
                var queue: ObservedQueue? = await manager.observeQueue()
                #expect(manager.subscribers.count == before + 2)
                #expect(await model?.id == id && queue != nil)
                model = nil
                queue = nil
                try await waitUntil("both feeds end") { manager.subscribers.count == before }
            }
        }
    }

    /// Counts every change Observation reports for the model's byte count, tracking it again after each.
    @MainActor
    static func track(_ model: ObservedDownload, _ changes: Changes) {
        withObservationTracking {
            _ = model.bytes
        } onChange: {
            changes.add()
            Task { @MainActor in track(model, changes) }
        }
    }

    @Test("the closures are called in order: the state at once, progress, then each change")
    func closuresInOrder() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "c", size: 1_000_000)
                server.add("/c", resource)
                server.setStandingFaults("/c", [.throttle(bytesPerSecond: 2_000_000)])
                let url = try #require(URL(string: server.url("/c")))
                let calls = Mutex<[String]>([])
                try await withManager(directory + "/state") { manager in
                    let id = try await manager.download(
                        url, to: .directory(URL(fileURLWithPath: directory)),
                        onProgress: { info in calls.withLock { $0.append("progress \(info.bytes)") } },
                        onStateChange: { info in calls.withLock { $0.append(info.state.rawValue) } })
                    await manager.start()
                    try await waitFor(manager, id) { $0.state == .completed }
                    try await waitUntil("the last call") { calls.withLock { $0.last } == "completed" }
                }
                let all = calls.withLock { $0 }
                #expect(Array(all.prefix(2)) == ["queued", "running"], "\(all)")
                #expect(all.last == "completed")
                let progress = all.dropFirst(2).dropLast().map { Int64($0.dropFirst("progress ".count)) ?? -1 }
                #expect(!progress.isEmpty && progress == progress.sorted() && progress.allSatisfy { $0 > 0 })
                #expect(progress.last == 1_000_000, "\(all)")
            }
        }
    }
}

/// How often Observation reported a change.
final class Changes: Sendable {
    private let value = Mutex(0)
    var count: Int { value.withLock { $0 } }
    func add() { value.withLock { $0 += 1 } }
}

/// What an app's view model holds: rows by URL, on the main actor.
@MainActor final class RowModel {
    var rows: [URL: DownloadInfo] = [:]
}
