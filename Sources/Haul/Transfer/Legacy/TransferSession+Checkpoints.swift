import AsyncHTTPClient
import NIOCore
import NIOHTTP1

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Starting over, checkpointing and finishing: everything that changes the manifest.
extension TransferSession {

    var storedBytes: Int64 { manifest?.segments.reduce(0) { $0 + $1.written } ?? 0 }

    /// Discards the partial data and tells the observer why.
    mutating func startOver(_ reason: RestartReason) async throws {
        restarts += 1
        guard restarts <= configuration.retry.maximumRestarts else {
            throw HaulError(.remoteChanged, "gave up after \(restarts - 1) restarts: \(reason)")
        }
        if let file { try await file.truncate(to: 0) }
        if let paths { try await downloader.io.run { try ManifestStore.remove(paths) } }
        manifest = nil
        resumedFrom = nil
        observe(.restarted(reason))
    }

    /// Records progress in the manifest. A durable checkpoint first flushes the data, so the manifest
    /// can call those bytes durable, and then flushes the manifest itself.
    mutating func checkpoint(durable: Bool) async throws {
        guard manifest != nil, let file else { return }
        if durable {
            try await file.syncData()
            for index in manifest!.segments.indices {
                manifest!.segments[index].durable = manifest!.segments[index].written
            }
        }
        try await storeManifest(durable: durable)
    }

    mutating func storeManifest(durable: Bool) async throws {
        guard var manifest, let paths else { return }
        manifest.bootID = BootIdentity.current
        manifest.updatedAt = Int64(Date().timeIntervalSince1970)
        let snapshot = manifest
        try await downloader.io.run { try ManifestStore.store(snapshot, at: paths, durable: durable) }
        self.manifest = manifest
        manifestUnwritten = false
        lastCheckpoint = clock.now
    }

    /// Moves the complete file into place: verify, flush, rename, flush the directory, drop the manifest.
    /// Returns `nil` when verification against the server's digest failed and the download starts over.
    mutating func finish(totalBytes: Int64, hasher: StreamingHasher? = nil) async throws -> DownloadResult? {
        guard let paths else { throw HaulError(.fileSystem, "no destination was chosen") }
        if completedEarlier == nil, POSIX.exists(paths.partial) {
            guard try await verify(totalBytes: totalBytes, hasher: hasher) else { return nil }
        }
        let validator = manifest?.validator ?? ResourceValidator()
        // One trip to the thread pool for all of it: for a small file, the trips cost more than the work.
        // The directory flush is shared with downloads finishing beside this one; the manifest goes only
        // after it, so a crash never leaves the partial data without its manifest.
        let flusher = downloader.directoryFlusher
        let hasManifest = !manifestUnwritten
        let queued = try await downloader.io.run { [file] () throws -> UInt64? in
            if let file, POSIX.exists(paths.partial) {
                try file.syncDataNow()
                try POSIX.rename(paths.partial, to: paths.destination)
                if let ticket = try flusher.flushOrQueue(paths.directory) { return ticket }
            }
            if hasManifest { try ManifestStore.remove(paths) }
            return nil
        }
        if let queued {
            try await flusher.waitForFlush(of: paths.directory, ticket: queued, io: downloader.io)
            if hasManifest { try await downloader.io.run { try ManifestStore.remove(paths) } }
        }
        // A session that found the file already complete created an empty partial file to lock.
        if completedEarlier != nil, let lock, lock.created { lock.removePartial() }
        lock?.unlock()
        lock = nil
        return DownloadResult(
            destination: paths.destination, url: url.string, bytes: totalBytes, bytesFetched: bytesFetched,
            resumedFrom: resumedFrom ?? 0, restarts: restarts, validator: validator
        )
    }
}
