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
            try inspect(paths, partialExists: !lock.created)
        } catch {
            if lock.created { lock.removePartial() }
            throw error
        }
        self.lock = lock
        self.paths = paths
        if completedEarlier == nil { self.file = try lock.partialFile(io: downloader.io) }
    }

    /// Reads what an earlier session left at `paths` and decides what of it can be used.
    /// `partialExists` tells whether the partial file was there before the lock was taken.
    mutating func inspect(_ paths: DownloadPaths, partialExists: Bool) throws {
        var loaded: Manifest?
        do {
            loaded = try ManifestStore.load(paths)
        } catch let error as HaulError where error.code == .manifestCorrupt {
            pendingRestart = .untrustedPartial(error.message)
        }
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

    /// Releases the lock, first removing what an unfinished call leaves behind that cannot help a
    /// later resume: the partial file when no manifest describes it.
    mutating func release() {
        guard let paths, let lock else { return }
        if !POSIX.exists(paths.manifest) { lock.removePartial() }
        lock.unlock()
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
        let paths = DownloadPaths(directory: directory, fileName: name)
        try open(paths)
        downloader.partials.note(url.string, at: paths.destination, in: directory)
    }

    static func createDirectory(_ directory: String) throws {
        guard !POSIX.isDirectory(directory) else { return }
        try POSIX.makeDirectories(directory)
    }
}
