#if os(Linux)
    import Glibc
    import HaulTestServer
    import Testing

    @testable import Haul

    /// A destination's disk filling up, on a real small file system (a tmpfs): Linux only, and only
    /// as root (skipped otherwise).
    @Suite(
        "Disk space", .timeLimit(.minutes(1)),
        .enabled(if: canMountSmallFileSystem, "mounting a tmpfs needs root"))
    struct DiskSpaceTests {
        @Test("a full disk pauses the download with a clear error; it completes once space is freed")
        func diskFullPausesAndResumes() async throws {
            try await HaulTestServer.withRunning { server in
                try await withTemporaryDirectory { directory in
                    let small = directory + "/small"
                    try await withSmallFileSystem(at: small, size: 8 << 20) {
                        let resource = TestResource(name: "fills", size: 3 << 20)
                        server.add("/fills", resource)
                        server.setStandingFaults("/fills", [.throttle(bytesPerSecond: 1 << 20)])
                        // The manager checks for room on its clock: here, only when the test moves it.
                        let clock = ManualClock()
                        try await withManager(directory + "/state", clock: clock) { manager in
                            let id = try await manager.enqueue(
                                DownloadRequest(url: server.url("/fills"), destination: .file(small + "/fills")))
                            try await whileRunning(manager) {
                                try await waitFor(manager, id) { $0.bytes >= 256 * 1024 }
                                let filler = try fillFileSystem(small)
                                let paused = try await waitFor(manager, id) { $0.state == .paused }
                                #expect(paused.error?.code == .diskFull)
                                #expect(paused.error?.message.contains("No space left") == true)
                                #expect(paused.bytes > 0)
                                #expect(try readFile(small + "/fills.haul.part") == resource.bytes(0..<paused.bytes))
                                server.setStandingFaults("/fills", [])
                                #expect(unlink(filler) == 0)
                                // Room again, but no check yet: still paused. The next check resumes it.
                                #expect(await manager.download(id)?.state == .paused)
                                clock.advance(by: managerConfiguration().spaceCheckInterval)
                                let done = try await waitFor(manager, id) { $0.state == .completed }
                                #expect(done.error == nil)
                            }
                            #expect(try readFile(small + "/fills") == resource.content)
                            let last = try #require(server.requests(for: "/fills").last)
                            #expect(last.header("Range")?.hasPrefix("bytes=") == true)
                        }
                    }
                }
            }
        }

        @Test("a full disk fails a download that cannot be resumed at once, and drops its bytes")
        func diskFullFailsADownloadThatCannotBeResumed() async throws {
            try await HaulTestServer.withRunning { server in
                try await withTemporaryDirectory { directory in
                    let small = directory + "/small"
                    try await withSmallFileSystem(at: small, size: 8 << 20) {
                        // No ranges and no validator: a later attempt could keep nothing.
                        let resource = TestResource(
                            name: "plain", size: 3 << 20, entityTag: .none, lastModified: false, acceptRanges: false)
                        server.add("/plain", resource)
                        server.setStandingFaults("/plain", [.throttle(bytesPerSecond: 1 << 20)])
                        try await withManager(directory + "/state") { manager in
                            let id = try await manager.enqueue(
                                DownloadRequest(url: server.url("/plain"), destination: .file(small + "/plain")))
                            try await whileRunning(manager) {
                                try await waitFor(manager, id) { $0.bytes >= 256 * 1024 }
                                _ = try fillFileSystem(small)
                                let failed = try await waitFor(manager, id) { $0.state == .failed }
                                #expect(failed.error?.code == .diskFull)
                                #expect(failed.error?.message.contains("cannot be resumed") == true)
                            }
                            #expect(!fileExists(small + "/plain.haul.part") && !fileExists(small + "/plain"))
                        }
                    }
                }
            }
        }

        @Test("a download that does not fit fails before writing; the others go on")
        func insufficientSpacePreflight() async throws {
            try await HaulTestServer.withRunning { server in
                try await withTemporaryDirectory { directory in
                    let small = directory + "/small"
                    try await withSmallFileSystem(at: small, size: 4 << 20) {
                        server.add("/huge", TestResource(name: "huge", size: 6 << 20))
                        server.add("/fits", TestResource(name: "fits", size: 1 << 20))
                        var configuration = managerConfiguration(limit: 2)
                        configuration.freeSpaceMargin = 1 << 20
                        try await withManager(directory + "/state", configuration) { manager in
                            let huge = try await manager.enqueue(
                                DownloadRequest(url: server.url("/huge"), destination: .file(small + "/huge")))
                            let fits = try await manager.enqueue(
                                DownloadRequest(url: server.url("/fits"), destination: .file(small + "/fits")))
                            await manager.runUntilIdle()
                            let failed = try #require(await manager.download(huge))
                            #expect(failed.state == .failed)
                            #expect(failed.error?.code == .insufficientSpace)
                            #expect(failed.error?.message.contains("must stay free") == true)
                            #expect(fileSize(small + "/huge.haul.part") ?? 0 == 0)
                            #expect(await manager.download(fits)?.state == .completed)
                            #expect(try readFile(small + "/fits") == server.resource("/fits")!.content)
                        }
                    }
                }
            }
        }
    }
#endif
