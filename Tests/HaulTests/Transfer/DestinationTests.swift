import HaulTestServer
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

@Suite(.timeLimit(.minutes(1)))
struct DestinationTests {
    @Test(arguments: [
        ("attachment; filename=\"../../x\"", "x"),
        ("attachment; filename=\"/etc/passwd\"", "passwd"),
        ("attachment; filename=\"..\\\\..\\\\win.ini\"", "win.ini"),
        ("attachment; filename=\"...\"", "served"),
        ("attachment; filename*=UTF-8''a%01b%7Fc%00.txt", "abc.txt"),
        ("attachment; filename*=UTF-8''%2E%2E%2Fup.txt", "up.txt"),
        ("attachment; filename*=UTF-8''na%C3%AFve.txt; filename=\"plain.txt\"", "naïve.txt"),
        (
            "attachment; filename=\"" + String(repeating: "n", count: 10_000) + ".iso\"",
            String(repeating: "n", count: 196) + ".iso"
        ),
        ("inline", "served"),
    ])
    func serverSuggestedNamesStayInsideTheDirectory(disposition: String, expected: String) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "named", size: 5000, contentDisposition: disposition)
            server.add("/served", resource)
            try await withTemporaryDirectory { root in
                let directory = root + "/inner/target"
                let result = try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/served"), destination: .directory(directory)))
                }
                #expect(result.destination == directory + "/" + expected)
                #expect(try readFile(result.destination) == resource.content)
                #expect(listDirectory(directory) == [expected])
                #expect(listDirectory(root) == ["inner"])
                #expect(listDirectory(root + "/inner") == ["target"])
            }
        }
    }

    /// Any name the file system takes can be downloaded and resumed: the files beside a long one
    /// get a shortened name with a hash of the whole, since `.haul.json.tmp` would not fit.
    @Test(arguments: [241, 242, 250, 255])
    func namesUpToTheFileSystemsLimitDownloadAndResume(bytes: Int) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "long", size: 600_000)
            server.add("/long", resource)
            server.script("/long", [[.closeAfter(bytes: 300_000)]])
            try await withTemporaryDirectory { directory in
                let name =
                    String(repeating: "é", count: (bytes - 4) / 2) + String(repeating: "x", count: (bytes - 4) % 2)
                    + ".bin"
                #expect(name.utf8.count == bytes)
                let request = DownloadRequest(url: server.url("/long"), destination: .file(directory + "/" + name))
                await expectHaulError(.network) {
                    try await withDownloader(testConfiguration(retries: 0)) { try await $0.download(request) }
                }
                let left = listDirectory(directory)
                #expect(left.count == 2 && left.allSatisfy { $0.utf8.count <= 255 }, "\(left)")
                let result = try await withDownloader { try await $0.download(request) }
                #expect(result.resumedFrom > 0)
                #expect(server.requests(for: "/long").last?.header("range") == "bytes=\(result.resumedFrom)-")
                #expect(try readFile(directory + "/" + name) == resource.content)
                #expect(listDirectory(directory) == [name])
            }
        }
    }

    /// A download into a directory that stops half way is remembered by its URL, and the same
    /// downloader resumes it from there; once it is finished, nothing of it is remembered.
    @Test func aDirectoryRemembersAPartialDownloadUntilItFinishes() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "half", size: 600_000)
            server.add("/half", resource)
            server.script("/half", [[.closeAfter(bytes: 300_000)]])
            try await withTemporaryDirectory { directory in
                let request = DownloadRequest(url: server.url("/half"), destination: .directory(directory))
                try await withDownloader(testConfiguration(retries: 0)) { downloader in
                    await expectHaulError(.network) { try await downloader.download(request) }
                    #expect(downloader.partials.count == 1)
                    let result = try await downloader.download(request)
                    #expect(result.resumedFrom > 0)
                    #expect(downloader.partials.count == 0)
                }
                #expect(try readFile(directory + "/half") == resource.content)
            }
        }
    }

    /// A file name may start with a combining mark: its path is split at the last `/` byte, as the
    /// kernel reads it, not at the last `/` character (which the mark joins with the slash). The
    /// file, its partial and its manifest stay in the directory asked for, and the download resumes.
    @Test func aNameStartingWithACombiningMarkStaysInItsDirectory() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "mark", size: 600_000)
            server.add("/mark", resource)
            server.script("/mark", [[.closeAfter(bytes: 300_000)]])
            try await withTemporaryDirectory { directory in
                let name = "\u{301}note.bin"
                #expect(DownloadPaths.split(directory + "/inner/" + name) == (directory + "/inner", name))
                #expect(mkdir(directory + "/inner", 0o755) == 0)
                let request = DownloadRequest(
                    url: server.url("/mark"), destination: .file(directory + "/inner/" + name))
                await expectHaulError(.network) {
                    try await withDownloader(testConfiguration(retries: 0)) { try await $0.download(request) }
                }
                #expect(listDirectory(directory) == ["inner"])
                #expect(listDirectory(directory + "/inner").count == 2)
                let result = try await withDownloader { try await $0.download(request) }
                #expect(result.resumedFrom > 0)
                #expect(try readFile(directory + "/inner/" + name) == resource.content)
                #expect(listDirectory(directory + "/inner").map { Array($0.utf8) } == [Array(name.utf8)])
            }
        }
    }

    @Test(arguments: [("/", "index.html"), ("/dir/", "dir"), ("/a%20b.txt", "a b.txt"), ("/x?y=1", "x")])
    func namesComeFromTheURLWhenTheServerSuggestsNone(path: String, expected: String) async throws {
        try await HaulTestServer.withRunning { server in
            let servedPath = String(path.split(separator: "?").first ?? "/")
            server.add(servedPath, TestResource(name: "url-named", size: 100))
            try await withTemporaryDirectory { directory in
                let result = try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url(path), destination: .directory(directory)))
                }
                #expect(result.destination == directory + "/" + expected)
            }
        }
    }

    @Test func existingFileIsNotOverwrittenWithoutPermission() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "exists", size: 20_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                try writeFile(destination, Array("precious".utf8))
                let error = await expectHaulError(.destinationExists) {
                    try await withDownloader { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(destination)))
                    }
                }
                #expect(
                    error?.message.hasSuffix("already exists") == true,
                    "the library names no option of the command line")
                #expect(try readFile(destination) == Array("precious".utf8))
                #expect(server.requests.isEmpty)

                try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(destination), overwrite: true)
                    )
                }
                #expect(try readFile(destination) == resource.content)
            }
        }
    }

    @Test func aRefreshedURLResumesTheSameDestination() async throws {
        try await HaulTestServer.withRunning { server in
            // The same file behind an expiring link: a new link, same validator.
            let resource = TestResource(name: "signed", size: 600_000)
            server.add("/file", resource)
            server.script("/file", [[.closeAfter(bytes: 300_000)]])
            try await withTemporaryDirectory { directory in
                let destination = directory + "/file.bin"
                await expectHaulError(.network) {
                    try await withDownloader(testConfiguration(retries: 0)) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/file?token=old"), destination: .file(destination))
                        )
                    }
                }
                let stored = try #require(fileSize(destination + ".haul.part"))
                let result = try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/file?token=new"), destination: .file(destination))
                    )
                }
                #expect(result.resumedFrom == stored)
                #expect(try readFile(destination) == resource.content)
                let last = try #require(server.requests.last)
                #expect(last.uri == "/file?token=new")
                #expect(last.header("range") == "bytes=\(stored)-")
                #expect(last.header("if-range") == resource.entityTagValue)
            }
        }
    }

    /// A download into a directory finds its partial file under the name the server gave, whether that
    /// name was chosen by the same downloader or by another one (another process) after this
    /// downloader had listed the directory.
    @Test func aServerNamedPartialInADirectoryIsResumedFromItsOffset() async throws {
        try await HaulTestServer.withRunning { server in
            let first = TestResource(name: "first", size: 300_000, contentDisposition: "attachment; filename=one.bin")
            let second = TestResource(name: "second", size: 300_000, contentDisposition: "attachment; filename=two.bin")
            server.add("/one", first)
            server.add("/two", second)
            server.script("/one", [[.closeAfter(bytes: 100_000)]])
            try await withTemporaryDirectory { directory in
                try await withDownloader(testConfiguration(retries: 0)) { downloader in
                    // The same downloader: the name it chose is remembered.
                    await expectHaulError(.network) {
                        try await downloader.download(
                            DownloadRequest(url: server.url("/one"), destination: .directory(directory)))
                    }
                    let stored = try #require(fileSize(directory + "/one.bin.haul.part"))
                    let oneBefore = server.requests(for: "/one").count
                    let resumed = try await downloader.download(
                        DownloadRequest(url: server.url("/one"), destination: .directory(directory)))
                    #expect(resumed.destination == directory + "/one.bin")
                    #expect(resumed.resumedFrom == stored)
                    #expect(try readFile(directory + "/one.bin") == first.content)
                    // One request, and it asked for the rest.
                    #expect(server.requests(for: "/one").count == oneBefore + 1)
                    #expect(server.requests(for: "/one").last?.header("range") == "bytes=\(stored)-")

                    // Another downloader leaves a partial after this one listed the directory.
                    server.script("/two", [[.closeAfter(bytes: 120_000)]])
                    await expectHaulError(.network) {
                        try await withDownloader(testConfiguration(retries: 0)) { other in
                            try await other.download(
                                DownloadRequest(url: server.url("/two"), destination: .directory(directory)))
                        }
                    }
                    let partial = try #require(fileSize(directory + "/two.bin.haul.part"))
                    let requestsBefore = server.requests(for: "/two").count
                    let result = try await downloader.download(
                        DownloadRequest(url: server.url("/two"), destination: .directory(directory)))
                    #expect(result.resumedFrom == partial)
                    #expect(try readFile(directory + "/two.bin") == second.content)
                    // The first answer named the file and was dropped; the second continued the partial.
                    let requests = server.requests(for: "/two").dropFirst(requestsBefore)
                    #expect(requests.count == 2)
                    #expect(requests.last?.header("range") == "bytes=\(partial)-")
                    #expect(requests.last?.header("if-range") == second.entityTagValue)
                }
                #expect(listDirectory(directory).sorted() == ["one.bin", "two.bin"])
            }
        }
    }

    @Test func anAutomaticNameNeverTakesOverAnotherURLsPartial() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/a/data.bin", TestResource(name: "first", size: 300_000))
            server.add("/b/data.bin", TestResource(name: "second", size: 300_000))
            server.script("/a/data.bin", [[.closeAfter(bytes: 100_000)]])
            try await withTemporaryDirectory { directory in
                await expectHaulError(.network) {
                    try await withDownloader(testConfiguration(retries: 0)) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/a/data.bin"), destination: .directory(directory)))
                    }
                }
                let stored = try #require(fileSize(directory + "/data.bin.haul.part"))
                let error = await expectHaulError(.destinationExists) {
                    try await withDownloader { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/b/data.bin"), destination: .directory(directory)))
                    }
                }
                #expect(error?.message.contains("name the file data.bin explicitly") == true)
                // The other download's partial data is untouched.
                #expect(fileSize(directory + "/data.bin.haul.part") == stored)
                #expect(fileExists(directory + "/data.bin.haul.json"))
            }
        }
    }

    @Test func secondDownloaderOfTheSameDestinationIsLockedOut() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "locked", size: 400_000)
            server.add("/f", resource)
            server.setStandingFaults("/f", [.throttle(bytesPerSecond: 400_000)])
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let request = DownloadRequest(url: server.url("/f"), destination: .file(destination))
                try await withDownloader { downloader in
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        group.addTask { try await downloader.download(request) }
                        while server.requests.isEmpty { try await Task.sleep(for: .milliseconds(10)) }
                        let error = await expectHaulError(.locked) { try await downloader.download(request) }
                        #expect(error?.message.contains("pid \(getpid())") == true)
                        try await group.waitForAll()
                    }
                }
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests.count == 1)
                #expect(listDirectory(directory) == ["f"])
            }
        }
    }

    @Test func cancellationKeepsThePartialAndTheNextCallResumes() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "paused", size: 1_000_000)
            server.add("/f", resource)
            server.script("/f", [[.throttle(bytesPerSecond: 1_000_000)]])
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let request = DownloadRequest(url: server.url("/f"), destination: .file(destination))
                let log = EventLog()
                try await withDownloader { downloader in
                    let task = Task { try await downloader.download(request, observing: log.record) }
                    while (log.progress.last?.bytes ?? 0) < 200_000 { try await Task.sleep(for: .milliseconds(10)) }
                    task.cancel()
                    await expectHaulError(.cancelled) { try await task.value }
                }
                let stored = try #require(fileSize(destination + ".haul.part"))
                #expect(stored >= 200_000 && stored < 1_000_000)
                let manifest = try #require(try ManifestStore.load(DownloadPaths.open(destination)))
                // A pause flushes: the stored bytes are durable, not just written.
                #expect(manifest.segments[0].written == stored)
                #expect(manifest.segments[0].durable == stored)

                let result = try await withDownloader { downloader in try await downloader.download(request) }
                #expect(result.resumedFrom == stored)
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests.last?.header("range") == "bytes=\(stored)-")
            }
        }
    }

    @Test func resumeAboveFourGibibytes() async throws {
        try await HaulTestServer.withRunning { server in
            let size: Int64 = (4 << 30) + 3 * 1024 * 1024 + 123
            let resource = TestResource(name: "huge", size: size)
            server.add("/huge.iso", resource)
            try await withTemporaryDirectory { directory in
                let paths = try DownloadPaths.open(directory + "/huge.iso")
                // A sparse partial file claiming everything below 4 GiB + 1 MiB, as a long first session would leave it.
                let stored: Int64 = (4 << 30) + 1024 * 1024
                let descriptor = open(paths.partial, O_RDWR | O_CREAT, 0o644)
                #expect(ftruncate(descriptor, off_t(stored)) == 0)
                close(descriptor)
                var manifest = Manifest(
                    originalURL: server.url("/huge.iso"), finalURL: server.url("/huge.iso"),
                    validator: ResourceValidator(entityTag: EntityTag(resource.entityTagValue!)),
                    totalLength: size, acceptsRanges: true, contentEncoding: nil, bootID: BootIdentity.current, now: 0
                )
                manifest.segments[0].written = stored
                // The hashes a long first session records for its pieces (of zeros, in this sparse file),
                // so the resume checks its last piece and hashes only what it writes.
                let zeros = [UInt8](repeating: 0, count: Int(manifest.pieceSize))
                let zeroPiece = zeros.withUnsafeBytes { PieceHasher.hash($0) }
                manifest.pieces = Array(repeating: zeroPiece, count: Int(stored / manifest.pieceSize))
                try ManifestStore.store(manifest, at: paths, durable: false)

                let result = try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/huge.iso"), destination: .file(paths.destination)))
                }
                #expect(result.bytes == size)
                #expect(result.resumedFrom == stored)
                #expect(fileSize(paths.destination) == size)
                #expect(server.requests.first?.header("range") == "bytes=\(stored)-")
                let file = open(paths.destination, O_RDONLY)
                defer { close(file) }
                var tail = [UInt8](repeating: 0, count: Int(size - stored))
                let count = pread(file, &tail, tail.count, off_t(stored))
                #expect(count == tail.count)
                #expect(tail == resource.bytes(stored..<size))
            }
        }
    }

    @Test(arguments: ["ftp://example.com/file", "file:///etc/passwd", "not a url", "http://", "mailto:a@b"])
    func onlyHTTPAndHTTPSAreAccepted(url: String) async throws {
        try await withTemporaryDirectory { directory in
            do {
                try await withDownloader { downloader in
                    try await downloader.download(DownloadRequest(url: url, destination: .directory(directory)))
                }
                Issue.record("\(url) was accepted")
            } catch let error as HaulError {
                #expect([.unsupportedScheme, .invalidURL].contains(error.code))
            }
            #expect(listDirectory(directory).isEmpty)
        }
    }

    @Test(arguments: ["Range", "If-Range", "accept-encoding", "Bad Name", "X-Line"])
    func managedOrMalformedHeadersAreRefused(name: String) async throws {
        try await withTemporaryDirectory { directory in
            let value = name == "X-Line" ? "a\r\nInjected: 1" : "x"
            await expectHaulError(.invalidArgument) {
                try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(
                            url: "http://127.0.0.1:1/f", destination: .directory(directory), headers: [(name, value)])
                    )
                }
            }
        }
    }
}
