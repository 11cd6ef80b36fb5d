import HaulTestServer
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A manager configuration with short intervals and no free-space margin.
func managerConfiguration(limit: Int = 2) -> DownloadManager.Configuration {
    var configuration = DownloadManager.Configuration()
    configuration.maxConcurrentDownloads = limit
    configuration.freeSpaceMargin = 0
    configuration.stateUpdateInterval = .milliseconds(100)
    configuration.spaceCheckInterval = .milliseconds(100)
    configuration.progressInterval = .zero
    return configuration
}

/// Opens a manager on `stateDirectory`, runs `body` with it and closes it.
@discardableResult
func withManager<Result>(
    _ stateDirectory: String, _ configuration: DownloadManager.Configuration = managerConfiguration(),
    downloader: DownloaderConfiguration = testConfiguration(), clock: any Clock<Duration> = ContinuousClock(),
    _ body: (DownloadManager) async throws -> Result
) async throws -> Result {
    let manager = try DownloadManager(
        stateDirectory: stateDirectory, configuration: configuration, downloaderConfiguration: downloader,
        clock: clock)
    do {
        let result = try await body(manager)
        await manager.close()
        return result
    } catch {
        await manager.close()
        throw error
    }
}

/// Runs the manager's queue while `body` runs, then stops it (running downloads checkpoint).
@discardableResult
func whileRunning<Result: Sendable>(
    _ manager: DownloadManager, _ body: @Sendable () async throws -> Result
) async throws -> Result {
    try await withThrowingTaskGroup(of: Result?.self) { group in
        group.addTask {
            await manager.run()
            return nil
        }
        defer { group.cancelAll() }
        let result = try await body()
        group.cancelAll()
        while try await group.next() != nil {}
        return result
    }
}

/// Waits until the download satisfies `condition`, failing after `timeout`.
@discardableResult
func waitFor(
    _ manager: DownloadManager, _ id: DownloadID, timeout: Duration = .seconds(60),
    sourceLocation: SourceLocation = #_sourceLocation, _ condition: (DownloadInfo) -> Bool
) async throws -> DownloadInfo {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if let info = await manager.download(id), condition(info) { return info }
        try await Task.sleep(for: .milliseconds(20))
    }
    let last = await manager.download(id)
    let state = last.map { "\($0.state), \($0.bytes) bytes, error: \($0.error?.message ?? "none")" } ?? "unknown"
    Issue.record("download \(id) did not reach the expected condition; last: \(state)", sourceLocation: sourceLocation)
    throw TestFailure("timed out")
}
