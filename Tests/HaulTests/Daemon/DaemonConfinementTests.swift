import Haul
import HaulTestServer
import Testing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A download root holds when the folders inside it change after a download was added: its files are
/// opened beneath the root when it runs, never through a link.
@Suite(.timeLimit(.minutes(1)))
struct DaemonConfinementTests {
    /// A folder beside the daemon's root, outside it.
    static func outside(_ daemon: DaemonHarness) -> String {
        let path = String(daemon.root.dropLast("files".count)) + "outside"
        mkdir(path, 0o755)
        return path
    }

    @Test func aFolderSwappedForALinkWhileItsDownloadWaitsIsNeverWrittenThrough() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/hold", TestResource(name: "hold", size: 4_000_000))
            server.setStandingFaults("/hold", [.stall(afterBytes: 100_000, seconds: 30)])
            server.add("/f", TestResource(name: "f", size: 50_000))
            server.add("/g", TestResource(name: "g", size: 50_000))
            try await withDaemon({ $0.manager.maxConcurrentDownloads = 1 }) { daemon in
                let outside = Self.outside(daemon)
                mkdir(daemon.root + "/race", 0o755)
                mkdir(daemon.root + "/named", 0o755)
                let hold = try await daemon.add(#"{"url": "\#(server.url("/hold"))", "destination": "hold.bin"}"#)[0]
                _ = try await daemon.waitFor(hold, "running")
                // Both accepted while the folders are plain folders inside the root.
                let file = try await daemon.add(#"{"url": "\#(server.url("/f"))", "destination": "race/x"}"#)[0]
                let named = try await daemon.add(#"{"url": "\#(server.url("/g"))", "directory": "named"}"#)[0]
                for name in ["race", "named"] {
                    #expect(rename(daemon.root + "/" + name, daemon.root + "/" + name + ".moved") == 0)
                    #expect(symlink(outside, daemon.root + "/" + name) == 0)
                }
                // The slot frees: each download opens its folder now, and finds a link.
                #expect(try await daemon.send(.POST, "/api/v1/downloads/\(hold)/pause").status == 200)
                for id in [file, named] {
                    let failed = try await daemon.waitFor(id, "failed")
                    #expect(failed.error?.code == "outsideDownloadRoot", "\(failed.error?.message ?? "")")
                }
                #expect(listDirectory(outside).isEmpty)
                #expect(server.requests(for: "/f").isEmpty && server.requests(for: "/g").isEmpty)

                // Removing with its files deletes nothing through the link either.
                try writeFile(outside + "/x", Array("keep".utf8))
                let removal = try await daemon.send(.DELETE, "/api/v1/downloads/\(file)?deleteFiles=true")
                #expect(removal.status == 403 && removal.errorCode == "outsideDownloadRoot", "\(removal.body)")
                #expect(try readFile(outside + "/x") == Array("keep".utf8))
            }
        }
    }

    @Test func aFolderMovedOutOfTheRootWhileWrittenGetsNoFinalName() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "moved", size: 300_000)
            server.add("/moved", resource)
            server.script("/moved", [[.stall(afterBytes: 100_000, seconds: 2)]])
            try await withDaemon({ $0.downloader.timeouts.stall = .seconds(20) }) { daemon in
                let outside = Self.outside(daemon)
                mkdir(daemon.root + "/sub", 0o755)
                let id = try await daemon.add(#"{"url": "\#(server.url("/moved"))", "destination": "sub/moved.bin"}"#)[
                    0]
                // While the server holds back the rest, the folder leaves the root (same file system).
                while !fileExists(daemon.root + "/sub/moved.bin.haul.part") || server.bodyBytesSent < 100_000 {
                    try await Task.sleep(for: .milliseconds(5))
                }
                #expect(rename(daemon.root + "/sub", outside + "/sub") == 0)
                let failed = try await daemon.waitFor(id, "failed")
                #expect(failed.error?.code == "outsideDownloadRoot", "\(failed.error?.message ?? "")")
                #expect(!fileExists(outside + "/sub/moved.bin"))
            }
        }
    }
}

/// Opening directories beneath a root: links refused on every way in, the root itself may be one.
@Suite struct ConfinementTests {
    @Test func linksBeneathARootAreRefusedWhetherOpenedOrCreated() async throws {
        try await withTemporaryDirectory { directory throws in
            let root = directory + "/root"
            mkdir(root, 0o755)
            mkdir(directory + "/elsewhere", 0o755)
            mkdir(root + "/plain", 0o755)
            symlink(directory + "/elsewhere", root + "/link")
            symlink(root + "/plain", root + "/inner")
            let confinement = DownloadConfinement(roots: [root])
            for (path, creating) in [
                ("link", false), ("link", true), ("link/deeper", true), ("plain/../link", false), ("inner", false),
            ] {
                #expect("\(path) creating: \(creating)") {
                    try confinement.directory(root + "/" + path, creating: creating)
                } throws: { error in
                    (error as? HaulError)?.code == .outsideDownloadRoot
                }
            }
            #expect(!fileExists(directory + "/elsewhere/deeper"))
            #expect(throws: HaulError.self) { try confinement.directory(directory + "/elsewhere") }
            // Plain folders open, and missing ones are made on the way.
            #expect(try confinement.directory(root + "/plain").path == root + "/plain")
            #expect(try confinement.directory(root + "/new/deeper", creating: true).path == root + "/new/deeper")
            #expect(fileExists(root + "/new/deeper"))
            // A root that is itself a link is followed: it is the caller's own choice.
            symlink(root, directory + "/alias")
            let aliased = DownloadConfinement(roots: [directory + "/alias"])
            #expect(try aliased.directory(directory + "/alias/plain").path == directory + "/alias/plain")
            #expect(try aliased.directory(root + "/plain").path == root + "/plain")
            #expect(throws: HaulError.self) { try aliased.directory(directory + "/alias/link") }
        }
    }

    /// A `/` followed by a combining mark is one Swift character, yet the kernel still reads the
    /// slash: `root/../\u{301}x` is `..` and then `\u{301}x`, above the root. Split by characters it
    /// was one name, and a download made that folder beside the root.
    @Test func aSlashBeforeACombiningMarkStillSeparates() async throws {
        try await withTemporaryDirectory { directory throws in
            let root = directory + "/root"
            mkdir(root, 0o755)
            let confinement = DownloadConfinement(roots: [root])
            #expect(POSIX.absolutePath(root + "/../\u{301}x").utf8.elementsEqual((directory + "/\u{301}x").utf8))
            for path in [root + "/../\u{301}x", root + "/a/../../\u{301}x/deeper"] {
                #expect(throws: HaulError.self, "\(path)") { try confinement.checkContains(path + "/f") }
                #expect("\(path)") {
                    try confinement.directory(path, creating: true)
                } throws: { error in
                    (error as? HaulError)?.code == .outsideDownloadRoot
                }
            }
            #expect(listDirectory(directory) == ["root"])
            // Such a name beneath the root is an ordinary folder there.
            let opened = try confinement.directory(root + "/\u{301}x", creating: true)
            #expect(opened.path.utf8.elementsEqual((root + "/\u{301}x").utf8))
            #expect(listDirectory(root).map { Array($0.utf8) } == [Array("\u{301}x".utf8)])
        }
    }

    /// On Linux a path is beneath a root when its bytes say so: "café" spelt with a combined é and
    /// with an e and an accent are two folders, though Swift's `==` takes them for one name (on
    /// APFS they are one folder).
    #if os(Linux)
        @Test func aPathIsBeneathARootByItsBytes() async throws {
            try await withTemporaryDirectory { directory throws in
                let root = directory + "/caf\u{E9}"
                let twin = directory + "/cafe\u{301}"
                #expect(root == twin && !root.utf8.elementsEqual(twin.utf8))
                mkdir(root, 0o755)
                mkdir(twin, 0o755)
                let confinement = DownloadConfinement(roots: [root])
                #expect {
                    try confinement.directory(twin + "/sub", creating: true)
                } throws: { error in
                    (error as? HaulError)?.code == .outsideDownloadRoot
                }
                #expect(throws: HaulError.self) { try confinement.checkContains(twin + "/f") }
                #expect(listDirectory(root).isEmpty && listDirectory(twin).isEmpty)
                // The root's own spelling opens beneath it, under the name asked for.
                let opened = try confinement.directory(root + "/sub", creating: true)
                #expect(opened.path.utf8.elementsEqual((root + "/sub").utf8))
                #expect(listDirectory(root) == ["sub"] && listDirectory(twin).isEmpty)
            }
        }
    #endif
}
