import Haul
import HaulTestServer
import Testing

@Suite(.timeLimit(.minutes(1)))
struct DownloadTests {
    @Test func plainDownloadStoresExactBytesAndLeavesNoPartialFiles() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "plain", size: 3 * 1024 * 1024 + 17)
            server.add("/plain.bin", resource)
            try await withTemporaryDirectory { directory in
                let log = EventLog()
                let result = try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/plain.bin"), destination: .directory(directory)),
                        observing: log.record
                    )
                }
                #expect(result.destination == directory + "/plain.bin")
                #expect(result.bytes == resource.size)
                #expect(try readFile(result.destination) == resource.content)
                #expect(listDirectory(directory) == ["plain.bin"])
                let request = try #require(server.requests(for: "/plain.bin").first)
                #expect(request.header("range") == nil)
                #expect(request.header("accept-encoding") == "identity")
                let start = try #require(log.starts.first)
                #expect(start.totalBytes == resource.size)
                #expect(start.resumable)
                let fractions = log.progress.compactMap(\.fraction)
                #expect(fractions == fractions.sorted())
                #expect(fractions.last == 1)
            }
        }
    }

    @Test func interruptedAt40PercentResumesWithRangeAndIfRange() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "resume", size: 1_000_000)
            server.add("/resume.bin", resource)
            server.script("/resume.bin", [[.closeAfter(bytes: 400_000)]])
            try await withTemporaryDirectory { directory in
                let destination = directory + "/resume.bin"
                let request = DownloadRequest(url: server.url("/resume.bin"), destination: .file(destination))
                // First session: the connection drops at 40 % and no retry is allowed.
                try await withDownloader(testConfiguration(retries: 0)) { downloader in
                    await expectHaulError(.network) { try await downloader.download(request) }
                }
                #expect(!fileExists(destination))
                // The client may drop what it buffered when the connection failed, never more.
                let stored = try #require(fileSize(destination + ".haul.part"))
                #expect(stored > 0 && stored <= 400_000)
                // Second session: resumes from the stored byte.
                let result = try await withDownloader { downloader in try await downloader.download(request) }
                #expect(result.resumedFrom == stored)
                #expect(result.bytesFetched == 1_000_000 - stored)
                #expect(try readFile(destination) == resource.content)
                let requests = server.requests(for: "/resume.bin")
                #expect(requests.count == 2)
                #expect(requests[1].header("range") == "bytes=\(stored)-")
                #expect(requests[1].header("if-range") == resource.entityTagValue)
            }
        }
    }
}
