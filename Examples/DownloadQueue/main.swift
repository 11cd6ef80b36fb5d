// A small app-style program on Haul's app-facing API: it queues several downloads by URL, shows
// the queue's observable progress in the terminal, and, killed at any moment, picks up where it
// left off when run again with the same arguments.
//
//     download-queue-example [--transport haul|urlsession|urlsession-files] STATE_DIR TARGET_DIR URL...
//
// `--transport` picks what sends the requests: Haul's own client (the default), URLSession with
// data tasks, or URLSession with download tasks (the mode of a background session on iOS).
import Foundation
import Haul
import HaulURLSession
import Observation

var arguments = Array(CommandLine.arguments.dropFirst())
let usage = "usage: download-queue-example [--transport haul|urlsession|urlsession-files] STATE_DIR TARGET_DIR URL...\n"
var transport = "haul"
if arguments.first == "--transport", arguments.count >= 2 {
    transport = arguments[1]
    arguments.removeFirst(2)
}
guard arguments.count >= 3, ["haul", "urlsession", "urlsession-files"].contains(transport) else {
    FileHandle.standardError.write(Data(usage.utf8))
    exit(2)
}
let state = URL(fileURLWithPath: arguments[0], isDirectory: true)
let target = URL(fileURLWithPath: arguments[1], isDirectory: true)
var urls: [URL] = []
for text in arguments.dropFirst(2) {
    guard let url = URL(string: text), url.scheme == "http" || url.scheme == "https" else {
        FileHandle.standardError.write(Data("error: not an http or https URL: \(text)\n".utf8))
        exit(2)
    }
    // The same URL twice is one download.
    if !urls.contains(url) { urls.append(url) }
}

/// Prints a line at once, even into a pipe.
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// `12.3 MiB`.
func size(_ bytes: Int64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var value = Double(bytes)
    var unit = 0
    while value >= 1024 && unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    return unit == 0 ? "\(bytes) B" : String(format: "%.1f %@", value, units[unit])
}

/// What an app's view model does: it keeps a row per download, updated in order on the main actor
/// from each download's stream of updates, and draws the queue's line from its rows.
@MainActor
final class QueueModel {
    private(set) var rows: [URL: DownloadInfo] = [:]
    private let count: Int

    init(count: Int) { self.count = count }

    /// Follows one download until its updates end (it completed, or the program stops).
    func follow(_ url: URL, _ updates: AsyncStream<DownloadInfo>) async {
        for await info in updates {
            rows[url] = info
            draw()
        }
    }

    private func draw() {
        let bytes = rows.values.reduce(0) { $0 + $1.bytes }
        let total = rows.values.reduce(0) { $0 + ($1.totalBytes ?? 0) }
        let speed = rows.values.reduce(0) { $0 + ($1.bytesPerSecond ?? 0) }
        let done = rows.values.filter { $0.state == .completed }.count
        let running = rows.values.filter { $0.state == .running }.count
        let percent = total > 0 ? String(Int(Double(bytes) / Double(total) * 100)) + "%" : "?"
        say(
            "\(count) downloads: \(percent) (\(size(bytes)) / \(size(total)))  \(size(Int64(speed)))/s  "
                + "\(done) done, \(running) running")
    }
}

/// The transport `name` names; download tasks leave their bodies beside the state directory (which
/// the queue keeps private to its owner).
func makeTransport(_ name: String, state: URL) throws -> (any DownloadTransport)? {
    switch name {
    case "urlsession":
        return URLSessionTransport()
    case "urlsession-files":
        let bodies = URL(fileURLWithPath: state.path + ".bodies", isDirectory: true)
        try FileManager.default.createDirectory(at: bodies, withIntermediateDirectories: true)
        return URLSessionTransport(mode: .files(directory: bodies.path))
    default:
        return nil
    }
}

do {
    var transfers = DownloaderConfiguration()
    transfers.transport = try makeTransport(transport, state: state)
    let manager = try DownloadManager(location: state, downloaderConfiguration: transfers)
    for url in urls {
        // The same URL and directory are the same download: run again, this finds what is stored.
        let id = try await manager.download(url, to: .directory(target))
        if let info = await manager.info(for: url), info.bytes > 0 {
            say("\(url.lastPathComponent): \(info.state), \(size(info.bytes)) already here (download \(id))")
        }
    }
    let queue = await manager.observeQueue()
    let model = QueueModel(count: urls.count)
    try await withThrowingTaskGroup(of: Void.self) { group in
        for url in urls {
            let updates = try await manager.updates(of: url)
            group.addTask { await model.follow(url, updates) }
        }
        await manager.start()
        while queue.completed + queue.failed < urls.count {
            try await Task.sleep(for: .milliseconds(50))
        }
        group.cancelAll()
    }
    await manager.stop()
    for url in urls {
        let done = await manager.isCompleted(url)
        let file = await manager.fileURL(for: url)?.path ?? "?"
        say(
            "\(done ? "saved" : "not saved") \(file)\((await manager.info(for: url)?.error).map { ": \($0.message)" } ?? "")"
        )
    }
    await manager.close()
    exit(queue.failed == 0 ? 0 : 1)
} catch {
    FileHandle.standardError.write(Data("error: \(error)\n".utf8))
    exit(1)
}
