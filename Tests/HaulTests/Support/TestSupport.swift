import Dispatch
import HaulTestServer
import Logging
import Synchronization
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A real temporary directory, removed afterwards.
func withTemporaryDirectory<Result>(_ body: (String) async throws -> Result) async throws -> Result {
    var template = Array("/tmp/haul-test-XXXXXX".utf8CString)
    guard let created = mkdtemp(&template) else { throw TestFailure("mkdtemp failed") }
    let directory = String(cString: created)
    defer { removeInBackground(directory) }
    return try await body(directory)
}

/// Removes `path` on a queue of its own. Removing large files can take seconds (the disk may be
/// told to discard their blocks); on a thread of the task pool that would hold up every other test
/// running meanwhile, which the pool's two threads carry.
func removeInBackground(_ path: String) {
    cleanupQueue.async { removeTree(path) }
}

private let cleanupQueue = DispatchQueue(label: "haul-tests.cleanup")

func removeTree(_ path: String) {
    var info = stat()
    guard lstat(path, &info) == 0 else { return }
    if (info.st_mode & S_IFMT) == S_IFDIR {
        if let handle = opendir(path) {
            var names: [String] = []
            while let entry = readdir(handle) {
                let name = withUnsafePointer(to: entry.pointee.d_name) {
                    $0.withMemoryRebound(to: CChar.self, capacity: 256) { String(cString: $0) }
                }
                if name != "." && name != ".." { names.append(name) }
            }
            closedir(handle)
            for name in names { removeTree(path + "/" + name) }
        }
        rmdir(path)
    } else {
        unlink(path)
    }
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func readFile(_ path: String) throws -> [UInt8] {
    let descriptor = open(path, O_RDONLY)
    guard descriptor >= 0 else { throw TestFailure("cannot open \(path)") }
    defer { close(descriptor) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let count = read(descriptor, &buffer, buffer.count)
        guard count > 0 else { break }
        bytes += buffer[0..<count]
    }
    return bytes
}

func writeFile(_ path: String, _ bytes: [UInt8]) throws {
    let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    guard descriptor >= 0 else { throw TestFailure("cannot create \(path)") }
    defer { close(descriptor) }
    _ = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
}

func fileExists(_ path: String) -> Bool {
    var info = stat()
    return lstat(path, &info) == 0
}

func fileSize(_ path: String) -> Int64? {
    var info = stat()
    return stat(path, &info) == 0 ? Int64(info.st_size) : nil
}

func listDirectory(_ path: String) -> [String] {
    guard let handle = opendir(path) else { return [] }
    defer { closedir(handle) }
    var names: [String] = []
    while let entry = readdir(handle) {
        let name = withUnsafePointer(to: entry.pointee.d_name) {
            $0.withMemoryRebound(to: CChar.self, capacity: 256) { String(cString: $0) }
        }
        if name != "." && name != ".." { names.append(name) }
    }
    return names.sorted()
}

/// Collects the events of a download.
final class EventLog: Sendable {
    private let events = Mutex<[DownloadEvent]>([])

    var all: [DownloadEvent] { events.withLock { $0 } }

    func record(_ event: DownloadEvent) { events.withLock { $0.append(event) } }

    var restartReasons: [RestartReason] {
        all.compactMap { if case .restarted(let reason) = $0 { reason } else { nil } }
    }

    /// The restart reasons by case name, e.g. `["remoteChanged"]`, for exact comparisons.
    var restartKinds: [String] { restartReasons.map(\.parts.name) }

    var retries: [HaulError] {
        all.compactMap { if case .retrying(_, _, let error) = $0 { error } else { nil } }
    }

    var starts: [DownloadStart] {
        all.compactMap { if case .started(let start) = $0 { start } else { nil } }
    }

    var progress: [DownloadProgress] {
        all.compactMap { if case .progress(let progress) = $0 { progress } else { nil } }
    }
}

/// Polls `condition` (in real time) until it holds; fails after `timeout`, generous because the
/// whole suite runs at once on two cores in a debug build.
func waitUntil(
    _ what: String, timeout: Duration = .seconds(60), _ condition: () throws -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while try !condition() {
        guard ContinuousClock.now < deadline else { throw TestFailure("timed out waiting until \(what)") }
        try await Task.sleep(for: .milliseconds(5))
    }
}

/// Moves `clock` forward by the delay of every retry the download reports, so that retries happen at
/// once in real time while the download's rules see the delays pass.
func advancingRetries(_ clock: ManualClock, _ log: EventLog) -> @Sendable (DownloadEvent) -> Void {
    { event in
        log.record(event)
        if case .retrying(_, let delay, _) = event { clock.advance(by: delay) }
    }
}

/// A configuration with short delays, so retries in tests take milliseconds.
func testConfiguration(retries: Int = 5, stall: Duration = .seconds(30)) -> DownloaderConfiguration {
    var configuration = DownloaderConfiguration()
    configuration.retry.maximumRetries = retries
    configuration.retry.initialDelay = .milliseconds(10)
    configuration.retry.maximumDelay = .milliseconds(50)
    configuration.timeouts.stall = stall
    configuration.timeouts.connect = .seconds(5)
    configuration.storage.blockSize = 64 * 1024
    configuration.storage.checkpointInterval = .zero
    configuration.progressInterval = .zero
    return configuration
}

/// Runs `body` with a downloader and shuts it down afterwards.
@discardableResult
func withDownloader<Result>(
    _ configuration: DownloaderConfiguration = testConfiguration(), clock: any Clock<Duration> = ContinuousClock(),
    logger: Logger? = nil, _ body: (Downloader) async throws -> Result
) async throws -> Result {
    let downloader = Downloader(configuration: configuration, logger: logger, clock: clock)
    do {
        let result = try await body(downloader)
        try await downloader.shutdown()
        return result
    } catch {
        try? await downloader.shutdown()
        throw error
    }
}

/// Expects `body` to throw a ``HaulError`` with `code` and returns it.
@discardableResult
func expectHaulError<Value>(
    _ code: HaulError.Code, sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> Value
) async -> HaulError? {
    do {
        _ = try await body()
        Issue.record("expected HaulError \(code), but nothing was thrown", sourceLocation: sourceLocation)
        return nil
    } catch let error as HaulError {
        #expect(error.code == code, "\(error.message)", sourceLocation: sourceLocation)
        return error
    } catch {
        Issue.record("expected HaulError \(code), got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

/// Leaves a partial download: a first session whose connection drops after `bytes` bytes and that may
/// not retry. Returns the bytes it stored (never more than the server sent).
@discardableResult
func interruptedSession(
    _ server: HaulTestServer, _ path: String = "/f", destination: String, bytes: Int64,
    configuration: DownloaderConfiguration = testConfiguration(retries: 0)
) async throws -> Int64 {
    server.script(path, [[.closeAfter(bytes: bytes)]])
    try await withDownloader(configuration) { downloader in
        await expectHaulError(.network) {
            try await downloader.download(DownloadRequest(url: server.url(path), destination: .file(destination)))
        }
    }
    let stored = try #require(fileSize(destination + ".haul.part"))
    #expect(stored > 0 && stored <= bytes)
    #expect(fileExists(destination + ".haul.json"))
    return stored
}

/// Downloads `path` to `destination`, recording the events in `log`.
@discardableResult
func download(
    _ server: HaulTestServer, _ path: String = "/f", to destination: String, log: EventLog = EventLog(),
    configuration: DownloaderConfiguration = testConfiguration(), clock: any Clock<Duration> = ContinuousClock()
) async throws -> DownloadResult {
    try await withDownloader(configuration, clock: clock) { downloader in
        try await downloader.download(
            DownloadRequest(url: server.url(path), destination: .file(destination)), observing: log.record
        )
    }
}

/// Leaves a partial download on disk by hand: `bytes` in the partial file and a manifest describing
/// `resource` with the given progress, as an earlier session (on another boot, if `bootID` says so) would.
func plantPartialDownload(
    at paths: DownloadPaths, resource: TestResource, bytes: [UInt8], written: Int64, durable: Int64 = 0,
    bootID: String? = BootIdentity.current, url: String
) throws {
    try writeFile(paths.partial, bytes)
    var manifest = Manifest(
        originalURL: url, finalURL: url,
        validator: ResourceValidator(etag: resource.entityTagValue, lastModified: nil, date: nil),
        totalLength: resource.size, acceptsRanges: true, contentEncoding: nil, bootID: bootID, now: 0
    )
    manifest.segments[0].written = written
    manifest.segments[0].durable = durable
    try ManifestStore.store(manifest, at: paths, durable: true)
}
