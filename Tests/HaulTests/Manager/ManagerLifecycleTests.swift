import Foundation
import HaulTestServer
import Testing

@testable import Haul

/// The rules of the manager's life — `run()`, `runUntilIdle()`, `start()`, `stop()` and `close()`
/// and how they meet — against the test server and a real state directory.
@Suite("The download manager's lifecycle", .timeLimit(.minutes(1)))
struct ManagerLifecycleTests {
    @Test("after close() nothing is added, and run(), runUntilIdle() and start() return at once")
    func closedManagerRefusesEverything() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                server.add("/file", TestResource(name: "file", size: 10_000))
                let request = DownloadRequest(url: server.url("/file"), destination: .directory(directory))
                try await withManager(directory + "/state") { manager in
                    await manager.close()
                    #expect(await manager.lifecycle.isClosed)
                    await expectHaulError(.invalidState) { try await manager.enqueue(request) }
                    #expect(await manager.downloads().isEmpty, "nothing was added")
                    // Each returns at once: the suite's time limit catches one that does not.
                    await manager.run()
                    await manager.runUntilIdle()
                    await manager.start()
                    #expect(await manager.lifecycle.owned == nil, "a closed manager runs nothing")
                    #expect(await manager.lifecycle.isClosed)
                    // Closing again changes nothing.
                    await manager.close()
                    #expect(await manager.lifecycle.isClosed)
                }
            }
        }
    }

    @Test("stop() while nothing runs returns at once, and it does not stop a caller's run()")
    func stopWithoutAStartedQueue() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "file", size: 200_000)
                server.add("/file", resource)
                try await withManager(directory + "/state") { manager in
                    await manager.stop()
                    #expect(await manager.lifecycle.stopping == nil)
                    #expect(await manager.lifecycle.run == nil)
                    let id = try await manager.enqueue(
                        DownloadRequest(url: server.url("/file"), destination: .directory(directory)))
                    try await whileRunning(manager) {
                        try await waitUntil { await manager.lifecycle.run != nil }
                        await manager.stop()
                        #expect(await manager.lifecycle.run != nil, "the caller's run goes on")
                        try await waitFor(manager, id) { $0.state == .completed }
                    }
                    #expect(try readFile(directory + "/file") == resource.content)
                    #expect(await manager.lifecycle.run == nil, "the run ended with its caller's cancellation")
                }
            }
        }
    }

    @Test("start() twice is one queue; run() beside it returns at once; stop() ends it")
    func startTwiceIsOneQueue() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "slow", size: 2_000_000)
                server.add("/slow", resource)
                server.setStandingFaults("/slow", [.throttle(bytesPerSecond: 1_000_000)])
                try await withManager(directory + "/state", downloader: segmentedConfiguration(connections: 1)) {
                    manager in
                    let id = try await manager.enqueue(
                        DownloadRequest(url: server.url("/slow"), destination: .directory(directory)))
                    await manager.start()
                    let first = try #require(await manager.lifecycle.owned)
                    await manager.start()
                    #expect(await manager.lifecycle.owned == first, "the second start() made no queue")
                    try await waitFor(manager, id) { $0.state == .running && $0.bytes > 0 }
                    #expect(await manager.lifecycle.run?.owned == first, "the started queue runs")
                    // The queue already runs: a caller's run() returns at once (the suite's time limit
                    // catches one that does not) and leaves it running.
                    await manager.run()
                    #expect(await manager.lifecycle.run?.owned == first)
                    #expect(await manager.download(id)?.state == .running)
                    await manager.stop()
                    #expect(await manager.lifecycle.owned == nil)
                    #expect(await manager.lifecycle.stopping == nil, "the stop is over")
                    let stopped = try #require(await manager.download(id))
                    #expect(stopped.state == .queued && stopped.bytes > 0, "checkpointed and queued again")
                }
            }
        }
    }

    @Test("a caller's run() takes the place of a start() that has not begun; only it runs the queue")
    func callersRunTakesOverAStartNotBegun() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "file", size: 100_000)
                server.add("/file", resource)
                try await withManager(directory + "/state") { manager in
                    let id = try await manager.enqueue(
                        DownloadRequest(url: server.url("/file"), destination: .directory(directory)))
                    // In one turn of the actor, so the started queue's task cannot begin first.
                    let started = try #require(await manager.startThenRunUntilIdle())
                    #expect(started.isCancelled, "the started queue gave way")
                    await started.value
                    #expect(await manager.download(id)?.state == .completed, "the caller's run ran it")
                    #expect(await manager.lifecycle.owned == nil)
                    #expect(await manager.lifecycle.run == nil)
                }
            }
        }
    }

    @Test("close() during a caller's run() starts nothing more and ends that run")
    func closeEndsACallersRun() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "slow", size: 2_000_000)
                server.add("/slow", resource)
                server.add("/next", TestResource(name: "next", size: 1_000))
                server.setStandingFaults("/slow", [.throttle(bytesPerSecond: 1_000_000)])
                try await withManager(
                    directory + "/state", managerConfiguration(limit: 1),
                    downloader: segmentedConfiguration(connections: 1)
                ) { manager in
                    let slow = try await manager.enqueue(
                        DownloadRequest(url: server.url("/slow"), destination: .directory(directory)))
                    let next = try await manager.enqueue(
                        DownloadRequest(url: server.url("/next"), destination: .directory(directory)))
                    let running = Task { await manager.run() }
                    try await waitFor(manager, slow) { $0.state == .running && $0.bytes > 0 }
                    await manager.close()
                    // Ends once the running download has stopped (the suite's time limit catches a
                    // run that does not).
                    await running.value
                    #expect(await manager.lifecycle.isClosed)
                    #expect(await manager.download(slow)?.state != .running, "the running download stopped")
                    #expect(await manager.download(next)?.state == .queued, "nothing started after the close")
                }
            }
        }
    }
}

extension DownloadManager {
    /// Calls ``start()``, then runs the queue as a caller's ``runUntilIdle()`` would, in one turn of
    /// the actor, so that the started queue's task cannot begin first; returns that task.
    fileprivate func startThenRunUntilIdle() async -> Task<Void, Never>? {
        start()
        let started = lifecycle.owned
        await run(stoppingWhenIdle: true, owned: false)
        return started
    }
}

/// Polls `condition` every 10 ms until it holds, failing after `timeout`.
private func waitUntil(
    timeout: Duration = .seconds(20), sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: () async -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if await condition() { return }
        try await Task.sleep(for: .milliseconds(10))
    }
    Issue.record("the condition did not hold in time", sourceLocation: sourceLocation)
    throw TestFailure("timed out")
}
