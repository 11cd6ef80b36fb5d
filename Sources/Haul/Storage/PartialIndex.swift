import Synchronization

/// Which partial downloads a directory holds, by URL, for downloads that are given a directory and
/// name the file from the server's answer.
///
/// A directory is listed once, the first time a download goes into it; after that the names chosen
/// by this downloader's own downloads are added as they are chosen. Listing the directory for every
/// download instead would cost time in proportion to the directory's size for each file.
///
/// Every answer is checked against the manifest on disk, so an entry that went stale (the download
/// finished, or another process replaced it) is never used. A partial download another process
/// started after the listing is not found here; the session recognises it once the server's answer
/// names the file, and then resumes it instead of starting over.
final class PartialIndex: Sendable {
    /// Directory path → original URL → file name.
    private let directories = Mutex<[String: [String: String]]>([:])

    /// The unfinished download of `url` in `folder`, if there is one.
    func find(_ url: String, in folder: DirectoryHandle) -> DownloadPaths? {
        var known = directories.withLock { $0[folder.path] }
        if known == nil {
            let listed = Self.list(folder)
            known = directories.withLock { directories in
                // Names noted while the directory was being listed are newer than the listing.
                let merged = listed.merging(directories[folder.path] ?? [:]) { _, noted in noted }
                directories[folder.path] = merged
                return merged
            }
        }
        guard let name = known?[url] else { return nil }
        let paths = DownloadPaths(in: folder, fileName: name)
        guard let manifest = try? ManifestStore.load(paths), manifest.originalURL == url else { return nil }
        return paths
    }

    /// Records the name a download of `url` chose in its directory.
    func note(_ url: String, at paths: DownloadPaths) {
        directories.withLock { $0[paths.directory, default: [:]][url] = paths.fileName }
    }

    /// Forgets the name a download of `url` chose at `paths`: it left no partial download there (it
    /// finished, or its partial file went). Without this a long queue's finished downloads would
    /// stay in memory, one entry each, for as long as the downloader lasts.
    func forget(_ url: String, at paths: DownloadPaths) {
        directories.withLock { directories in
            guard directories[paths.directory]?[url] == paths.fileName else { return }
            directories[paths.directory]?[url] = nil
        }
    }

    /// How many downloads are remembered, in every directory.
    var count: Int { directories.withLock { $0.values.reduce(0) { $0 + $1.count } } }

    /// Every manifest in `folder`, by the URL it was started from; of two for the same URL, the
    /// one updated last.
    private static func list(_ folder: DirectoryHandle) -> [String: String] {
        var found: [String: (name: String, updated: Int64)] = [:]
        for name in folder.list() where name.hasSuffix(DownloadPaths.manifestSuffix) {
            let stem = String(name.dropLast(DownloadPaths.manifestSuffix.count))
            // A shortened stem belongs to a name no download into a directory is given.
            if DownloadPaths.isShortened(stem) { continue }
            let paths = DownloadPaths(in: folder, fileName: stem)
            guard let manifest = try? ManifestStore.load(paths) else { continue }
            if let best = found[manifest.originalURL], best.updated >= manifest.updatedAt { continue }
            found[manifest.originalURL] = (paths.fileName, manifest.updatedAt)
        }
        return found.mapValues(\.name)
    }
}
