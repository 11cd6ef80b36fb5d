/// Where a download keeps its files: the destination and, beside it, the partial data (which also
/// carries the lock that keeps a second process away) and the manifest.
package struct DownloadPaths: Sendable, Equatable {
    /// Suffix of the file holding the bytes received so far.
    package static let partialSuffix = ".haul.part"
    /// Suffix of the manifest describing the partial file.
    package static let manifestSuffix = ".haul.json"

    /// The final file; it only appears once the download is complete.
    package let destination: String

    package init(destination: String) { self.destination = destination }

    /// The paths of the file `fileName` in `directory`.
    package init(directory: String, fileName: String) {
        self.init(destination: directory.hasSuffix("/") ? directory + fileName : directory + "/" + fileName)
    }

    package var partial: String { destination + Self.partialSuffix }
    package var manifest: String { destination + Self.manifestSuffix }
    package var manifestTemporary: String { destination + Self.manifestSuffix + ".tmp" }

    /// The directory that holds all of them.
    package var directory: String {
        guard let slash = destination.lastIndex(of: "/") else { return "." }
        let directory = String(destination[..<slash])
        return directory.isEmpty ? "/" : directory
    }

    /// The destination's file name without its directory.
    package var fileName: String {
        guard let slash = destination.lastIndex(of: "/") else { return destination }
        return String(destination[destination.index(after: slash)...])
    }
}
