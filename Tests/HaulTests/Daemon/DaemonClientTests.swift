import Haul
import HaulTestServer
import Testing

@testable import HaulDaemon

/// The client the CLI uses when a daemon runs, against a real daemon.
@Suite(.timeLimit(.minutes(1)))
struct DaemonClientTests {
    @Test func theClientFindsTheDaemonAndDrivesItsQueue() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "c", size: 120_000)
            server.add("/c", resource)
            try await withTemporaryDirectory { state in
                #expect(try DaemonClient.running(on: state) == nil)
                try await withDaemon(stateDirectory: state) { daemon in
                    let client = try #require(try DaemonClient.running(on: state))
                    defer { Task { try? await client.shutdown() } }
                    #expect(client.url == daemon.url)
                    let checksum = try Checksum(parsing: "sha-256=" + hex(resource.sha256(0..<resource.size)))
                    let added = try await client.add(
                        [
                            DownloadRequest(
                                url: server.url("/c"), destination: .file(daemon.root + "/c.bin"), checksum: checksum)
                        ], priority: .high)
                    #expect(added.count == 1 && added[0].priority == .high)
                    let id = added[0].id
                    try await waitUntilAsync("it completes") { try await client.download(id).state == .completed }
                    #expect(try readFile(daemon.root + "/c.bin") == resource.content)
                    let completed = try await client.downloads(in: [.completed])
                    #expect(completed.map(\.id) == [id] && completed[0].bytes == 120_000)
                    #expect(try await client.downloads(in: [.failed]).isEmpty)
                    // The daemon's refusals arrive with their codes.
                    await #expect {
                        try await client.pause(id)
                    } throws: { error in
                        (error as? HaulError)?.code == .invalidState
                    }
                    await #expect {
                        try await client.download(DownloadID(999))
                    } throws: { error in
                        (error as? HaulError)?.code == .unknownDownload
                    }
                    try await client.remove(id, deletingFiles: true)
                    #expect(try await client.downloads().isEmpty)
                    #expect(!POSIX.exists(daemon.root + "/c.bin"))
                }
            }
        }
    }

    @Test func pauseResumeAndRetryThroughTheClient() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "p", size: 1_000_000)
            server.add("/p", resource)
            server.setStandingFaults("/p", [.throttle(bytesPerSecond: 500_000)])
            try await withTemporaryDirectory { state in
                try await withDaemon({ $0.downloader.segmentation.connections = 1 }, stateDirectory: state) { daemon in
                    let client = try #require(try DaemonClient.running(on: state))
                    defer { Task { try? await client.shutdown() } }
                    let id = try await client.add([
                        DownloadRequest(url: server.url("/p"), destination: .directory(daemon.root))
                    ])[0].id
                    try await waitUntilAsync("bytes arrive") { try await client.download(id).bytes > 0 }
                    #expect(try await client.pause(id).state == .paused)
                    server.setStandingFaults("/p", [])
                    #expect(try await client.resume(id).state != .paused)
                    try await waitUntilAsync("it completes") { try await client.download(id).state == .completed }
                    #expect(try readFile(daemon.root + "/p") == resource.content)
                    let failed = try await client.add([
                        DownloadRequest(url: server.url("/absent"), destination: .file(daemon.root + "/absent"))
                    ])[0].id
                    try await waitUntilAsync("it fails") { try await client.download(failed).state == .failed }
                    #expect(try await client.download(failed).error?.code == .httpStatus)
                    server.add("/absent", TestResource(name: "absent", size: 10))
                    #expect(try await [.queued, .running, .completed].contains(client.retry(failed).state))
                }
            }
        }
    }
}
