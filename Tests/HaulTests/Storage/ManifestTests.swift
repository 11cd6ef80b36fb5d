import Foundation
import HaulTestServer
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

@Suite(.timeLimit(.minutes(1)))
struct ManifestTests {
    func manifest(written: Int64, durable: Int64, bootID: String?) -> Manifest {
        var manifest = Manifest(
            originalURL: "http://h/f", finalURL: "http://h/f",
            validator: ResourceValidator(etag: "\"v\"", lastModified: nil, date: nil),
            totalLength: 1000, acceptsRanges: true, contentEncoding: nil, bootID: bootID, now: 0
        )
        manifest.segments[0].written = written
        manifest.segments[0].durable = durable
        return manifest
    }

    @Test func sameBootTrustsThePartialFileAnotherBootOnlyDurableBytes() {
        let current = "boot-a"
        #expect(
            manifest(written: 300, durable: 100, bootID: current).trustedPrefix(
                currentBootID: current, partialSize: 500) == 500)
        #expect(
            manifest(written: 300, durable: 100, bootID: "boot-b").trustedPrefix(
                currentBootID: current, partialSize: 500) == 100)
        #expect(
            manifest(written: 300, durable: 100, bootID: "boot-b").trustedPrefix(
                currentBootID: current, partialSize: 50) == 50)
        #expect(
            manifest(written: 300, durable: 100, bootID: nil).trustedPrefix(currentBootID: nil, partialSize: 500) == 100
        )
        #expect(
            manifest(written: 1000, durable: 1000, bootID: current).trustedPrefix(
                currentBootID: current, partialSize: 4000) == 1000)
    }

    @Test func impossibleManifestsAreRejected() throws {
        try withTemporaryDirectorySync { directory in
            let paths = try DownloadPaths.open(directory + "/f")
            try ManifestStore.store(manifest(written: 100, durable: 200, bootID: nil), at: paths, durable: true)
            #expect(throws: HaulError.self) { try ManifestStore.load(paths) }
            try ManifestStore.store(manifest(written: 2000, durable: 0, bootID: nil), at: paths, durable: false)
            #expect(throws: HaulError.self) { try ManifestStore.load(paths) }
            let good = manifest(written: 200, durable: 100, bootID: "x")
            try ManifestStore.store(good, at: paths, durable: true)
            #expect(try ManifestStore.load(paths) == good)
            #expect(!paths.folder.exists(paths.manifestTemporaryName))
        }
    }

    /// A temporary manifest left in place as a hard link to a file elsewhere is replaced, not
    /// written through; a partial file with a second name is refused, and neither other file changes.
    @Test func hardLinksAreNeverWrittenThrough() throws {
        try withTemporaryDirectorySync { directory in
            let outside = directory + "/outside"
            try Data("keep me".utf8).write(to: URL(fileURLWithPath: outside))
            mkdir(directory + "/root", 0o755)
            let paths = try DownloadPaths.open(directory + "/root/f")
            #expect(link(outside, paths.folder.pathOf(paths.manifestTemporaryName)) == 0)
            let good = manifest(written: 200, durable: 100, bootID: "x")
            try ManifestStore.store(good, at: paths, durable: false)
            #expect(try ManifestStore.load(paths) == good)
            #expect(try String(contentsOfFile: outside, encoding: .utf8) == "keep me")

            #expect(link(outside, paths.partial) == 0)
            let error = #expect(throws: HaulError.self) { try DestinationLock.acquire(paths) }
            #expect(error?.code == .fileSystem && error?.message.contains("hard links") == true)
            #expect(try String(contentsOfFile: outside, encoding: .utf8) == "keep me")
        }
    }

    @Test func afterARebootOnlyDurableBytesAreKept() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "rebooted", size: 500_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let paths = try DownloadPaths.open(directory + "/f")
                // 300,000 bytes were written before a power loss, but only 120,000 had been flushed.
                try writeFile(paths.partial, resource.bytes(0..<300_000))
                var stored = manifest(written: 300_000, durable: 120_000, bootID: "an-earlier-boot")
                stored.totalLength = 500_000
                stored.segments[0].end = 500_000
                stored.validator = ResourceValidator(etag: resource.entityTagValue, lastModified: nil, date: nil)
                try ManifestStore.store(stored, at: paths, durable: true)

                let result = try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(paths.destination)))
                }
                #expect(result.resumedFrom == 120_000)
                #expect(server.requests.first?.header("range") == "bytes=120000-")
                #expect(try readFile(paths.destination) == resource.content)
            }
        }
    }

    @Test func afterARebootTheUnflushedTailIsCutBeforeThisBootTrustsTheFileSize() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "rebooted-tail", size: 500_000)
            server.add("/f", resource)
            server.script("/f", [[.closeAfter(bytes: 10_000)]])
            try await withTemporaryDirectory { directory in
                let paths = try DownloadPaths.open(directory + "/f")
                // Before a power loss: 120,000 bytes flushed; after it, 180,000 more bytes of zeros.
                try writeFile(paths.partial, resource.bytes(0..<120_000) + [UInt8](repeating: 0, count: 180_000))
                var stored = manifest(written: 300_000, durable: 120_000, bootID: "an-earlier-boot")
                stored.totalLength = 500_000
                stored.segments[0].end = 500_000
                stored.validator = ResourceValidator(etag: resource.entityTagValue, lastModified: nil, date: nil)
                try ManifestStore.store(stored, at: paths, durable: true)

                // This boot's first session is interrupted soon after it resumed...
                await expectHaulError(.network) {
                    try await withDownloader(testConfiguration(retries: 0)) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(paths.destination)))
                    }
                }
                let kept = try #require(fileSize(paths.partial))
                #expect(kept < 300_000)
                // ...and the next one must not trust the zeros that were there.
                try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(paths.destination)))
                }
                #expect(try readFile(paths.destination) == resource.content)
            }
        }
    }

    @Test func crashAfterTheFinalRenameIsRecognisedAsComplete() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "renamed", size: 50_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let paths = try DownloadPaths.open(directory + "/f")
                // The complete file was renamed into place, then the process died before removing the manifest.
                try writeFile(paths.destination, resource.content)
                var stored = manifest(written: 50_000, durable: 50_000, bootID: BootIdentity.current)
                stored.totalLength = 50_000
                stored.segments[0].end = 50_000
                try ManifestStore.store(stored, at: paths, durable: true)

                let result = try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(paths.destination)))
                }
                #expect(result.bytes == 50_000)
                #expect(server.requests.isEmpty)
                #expect(try readFile(paths.destination) == resource.content)
                #expect(listDirectory(directory) == ["f"])
            }
        }
    }

    @Test func manifestNeverHoldsCredentials() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "secret", size: 300_000))
            server.script("/f", [[.closeAfter(bytes: 100_000)]])
            try await withTemporaryDirectory { directory in
                let request = DownloadRequest(
                    url: server.url("/f"), destination: .file(directory + "/f"),
                    headers: [("Authorization", "Bearer top-secret"), ("Cookie", "id=top-secret")]
                )
                await expectHaulError(.network) {
                    try await withDownloader(testConfiguration(retries: 0)) { try await $0.download(request) }
                }
                let manifest = String(decoding: try readFile(directory + "/f.haul.json"), as: UTF8.self)
                #expect(manifest.contains("\"format\":\(Manifest.currentFormat)"))
                #expect(!manifest.contains("top-secret"))
            }
        }
    }
}

func withTemporaryDirectorySync(_ body: (String) throws -> Void) throws {
    var template = Array("/tmp/haul-test-XXXXXX".utf8CString)
    guard let created = mkdtemp(&template) else { throw TestFailure("mkdtemp failed") }
    let directory = String(cString: created)
    defer { removeTree(directory) }
    try body(directory)
}
