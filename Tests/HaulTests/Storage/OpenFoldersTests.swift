import Foundation
import Testing

@testable import Haul

/// The directories a batch of downloads looks at: opened once, listed once asked about often, and
/// a listing that still finds every name that was there.
struct OpenFoldersTests {
    @Test func aDirectoryIsListedOnlyOnceItIsAskedAboutOften() throws {
        try withTemporaryDirectorySync { directory in
            try Data("a".utf8).write(to: URL(fileURLWithPath: directory + "/there"))
            var folders = OpenFolders(confinement: .none)
            let first = folders.paths(directory + "/there")
            #expect(first?.folder.exists("there") == true && first?.folder.exists("later") == false)
            // Not listed yet: a file made after the first look is seen.
            try Data("b".utf8).write(to: URL(fileURLWithPath: directory + "/later"))
            #expect(folders.paths(directory + "/later")?.folder.exists("later") == true)
            for _ in 3..<OpenFolders.looksBeforeListing { _ = folders.paths(directory + "/x") }
            // Listed now: the names there are found (and their sizes read), others are absent,
            // and a file made after the listing is not seen.
            let listed = folders.paths(directory + "/there")?.folder
            try Data("c".utf8).write(to: URL(fileURLWithPath: directory + "/after"))
            #expect(listed?.status("there")?.st_size == 1)
            #expect(listed?.exists("later") == true && listed?.exists("nothing") == false)
            #expect(listed?.exists("after") == false)
            // A directory that does not exist is tried once and gives no paths.
            #expect(folders.paths(directory + "/missing/file") == nil)
        }
    }

    @Test func aDirectoryWithMoreNamesThanTheLimitIsNotListed() throws {
        try withTemporaryDirectorySync { directory in
            for index in 0...OpenFolders.listingLimit {
                _ = FileManager.default.createFile(atPath: directory + "/f\(index)", contents: nil)
            }
            var folders = OpenFolders(confinement: .none)
            for _ in 0..<OpenFolders.looksBeforeListing { _ = folders.paths(directory + "/f0") }
            let folder = folders.paths(directory + "/f0")?.folder
            _ = FileManager.default.createFile(atPath: directory + "/made-later", contents: nil)
            // Still asked name by name: the file made after is seen.
            #expect(folder?.exists("made-later") == true && folder?.exists("f\(OpenFolders.listingLimit)") == true)
        }
    }
}
