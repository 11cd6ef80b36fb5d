/// Where a download keeps its files: the destination and, beside it, the partial data (which also
/// carries the lock that keeps a second process away) and the manifest, all by name in one open
/// directory.
package struct DownloadPaths: Sendable, Equatable {
    /// Suffix of the file holding the bytes received so far.
    package static let partialSuffix = ".haul.part"
    /// Suffix of the manifest describing the partial file.
    package static let manifestSuffix = ".haul.json"

    /// The directory that holds all of them, open.
    package let folder: DirectoryHandle
    /// The destination's file name, without its directory.
    package let fileName: String

    /// The files of the download named `fileName` in the open directory `folder`.
    package init(in folder: DirectoryHandle, fileName: String) {
        self.folder = folder
        self.fileName = fileName
    }

    /// Opens the directory of `destination` (as `confinement` allows) and names its files.
    package static func open(_ destination: String, confinement: DownloadConfinement = .none) throws -> DownloadPaths {
        let (directory, name) = split(destination)
        return DownloadPaths(in: try confinement.directory(directory), fileName: name)
    }

    /// The directory and the file name of `destination`, split at its last `/` byte, as the
    /// kernel reads a path: a name that starts with a combining mark is not one character with
    /// the slash before it. (Looking through the bytes also costs a tenth of looking through the
    /// characters, which an add of a million paths did twice each.)
    package static func split(_ destination: String) -> (directory: String, fileName: String) {
        guard let (directory, name) = POSIX.splitAtLastSlash(destination) else { return (".", destination) }
        return (directory.isEmpty ? "/" : directory, name)
    }

    package var partialName: String { Self.sideStem(of: fileName) + Self.partialSuffix }
    package var manifestName: String { Self.sideStem(of: fileName) + Self.manifestSuffix }
    package var manifestTemporaryName: String { manifestName + ".tmp" }

    /// The most bytes a name may have on the file systems Haul writes to.
    static let nameLimit = 255
    /// The longest suffix Haul adds to a name: `.haul.json.tmp`.
    static let longestSuffix = manifestSuffix.utf8.count + ".tmp".utf8.count

    /// What the files beside `fileName` are named after: the name itself, or, when a suffix would
    /// take it past 255 bytes, its start and a hash of the whole (`NAME~0123456789abcdef`), so a
    /// file of any name the file system takes can be downloaded. The hash never changes between
    /// versions: a later session finds the files an earlier one left.
    static func sideStem(of fileName: String) -> String {
        guard fileName.utf8.count + longestSuffix > nameLimit else { return fileName }
        let hash = Array(fileName.utf8).withUnsafeBytes { XXH64.hash($0) }
        let tag = "~" + String(hash, radix: 16).leftPadded(to: 16)
        var stem = ""
        for character in fileName {
            if stem.utf8.count + character.utf8.count + tag.utf8.count + longestSuffix > nameLimit { break }
            stem.append(character)
        }
        return stem + tag
    }

    /// Whether `stem` is a shortened one (see ``sideStem(of:)``): its files belong to a name longer
    /// than any Haul chooses itself, so they never name a download into a directory.
    static func isShortened(_ stem: String) -> Bool {
        guard let tilde = stem.lastIndex(of: "~") else { return false }
        let tag = stem[stem.index(after: tilde)...]
        return tag.count == 16 && tag.allSatisfy(\.isHexDigit)
    }

    /// The final file; it only appears once the download is complete.
    package var destination: String { folder.pathOf(fileName) }
    package var partial: String { folder.pathOf(partialName) }
    package var manifest: String { folder.pathOf(manifestName) }
    /// The directory's path.
    package var directory: String { folder.path }

    package static func == (left: DownloadPaths, right: DownloadPaths) -> Bool {
        left.destination == right.destination
    }
}

extension String {
    /// The string with zeros before it up to `width` characters.
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
