import Dispatch
import Foundation
import Synchronization
import Testing

@testable import Haul

@Suite("Files opened by name in a directory handle")
struct DirectoryHandleTests {
    @Test("listings made at the same time each see every entry")
    func concurrentListingsSeeEveryEntry() async throws {
        try await withTemporaryDirectory { root in
            let names = Set((0..<4000).map { "file-\($0)" })
            for name in names { _ = FileManager.default.createFile(atPath: root + "/" + name, contents: nil) }
            let directory = try DirectoryHandle.open(root)
            let listings = Mutex<[Set<String>]>([])
            DispatchQueue.concurrentPerform(iterations: 16) { _ in
                let listed = Set(directory.list())
                listings.withLock { $0.append(listed) }
            }
            let seen = listings.withLock { $0 }
            #expect(seen.count == 16)
            #expect(seen.allSatisfy { $0 == names })
        }
    }

    @Test("status of a path with a slash answers nothing rather than follow a link in it")
    func statusRefusesAPath() async throws {
        try await withTemporaryDirectory { root in
            try FileManager.default.createDirectory(atPath: root + "/outside", withIntermediateDirectories: true)
            _ = FileManager.default.createFile(atPath: root + "/outside/secret", contents: Data("x".utf8))
            try FileManager.default.createDirectory(atPath: root + "/inside", withIntermediateDirectories: true)
            try FileManager.default.createSymbolicLink(atPath: root + "/inside/link", withDestinationPath: "../outside")
            let inside = try DirectoryHandle.open(root + "/inside")
            #expect(inside.status("link") != nil)
            #expect(inside.status("link/secret") == nil)
            #expect(!inside.exists(".."))
            #expect(inside.exists("link"))
        }
    }

    @Test("open or create: a new file is created, an existing one opened as it is, a link refused")
    func openOrCreateTellsWhatItDid() async throws {
        try await withTemporaryDirectory { root in
            _ = FileManager.default.createFile(atPath: root + "/target", contents: Data("kept".utf8))
            try FileManager.default.createSymbolicLink(atPath: root + "/link", withDestinationPath: root + "/target")
            let folder = try DirectoryHandle.open(root)

            let (fresh, created) = try folder.openOrCreate("new", flags: O_RDWR)
            defer { close(fresh) }
            #expect(created)
            #expect(try readFile(root + "/new") == [])

            let (existing, createdAgain) = try folder.openOrCreate("target", flags: O_RDWR)
            defer { close(existing) }
            #expect(!createdAgain)
            let status = try #require(folder.status("target"))
            #expect(try POSIX.identity(existing) == [UInt64(status.st_dev), UInt64(status.st_ino)])
            #expect(try readFile(root + "/target") == Array("kept".utf8))

            let error = #expect(throws: HaulError.self) { try folder.openOrCreate("link", flags: O_RDWR) }
            #expect(error?.code == .fileSystem && error?.message.contains("cannot open") == true)
            #expect(try readFile(root + "/target") == Array("kept".utf8))
        }
    }
}
