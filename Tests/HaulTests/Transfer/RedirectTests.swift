import Haul
import HaulTestServer
import Testing

@Suite(.timeLimit(.minutes(1)))
struct RedirectTests {
    @Test func redirectChainThenResume() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "chained", size: 800_000)
            server.add("/a", .redirect(to: "/b", status: 301))
            server.add("/b", .redirect(to: server.url("/c"), status: 307))
            server.add("/c", resource)
            server.script("/c", [[.closeAfter(bytes: 300_000)]])
            try await withTemporaryDirectory { directory in
                let request = DownloadRequest(url: server.url("/a"), destination: .directory(directory))
                try await withDownloader(testConfiguration(retries: 0)) { downloader in
                    await expectHaulError(.network) { try await downloader.download(request) }
                }
                // Named after the URL the user gave, not the redirect target.
                let stored = try #require(fileSize(directory + "/a.haul.part"))
                let result = try await withDownloader { downloader in try await downloader.download(request) }
                #expect(result.destination == directory + "/a")
                #expect(result.resumedFrom == stored)
                #expect(try readFile(directory + "/a") == resource.content)
                #expect(server.requests.map(\.path) == ["/a", "/b", "/c", "/a", "/b", "/c"])
                for request in server.requests.suffix(3) {
                    #expect(request.header("range") == "bytes=\(stored)-")
                    #expect(request.header("if-range") == resource.entityTagValue)
                }
            }
        }
    }

    @Test func crossOriginRedirectDropsCredentials() async throws {
        try await HaulTestServer.withRunning { origin in
            try await HaulTestServer.withRunning { other in
                let resource = TestResource(name: "elsewhere", size: 10_000)
                other.add("/file", resource)
                origin.add("/same", .redirect(to: "/start"))
                origin.add("/start", .redirect(to: other.url("/file")))
                try await withTemporaryDirectory { directory in
                    let request = DownloadRequest(
                        url: origin.url("/same"), destination: .file(directory + "/f"),
                        headers: [("Authorization", "Bearer secret"), ("Cookie", "session=1"), ("X-Trace", "kept")]
                    )
                    try await withDownloader { downloader in try await downloader.download(request) }
                    #expect(try readFile(directory + "/f") == resource.content)
                    // Same origin: credentials follow.
                    for request in origin.requests {
                        #expect(request.header("authorization") == "Bearer secret")
                        #expect(request.header("cookie") == "session=1")
                    }
                    let final = try #require(other.requests.first)
                    #expect(final.header("authorization") == nil)
                    #expect(final.header("cookie") == nil)
                    #expect(final.header("x-trace") == "kept")
                    // The manifest and everything else on disk holds no secret.
                    for name in listDirectory(directory) {
                        let text = String(decoding: try readFile(directory + "/" + name), as: UTF8.self)
                        #expect(!text.contains("secret"))
                    }
                }
            }
        }
    }

    @Test func sameHostOnAnotherNameIsAnotherOrigin() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/start", .redirect(to: server.url("/file", host: "localhost")))
            server.add("/file", TestResource(name: "named", size: 1000))
            try await withTemporaryDirectory { directory in
                let request = DownloadRequest(
                    url: server.url("/start"), destination: .file(directory + "/f"),
                    headers: [("Authorization", "Basic eA==")]
                )
                try await withDownloader { downloader in try await downloader.download(request) }
                #expect(server.requests(for: "/start").first?.header("authorization") == "Basic eA==")
                #expect(server.requests(for: "/file").first?.header("authorization") == nil)
            }
        }
    }

    @Test func redirectLoopIsRefused() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/x", .redirect(to: "/y"))
            server.add("/y", .redirect(to: "/x"))
            try await withTemporaryDirectory { directory in
                let error = await expectHaulError(.redirectRefused) {
                    try await withDownloader { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/x"), destination: .file(directory + "/f")))
                    }
                }
                #expect(error?.message.contains("loop") == true)
                #expect(server.requests.count == 2)
            }
        }
    }

    @Test func tooManyRedirectsAreRefused() async throws {
        try await HaulTestServer.withRunning { server in
            for hop in 0..<5 { server.add("/\(hop)", .redirect(to: "/\(hop + 1)")) }
            server.add("/5", TestResource(name: "far", size: 10))
            var configuration = testConfiguration()
            configuration.redirects.maximum = 3
            try await withTemporaryDirectory { directory in
                await expectHaulError(.redirectRefused) {
                    try await withDownloader(configuration) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/0"), destination: .file(directory + "/f")))
                    }
                }
                #expect(server.requests.count == 4)
            }
        }
    }

    @Test(arguments: ["ftp://127.0.0.1/file", "file:///etc/passwd", "data:text/plain,hello", "gopher://x/"])
    func redirectToAnotherSchemeIsRefused(location: String) async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/go", .redirect(to: location))
            try await withTemporaryDirectory { directory in
                await expectHaulError(.unsupportedScheme) {
                    try await withDownloader { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/go"), destination: .file(directory + "/f")))
                    }
                }
                // Nothing was received, so nothing is left behind: no partial file, no manifest.
                #expect(listDirectory(directory).isEmpty)
            }
        }
    }
}
