import HaulTestServer
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Bytes the file system has given the file (which `fallocate` raises without writing anything).
private func allocatedBytes(_ path: String) -> Int64 {
    var info = stat()
    return stat(path, &info) == 0 ? Int64(info.st_blocks) * 512 : 0
}

/// Whether the file system under `directory` reserves space with `fallocate`.
private func reservesSpace(in directory: String) async throws -> Bool {
    let file = try PartialFile(path: directory + "/probe")
    defer { unlink(directory + "/probe") }
    return try await file.reserve(from: 0, upTo: 1 << 20, keepingSize: true)
}

/// Checks that the whole file's space is reserved exactly when `falloc` was asked for and the file
/// system offers it.
private func expectReservation(
    _ path: String, _ allocation: DownloaderConfiguration.FileAllocation, size: Int64, in directory: String
) async throws {
    if allocation == .fallocate, try await reservesSpace(in: directory) {
        #expect(allocatedBytes(path) >= size)
    } else {
        #expect(allocatedBytes(path) < size)
    }
}

@Suite(.timeLimit(.minutes(1))) struct FileAllocationTests {
    static let size: Int64 = 3 * 1024 * 1024 + 77

    /// Over one connection the partial file must stay as long as its written bytes (a resume on the same
    /// boot keeps what the length says), while `falloc` still reserves the space for the rest.
    @Test(arguments: [DownloaderConfiguration.FileAllocation.fallocate, .truncate, .none])
    func oneConnectionKeepsTheLengthOfTheWrittenBytes(allocation: DownloaderConfiguration.FileAllocation)
        async throws
    {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "one-\(allocation.rawValue)", size: Self.size)
                server.add("/f", resource)
                let destination = directory + "/f"
                var configuration = testConfiguration(retries: 0)
                configuration.storage.fileAllocation = allocation
                let stored = try await interruptedSession(
                    server, destination: destination, bytes: 1_000_000, configuration: configuration)
                // `interruptedSession` checked the length is what was stored; the space is reserved too.
                try await expectReservation(destination + ".haul.part", allocation, size: Self.size, in: directory)
                configuration.retry.maximumRetries = 2
                let result = try await download(server, to: destination, configuration: configuration)
                #expect(result.resumedFrom == stored)
                #expect(server.requests(for: "/f").last?.header("range") == "bytes=\(stored)-")
                #expect(try readFile(destination) == resource.content)
            }
        }
    }

    /// Over several connections the manifest records every range's progress, so the file may take its
    /// full length at once; a pause and a resume still give the exact bytes.
    @Test(arguments: [DownloaderConfiguration.FileAllocation.fallocate, .truncate])
    func severalConnectionsTakeTheFullLengthAtOnce(allocation: DownloaderConfiguration.FileAllocation)
        async throws
    {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "ranges-\(allocation.rawValue)", size: Self.size)
                server.add("/r", resource)
                let destination = directory + "/r"
                var configuration = segmentedConfiguration()
                configuration.storage.fileAllocation = allocation
                let manifest = try await pauseWhenRanges(
                    server, "/r", destination: destination, configuration: configuration
                ) {
                    segments in segments.count > 1 && segments.allSatisfy { $0.written > 0 }
                }
                #expect(manifest.segments.count > 1)
                #expect(fileSize(destination + ".haul.part") == Self.size)
                try await expectReservation(destination + ".haul.part", allocation, size: Self.size, in: directory)
                try await download(server, "/r", to: destination, configuration: configuration)
                #expect(try readFile(destination) == resource.content)
            }
        }
    }

    @Test func aLengthTheFileAlreadyHasIsKept() async throws {
        try await withTemporaryDirectory { directory in
            let file = try PartialFile(path: directory + "/f")
            try await file.extend(to: 10_000)
            try await file.extend(to: 5_000)
            #expect(fileSize(directory + "/f") == 10_000)
        }
    }
}
