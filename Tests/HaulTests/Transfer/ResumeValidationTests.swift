import HaulTestServer
import Testing

@testable import Haul

/// Every way a resume can go wrong must end with the exact bytes of one version, never a splice.
@Suite(.timeLimit(.minutes(1)))
struct ResumeValidationTests {
    @Test func changedFileWithSameLengthGivesTheNewVersion() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "changing", size: 500_000))
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, "/f", destination: destination, bytes: 200_000)
                let old = try #require(server.resource("/f"))
                server.update("/f") { $0.version = 2 }
                let log = EventLog()
                let result = try await download(server, "/f", to: destination, log: log)
                let new = try #require(server.resource("/f"))
                #expect(try readFile(destination) == new.content)
                #expect(new.content != old.content)
                #expect(result.validator.entityTag?.description == new.entityTagValue)
                let second = server.requests(for: "/f")[1]
                #expect(second.header("range") == "bytes=\(stored)-")
                #expect(second.header("if-range") == old.entityTagValue)
                #expect(log.restartKinds == ["remoteChanged"], "\(log.restartReasons)")
            }
        }
    }

    @Test func serverIgnoringRangeGivesTheCorrectFile() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "ignore", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, "/f", destination: destination, bytes: 100_000)
                server.script("/f", [[.ignoreRange]])
                let log = EventLog()
                _ = try await download(server, "/f", to: destination, log: log)
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests(for: "/f")[1].header("range") == "bytes=\(stored)-")
                #expect(log.restartReasons == [.rangeIgnored])
            }
        }
    }

    @Test(arguments: [Int64(100), -50_000, 1])
    func wrongContentRangeIsNeverSpliced(shift: Int64) async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "wrong-range", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, "/f", destination: destination, bytes: 100_000)
                server.script("/f", [[.wrongContentRange(shift: shift)]])
                let log = EventLog()
                _ = try await download(server, "/f", to: destination, log: log)
                #expect(try readFile(destination) == resource.content)
                let requests = server.requests(for: "/f")
                print("DEBUG", requests.map { "\($0.header("range") ?? "-") \($0.header("if-range") ?? "-")" }, log.all)
                #expect(requests.count == 3)
                #expect(requests[1].header("range") == "bytes=\(stored)-")
                #expect(requests[2].header("range") == nil)
                #expect(log.restartKinds == ["invalidContentRange"], "\(log.restartReasons)")
            }
        }
    }

    @Test func shortBodyIsNotReportedComplete() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "short", size: 200_000)
            server.add("/f", resource)
            server.script("/f", [[.shortBody(missing: 10)]])
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                try await withDownloader(testConfiguration(retries: 0)) { downloader in
                    await expectHaulError(.network) {
                        try await downloader.download(
                            DownloadRequest(url: server.url("/f"), destination: .file(destination)))
                    }
                }
                #expect(!fileExists(destination))
                let stored = try #require(fileSize(destination + ".haul.part"))
                #expect(stored > 0 && stored <= 199_990)
                _ = try await download(server, "/f", to: destination)
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests(for: "/f")[1].header("range") == "bytes=\(stored)-")
            }
        }
    }

    @Test func shortBodyIsRetriedWithinOneCall() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "short-retry", size: 200_000)
            server.add("/f", resource)
            server.script("/f", [[.shortBody(missing: 1)]])
            try await withTemporaryDirectory { directory in
                let log = EventLog()
                try await download(server, "/f", to: directory + "/f", log: log)
                #expect(try readFile(directory + "/f") == resource.content)
                #expect(log.retries.map(\.code) == [.network])
                let ranges = server.requests(for: "/f").map { $0.header("range") }
                #expect(ranges.count == 2 && ranges[0] == nil && ranges[1]?.hasPrefix("bytes=") == true)
            }
        }
    }

    @Test func rangeNotSatisfiableWithLongerLocalPartialRestarts() async throws {
        try await HaulTestServer.withRunning { server in
            let original = TestResource(name: "shrink", size: 1_000_000)
            server.add("/f", original)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                // A first session stored 600,000 bytes of the 1,000,000-byte file.
                let stored: Int64 = 600_000
                try plantPartialDownload(
                    at: try DownloadPaths.open(destination), resource: original, bytes: original.bytes(0..<stored),
                    written: stored, url: server.url("/f")
                )
                // Same validator, but the file is now shorter than what is on disk.
                server.update("/f") { $0.size = 500_000 }
                let log = EventLog()
                let result = try await download(server, "/f", to: destination, log: log)
                #expect(result.bytes == 500_000)
                #expect(try readFile(destination) == server.resource("/f")?.content)
                let requests = server.requests(for: "/f")
                #expect(requests.count == 2)
                #expect(requests[0].header("range") == "bytes=\(stored)-")
                #expect(requests[1].header("range") == nil)
                #expect(log.restartKinds == ["rangeNotSatisfiable"], "\(log.restartReasons)")
            }
        }
    }

    @Test func rangeNotSatisfiableWithoutContentRangeRestarts() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "bare-416", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, "/f", destination: destination, bytes: 100_000)
                server.script("/f", [[.status(416)]])
                _ = try await download(server, "/f", to: destination)
                #expect(try readFile(destination) == resource.content)
                let requests = server.requests(for: "/f")
                #expect(requests.count == 3)
                #expect(requests[1].header("range") == "bytes=\(stored)-")
                #expect(requests[2].header("range") == nil)
            }
        }
    }

    @Test func weakEntityTagIsNeverSentInIfRangeAndAChangeIsCaught() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "weak", size: 1_000_000, entityTag: .weak, lastModified: false))
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, "/f", destination: destination, bytes: 500_000)
                server.update("/f") { $0.version = 2 }
                let log = EventLog()
                _ = try await download(server, "/f", to: destination, log: log)
                #expect(try readFile(destination) == server.resource("/f")?.content)
                let second = server.requests(for: "/f")[1]
                #expect(second.header("if-range") == nil)
                #expect(second.header("range") == "bytes=\(max(0, stored - 65_536))-")
                #expect(log.restartKinds == ["remoteChanged"], "\(log.restartReasons)")
            }
        }
    }

    @Test func weakEntityTagResumesWhenNothingChanged() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "weak-same", size: 1_000_000, entityTag: .weak, lastModified: false)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, "/f", destination: destination, bytes: 500_000)
                let log = EventLog()
                let result = try await download(server, "/f", to: destination, log: log)
                #expect(try readFile(destination) == resource.content)
                #expect(log.restartReasons.isEmpty)
                #expect(result.resumedFrom == stored)
                #expect(result.bytesFetched == 1_000_000 - stored + min(stored, 65_536))
            }
        }
    }

    @Test func contentEncodingOnResumeIsNeverSpliced() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "encoded", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, "/f", destination: destination, bytes: 100_000)
                server.script("/f", [[.contentEncoding("gzip")]])
                let log = EventLog()
                _ = try await download(server, "/f", to: destination, log: log)
                #expect(try readFile(destination) == resource.content)
                let requests = server.requests(for: "/f")
                #expect(requests[1].header("range") == "bytes=\(stored)-")
                #expect(requests[2].header("range") == nil)
                #expect(log.restartReasons == [.contentEncoded("gzip")])
            }
        }
    }

    @Test func multipartAnswerToOneRangeIsRejected() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "multipart", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, "/f", destination: destination, bytes: 100_000)
                server.script("/f", [[.multipart]])
                let log = EventLog()
                _ = try await download(server, "/f", to: destination, log: log)
                #expect(try readFile(destination) == resource.content)
                #expect(log.restartReasons == [.multipartResponse])
                #expect(server.requests(for: "/f")[1].header("range") == "bytes=\(stored)-")
            }
        }
    }

    @Test func withoutValidatorsTheResumeRestartsUnlessTrusted() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "bare", size: 300_000, entityTag: .none, lastModified: false)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                try await interruptedSession(server, "/f", destination: destination, bytes: 100_000)
                let log = EventLog()
                _ = try await download(server, "/f", to: destination, log: log)
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests(for: "/f")[1].header("range") == nil)
                #expect(log.restartReasons == [.unvalidated])

                // Trusted: resumes, after comparing the overlap with the disk.
                let trusted = directory + "/trusted"
                let trustedStored = try await interruptedSession(server, "/f", destination: trusted, bytes: 100_000)
                var configuration = testConfiguration()
                configuration.trustUnvalidatedResume = true
                let result = try await withDownloader(configuration) { downloader in
                    try await downloader.download(DownloadRequest(url: server.url("/f"), destination: .file(trusted)))
                }
                #expect(try readFile(trusted) == resource.content)
                #expect(result.resumedFrom == trustedStored)
                #expect(server.requests(for: "/f").last?.header("range") == "bytes=\(max(0, trustedStored - 65_536))-")
            }
        }
    }

    @Test func lastModifiedIsUsedInIfRangeWhenThereIsNoEntityTag() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "dated", size: 300_000, entityTag: .none, lastModified: true)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                let stored = try await interruptedSession(server, "/f", destination: destination, bytes: 100_000)
                let firstModified = server.requests(for: "/f").count
                #expect(firstModified == 1)
                _ = try await download(server, "/f", to: destination)
                #expect(try readFile(destination) == resource.content)
                let second = server.requests(for: "/f")[1]
                #expect(second.header("range") == "bytes=\(stored)-")
                #expect(second.header("if-range")?.hasSuffix("GMT") == true)
            }
        }
    }

    @Test func corruptManifestRestartsFromZero() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "corrupt", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                let destination = directory + "/f"
                try await interruptedSession(server, "/f", destination: destination, bytes: 100_000)
                try writeFile(destination + ".haul.json", Array("{\"format\": 1, \"truncated".utf8))
                let log = EventLog()
                _ = try await download(server, "/f", to: destination, log: log)
                #expect(try readFile(destination) == resource.content)
                #expect(server.requests(for: "/f")[1].header("range") == nil)
                #expect(log.restartKinds == ["untrustedPartial"], "\(log.restartReasons)")
            }
        }
    }
}
