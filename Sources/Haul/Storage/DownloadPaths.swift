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

    /// The directory and the file name of `destination`.
    package static func split(_ destination: String) -> (directory: String, fileName: String) {
        guard let slash = destination.lastIndex(of: "/") else { return (".", destination) }
        let directory = String(destination[..<slash])
        return (directory.isEmpty ? "/" : directory, String(destination[destination.index(after: slash)...]))
    }

    package var partialName: String { fileName + Self.partialSuffix }
    package var manifestName: String { fileName + Self.manifestSuffix }
    package var manifestTemporaryName: String { manifestName + ".tmp" }

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
