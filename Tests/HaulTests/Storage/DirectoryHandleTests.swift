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
}
