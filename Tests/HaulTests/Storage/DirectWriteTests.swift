import HaulTestServer
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Whether the file system under `directory` takes direct I/O (tmpfs and some others do not).
func directIOAvailable(in directory: String) -> Bool {
    let path = directory + "/.direct-probe"
    close(open(path, O_WRONLY | O_CREAT, 0o644))
    defer { unlink(path) }
    let descriptor = Platform.openUncached(in: AT_FDCWD, path, flags: O_WRONLY)
    guard descriptor >= 0 else { return false }
    close(descriptor)
    return true
}

/// Full pages with direct I/O, partial pages through the page cache: the bytes on disk must be exactly
/// the bytes received, whatever the offsets.
@Suite(.timeLimit(.minutes(1)))
struct DirectWriteTests {
    func configuration(connections: Int = 1) -> DownloaderConfiguration {
        var configuration =
            connections > 1 ? segmentedConfiguration(connections: connections) : testConfiguration(retries: 0)
        configuration.storage.directWriteMinimum = 0
        return configuration
    }

    @Test("blocks starting and ending anywhere land byte for byte, full pages written directly")
    func blocksLandExactly() async throws {
        try await withTemporaryDirectory { directory in
            let file = try PartialFile(path: directory + "/f")
            let direct = file.enableDirectWrites()
            #expect(direct == directIOAvailable(in: directory))
            let content = TestResource(name: "blocks", size: 3_000_000).content
            let start = 1_000
            var block = WriteBlock(capacity: 256 * 1024, start: Int64(start))
            var next = WriteBlock(capacity: 256 * 1024, start: 0)
            var generator = SystemRandomNumberGenerator()
            var position = start
            while position < content.count {
                let count = min(content.count - position, Int.random(in: 1...70_000, using: &generator))
                content[position..<position + count].withUnsafeBytes { block.append($0) }
                position += count
                let final = position == content.count
                guard block.count >= 200_000 || final else { continue }
                let writable = block.writableCount(final: final)
                #expect(final || (block.start + Int64(writable)) % Int64(WriteBlock.pageSize) == 0)
                block.moveTail(after: writable, into: next)
                try await file.write(block)
                swap(&block, &next)
            }
            #expect(file.usesDirectWrites == direct)
            #expect(block.count == 0 && block.start == Int64(content.count))
            let written = try readFile(directory + "/f")
            #expect(written.count == content.count)
            #expect(written[start...] == content[start...])
            #expect(written[..<start].allSatisfy { $0 == 0 })
        }
    }

    @Test("an interrupted download written with direct I/O resumes at its unaligned size, byte-identical")
    func resumeAfterDirectWrites() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "direct", size: 3_000_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(
                    server, destination: destination, bytes: 1_234_567, configuration: configuration())
                #expect(try readFile(destination + ".haul.part") == Array(resource.content[..<Int(stored)]))
                try await download(server, to: destination, configuration: configuration())
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests.last?.header("range") == "bytes=\(stored)-")
            }
        }
    }

    @Test("ranges over several connections written with direct I/O resume and land byte-identical")
    func segmentedDirectWrites() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                let resource = TestResource(name: "direct-parts", size: 6 * 1024 * 1024 + 4321)
                server.add("/f", resource)
                let destination = directory + "/f"
                let manifest = try await pauseWhenRanges(
                    server, "/f", destination: destination, bytesPerSecond: 2 << 20,
                    configuration: configuration(connections: 4)
                ) { segments in
                    segments.count >= 4 && segments.filter { $0.written > 100_000 }.count >= 3
                }
                let partial = try readFile(destination + ".haul.part")
                for segment in manifest.segments {
                    let range = Int(segment.start)..<Int(segment.start + segment.written)
                    #expect(partial[range] == resource.content[range], "\(segment)")
                }
                let requestsBefore = server.requests(for: "/f").count
                try await download(server, to: destination, configuration: configuration(connections: 4))
                #expect(try readFile(destination) == resource.content)
                // Every unfinished range continued where its bytes stopped, unaligned or not.
                let ranges = server.requests(for: "/f").dropFirst(requestsBefore).compactMap { $0.header("Range") }
                for segment in manifest.segments where segment.start + segment.written < segment.end! {
                    #expect(ranges.contains { $0.hasPrefix("bytes=\(segment.start + segment.written)-") }, "\(ranges)")
                }
            }
        }
    }
}
