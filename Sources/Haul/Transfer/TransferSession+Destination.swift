import AsyncHTTPClient
import NIOCore
import NIOHTTP1

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Choosing, locking and cleaning up the files of a download.
extension TransferSession {

    mutating func open(_ paths: DownloadPaths) throws {
        let lock = try DestinationLock.acquire(paths)
        do {
            try inspect(paths)
        } catch {
            lock.removeFile()
            throw error
        }
        self.lock = lock
        self.paths = paths
        if completedEarlier == nil { self.file = try PartialFile(path: paths.partial, io: downloader.io) }
    }

    /// Reads what an earlier session left at `paths` and decides what of it can be used.
    mutating func inspect(_ paths: DownloadPaths) throws {
        var loaded: Manifest?
        do {
            loaded = try ManifestStore.load(paths)
        } catch let error as HaulError where error.code == .manifestCorrupt {
            pendingRestart = .untrustedPartial(error.message)
        }
        let partialExists = POSIX.exists(paths.partial)
        if loaded == nil, POSIX.exists(paths.destination), !request.overwrite {
            throw HaulError(.destinationExists, "\(paths.destination) already exists; use --force to download it again")
        }
        if case .directory = request.destination, let loaded, loaded.originalURL != url.string {
            throw HaulError(
                .destinationExists,
                "\(paths.partial) belongs to a download of \(loaded.originalURL); to continue it from this URL, "
                    + "name it explicitly (-o \(paths.fileName)), or remove it"
            )
        }
        if let loaded, !partialExists {
            // A crash between the final rename and the manifest's removal leaves exactly this.
            if let total = loaded.totalLength, loaded.segments.first?.written == total,
                let status = POSIX.fileStatus(paths.destination), Int64(status.st_size) == total
            {
                completedEarlier = total
            } else {
                pendingRestart = .untrustedPartial("the manifest exists but \(paths.partial) is missing")
            }
        } else if loaded == nil, partialExists, pendingRestart == nil {
            pendingRestart = .untrustedPartial("\(paths.partial) has no manifest")
        }
        if pendingRestart == nil { self.manifest = loaded }
    }

    /// Removes what an unfinished call leaves behind that cannot help a later resume: the lock file
    /// always (the lock itself is released with it), the partial file when no manifest describes it.
    mutating func release() {
        guard let paths, let lock else { return }
        if !POSIX.exists(paths.manifest) { try? POSIX.unlink(paths.partial) }
        lock.removeFile()
        self.lock = nil
        self.file = nil
    }

    /// Names the file from the first response when the caller gave only a directory.
    mutating func adoptDestination(response: HTTPClientResponse) throws {
        guard case .directory(let directory) = request.destination else { return }
        let suggested = response.headers.first(name: "content-disposition")
            .flatMap(ContentDisposition.filename)
            .flatMap(FileNaming.sanitize)
        let name = suggested ?? FileNaming.name(fromURLPath: url.url.path)
        try open(DownloadPaths(destination: Self.join(directory, name)))
    }

    static func findPartial(in directory: String, for url: DownloadURL) -> DownloadPaths? {
        var best: (paths: DownloadPaths, updated: Int64)?
        for name in POSIX.listDirectory(directory) where name.hasSuffix(DownloadPaths.manifestSuffix) {
            let destination = join(directory, String(name.dropLast(DownloadPaths.manifestSuffix.count)))
            let paths = DownloadPaths(destination: destination)
            guard let manifest = try? ManifestStore.load(paths), manifest.originalURL == url.string else { continue }
            if best == nil || manifest.updatedAt > best!.updated { best = (paths, manifest.updatedAt) }
        }
        return best?.paths
    }

    static func join(_ directory: String, _ name: String) -> String {
        directory.hasSuffix("/") ? directory + name : directory + "/" + name
    }

    static func createDirectory(_ directory: String) throws {
        guard !POSIX.isDirectory(directory) else { return }
        try POSIX.makeDirectories(directory)
    }
}
