import Crypto
import Haul
import HaulTestServer
import NIOHTTP1
import Testing

func sha256(_ bytes: [UInt8]) -> Checksum {
    Checksum(algorithm: .sha256, digest: Array(SHA256.hash(data: bytes)))
}

struct ChecksumParsingTests {
    @Test(arguments: [
        ("sha-256=" + String(repeating: "ab", count: 32), DigestAlgorithm.sha256),
        ("SHA256:" + String(repeating: "AB", count: 32), .sha256),
        ("sha512=" + String(repeating: "0f", count: 64), .sha512),
        ("md5=" + String(repeating: "00", count: 16), .md5),
        ("sha-1=" + String(repeating: "11", count: 20), .sha1),
    ])
    func parsesAlgorithmAndHex(text: String, algorithm: DigestAlgorithm) throws {
        let checksum = try Checksum(parsing: text)
        #expect(checksum.algorithm == algorithm)
        #expect(checksum.digest.count == algorithm.digestByteCount)
        #expect(checksum.description.hasPrefix(algorithm.rawValue + "="))
    }

    @Test(arguments: [
        "sha-256", "sha-256=abc", "crc32=00000000", "sha-256=" + String(repeating: "zz", count: 32),
        "sha-256=" + String(repeating: "ab", count: 31), "=ab",
    ])
    func rejectsMalformedChecksums(text: String) {
        #expect(throws: HaulError.self) { try Checksum(parsing: text) }
    }

    @Test func readsServerDigestHeaders() {
        let digest = sha256(Array("hello".utf8))
        let base64 = "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ="
        var headers = HTTPHeaders()
        headers.add(name: "Repr-Digest", value: "unknown=:AAAA:, sha-256=:\(base64):;param=1")
        #expect(DigestFields.representationDigests(headers) == [digest])
        headers = HTTPHeaders([("Digest", "SHA-256=\(base64),UNIXsum=30637")])
        #expect(DigestFields.representationDigests(headers) == [digest])
        headers = HTTPHeaders([("Content-MD5", "XUFAKrxLKna5cZ2REBfFkg==")])
        #expect(DigestFields.contentDigests(headers).map(\.algorithm) == [.md5])
        headers = HTTPHeaders([("Repr-Digest", "sha-256=:not base64:, sha-512=:AAAA:")])
        #expect(DigestFields.representationDigests(headers).isEmpty)
    }
}

@Suite(.timeLimit(.minutes(1)))
struct IntegrityTests {
    @Test func correctChecksumCompletes() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "summed", size: 700_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let request = DownloadRequest(
                    url: server.url("/f"), destination: .file(directory + "/f"), checksum: sha256(resource.content)
                )
                try await withDownloader { try await $0.download(request) }
                #expect(try readFile(directory + "/f") == resource.content)
            }
        }
    }

    @Test func wrongChecksumKeepsNothingUnderTheFinalNameAndTheRightOneFinishesWithoutDownloading() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "wrong-sum", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let wrong = sha256(Array("something else".utf8))
                let error = await expectHaulError(.checksumMismatch) {
                    try await withDownloader { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(destination), checksum: wrong)
                        )
                    }
                }
                #expect(error?.message.contains(wrong.hex) == true)
                #expect(error?.message.contains(sha256(resource.content).hex) == true)
                #expect(!fileExists(destination))
                #expect(fileSize(destination + ".haul.part") == 300_000)
                #expect(server.requests.count == 1)

                let result = try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(
                            url: server.url("/f"), destination: .file(destination), checksum: sha256(resource.content)
                        )
                    )
                }
                #expect(result.bytesFetched == 0)
                #expect(server.requests.count == 1)
                #expect(try readFile(destination) == resource.content)
            }
        }
    }

    @Test func resumedDownloadIsHashedIncludingThePartOnDisk() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "resumed-sum", size: 2_000_000)
            server.add("/f", resource)
            server.script("/f", [[.closeAfter(bytes: 900_000)], [.closeAfter(bytes: 500_000)]])
            try await withTemporaryDirectory { directory in
                let request = DownloadRequest(
                    url: server.url("/f"), destination: .file(directory + "/f"), checksum: sha256(resource.content)
                )
                // First session ends at the first drop; the second retries past the next one.
                await expectHaulError(.network) {
                    try await withDownloader(testConfiguration(retries: 0)) { try await $0.download(request) }
                }
                let result = try await withDownloader { try await $0.download(request) }
                #expect(result.resumedFrom > 0)
                #expect(server.requests.count == 3)
                #expect(try readFile(directory + "/f") == resource.content)
            }
        }
    }

    @Test func corruptionInTransitIsCaughtByReprDigestAndFetchedAgain() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "corrupt", size: 800_000, reprDigest: true)
            server.add("/f", resource)
            server.script("/f", [[.corruptByte(at: 654_321)]])
            try await withTemporaryDirectory { directory in
                let log = EventLog()
                try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")),
                        observing: log.record
                    )
                }
                #expect(try readFile(directory + "/f") == resource.content)
                #expect(log.restartKinds == ["digestMismatch"])
                #expect(server.requests.map { $0.header("range") } == [nil, nil])
            }
        }
    }

    @Test func corruptionInOneRangeIsCaughtByContentDigestAndOnlyThatRangeIsFetchedAgain() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "content-digest", size: 800_000, contentDigest: true)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, destination: destination, bytes: 300_000)
                server.script("/f", [[.corruptByte(at: 700_000)]])
                let log = EventLog()
                try await download(server, to: destination, log: log)
                #expect(try readFile(destination) == resource.content)
                #expect(log.retries.map(\.code) == [.checksumMismatch])
                #expect(log.restartReasons.isEmpty)
                // Both later requests ask for the same range: the bad range was dropped, the earlier bytes kept.
                let ranges = server.requests.dropFirst().map { $0.header("range") }
                #expect(ranges == ["bytes=\(stored)-", "bytes=\(stored)-"])
            }
        }
    }

    @Test func changedReprDigestBetweenSessionsMeansTheFileChanged() async throws {
        try await HaulTestServer.withRunning { server in
            // The server changes the content but not its ETag; only the digest tells.
            let resource = TestResource(
                name: "same-tag", size: 500_000, lastModified: false, reprDigest: true, fixedEntityTag: "\"forever\""
            )
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                try await interruptedSession(server, destination: destination, bytes: 200_000)
                server.update("/f") { $0.version = 2 }
                let log = EventLog()
                try await download(server, to: destination, log: log)
                #expect(try readFile(destination) == server.resource("/f")?.content)
                #expect(log.restartKinds == ["remoteChanged"])
                #expect(server.requests[1].header("if-range") == "\"forever\"")
                #expect(server.requests[2].header("range") == nil)
            }
        }
    }

    @Test func aReprDigestLetsAWeakTagResumeSafely() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "weak-digest", size: 600_000, entityTag: .weak, reprDigest: true)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                try await interruptedSession(server, destination: destination, bytes: 400_000)
                let result = try await withDownloader { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(destination)))
                }
                #expect(result.resumedFrom > 0)
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests[1].header("if-range") == nil)
            }
        }
    }
}
