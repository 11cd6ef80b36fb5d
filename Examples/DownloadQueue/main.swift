// A small app-style program on Haul's app-facing API: it queues several downloads by URL, shows
// the queue's observable progress in the terminal, and, killed at any moment, picks up where it
// left off when run again with the same arguments.
//
//     download-queue-example STATE_DIR TARGET_DIR URL...
import Foundation
import Haul
import Observation

let arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.count >= 3 else {
    FileHandle.standardError.write(Data("usage: download-queue-example STATE_DIR TARGET_DIR URL...\n".utf8))
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

/// The queue's progress in the terminal.
enum Display {
    /// Prints the queue's line now, and again whenever Observation says it changed.
    @MainActor
    static func show(_ queue: ObservedQueue) {
        withObservationTracking {
            let progress = queue.progress
            let percent = queue.fraction.map { String(Int($0 * 100)) + "%" } ?? "?"
            say(
                "\(progress.downloads) downloads: \(percent) (\(size(progress.bytes)) / \(size(progress.totalBytes)))"
                    + "  \(size(Int64(progress.bytesPerSecond)))/s  \(queue.completed) done, \(queue.running) running")
        } onChange: {
            Task { @MainActor in show(queue) }
        }
    }
}

do {
    let manager = try DownloadManager(location: state)
    for url in urls {
        // The same URL and directory are the same download: run again, this finds what is stored.
        let id = try await manager.download(url, to: .directory(target))
        if let info = await manager.info(for: url), info.bytes > 0 {
            say("\(url.lastPathComponent): \(info.state), \(size(info.bytes)) already here (download \(id))")
        }
    }
    let queue = await manager.observeQueue()
    Display.show(queue)
    await manager.start()
    while queue.completed + queue.failed < urls.count {
        try await Task.sleep(for: .milliseconds(50))
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
