#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The files of one download: choosing and locking its destination, and everything that changes the
/// partial file or its manifest outside of writing bytes (checks, preparations, checkpoints, cuts,
/// verification, the final rename). Used by one ``TransferDriver`` at a time.
final class TransferFiles {
    let downloader: Downloader
    let request: DownloadRequest
    let url: DownloadURL
    private(set) var paths: DownloadPaths?
    /// The open directory a download given a directory goes into, once opened.
    private var folder: DirectoryHandle?
    private var lock: DestinationLock?
    private(set) var file: PartialFile?
    /// Whether a manifest of this download is on disk.
    private(set) var manifestOnDisk = false
    /// Whether the partial file was created empty when its lock was taken, and nothing was prepared
    /// in it since: its length is then known (0), and so is whether a manifest is on disk (the lock
    /// was held when it was looked for).
    private var partialIsNew = false
    /// Set when the complete file is already in place (a session died before removing its manifest).
    private var completeInPlace = false
    /// The running checksum of the file's first bytes, when the file is to be verified.
    private(set) var prefix: PrefixHash?

    var configuration: DownloaderConfiguration { downloader.configuration }

    /// Opens the destination of `request` (or, for a directory, an unfinished download of this URL in
    /// it) and tells what is stored there.
    init(downloader: Downloader, request: DownloadRequest, url: DownloadURL) {
        self.downloader = downloader
        self.request = request
        self.url = url
    }

    func open() throws -> FoundDownload {
        let confinement = downloader.confinement
        switch request.destination {
        case .file(let path):
            let paths = try DownloadPaths.open(path, confinement: confinement)
            guard !paths.folder.isDirectory(paths.fileName) else {
                throw HaulError(.fileSystem, "\(path) is a directory")
            }
            return try open(paths)
        case .directory(let directory):
            let folder = try confinement.directory(directory, creating: true)
            self.folder = folder
            guard let found = downloader.partials.find(url.string, in: folder) else { return .unnamed }
            return try open(found)
        }
    }

    /// Names the file from the first answer when the caller gave only a directory.
    func chooseDestination(contentDisposition: String?) throws -> FoundDownload {
        guard case .directory = request.destination, let folder else { return .nothing }
        let suggested = contentDisposition.flatMap(ContentDisposition.filename).flatMap(FileNaming.sanitize)
        let name = suggested ?? FileNaming.name(fromURLPath: url.url.path)
        let paths = DownloadPaths(in: folder, fileName: name)
        let found: FoundDownload
        do {
            found = try open(paths)
        } catch let error as HaulError where DestinationLock.isHeldElsewhere(error) {
            // Named by the answer, after a request: the name is another download's, not this one's
            // file held a while longer by a worker that let it go (which a manager waits for).
            throw HaulError(error.code, error.message, status: error.status, downloadID: error.downloadID)
        }
        downloader.partials.note(url.string, at: paths)
        return found
    }

    private func open(_ paths: DownloadPaths) throws -> FoundDownload {
        let lock = try DestinationLock.acquire(paths)
        let found: FoundDownload
        do {
            found = try inspect(paths, partialExists: !lock.created)
            if case .complete = found {
                completeInPlace = true
            } else {
                file = try lock.partialFile(io: downloader.io)
            }
        } catch {
            if lock.created { lock.removePartial() }
            lock.unlock()
            throw error
        }
        self.lock = lock
        self.paths = paths
        partialIsNew = lock.created && file != nil
        if case .stored(let manifest, _) = found, let file {
            return .stored(manifest, partialSize: try file.size())
        }
        return found
    }

    /// Reads what an earlier session left at `paths`. `partialExists` tells whether the partial file
    /// was there before the lock was taken.
    private func inspect(_ paths: DownloadPaths, partialExists: Bool) throws -> FoundDownload {
        var loaded: Manifest?
        var untrusted: RestartReason?
        do {
            loaded = try ManifestStore.load(paths)
        } catch let error as HaulError where error.code == .manifestCorrupt {
            untrusted = .untrustedPartial(error.message)
        }
        if loaded == nil, paths.folder.exists(paths.fileName), !request.overwrite {
            throw HaulError(.destinationExists, "\(paths.destination) already exists")
        }
        if case .directory = request.destination, let loaded, loaded.originalURL != url.string {
            throw HaulError(
                .destinationExists,
                "\(paths.partial) belongs to a download of \(loaded.originalURL); to continue it from this URL, "
                    + "name the file \(paths.fileName) explicitly, or remove it"
            )
        }
        manifestOnDisk = loaded != nil
        if let loaded, !partialExists {
            // A crash between the final rename and the manifest's removal leaves exactly this.
            if let total = loaded.totalLength, loaded.segments.reduce(0, { $0 + $1.written }) == total,
                let status = paths.folder.status(paths.fileName), Int64(status.st_size) == total
            {
                return .complete(totalBytes: total)
            }
            untrusted = .untrustedPartial("the manifest exists but \(paths.partial) is missing")
        } else if loaded == nil, partialExists, untrusted == nil {
            untrusted = .untrustedPartial("\(paths.partial) has no manifest")
        }
        if let untrusted {
            // A process killed while it wrote the first manifest leaves its temporary one: it goes
            // with the manifest once the file is finished.
            manifestOnDisk =
                manifestOnDisk || paths.folder.exists(paths.manifestName)
                || paths.folder.exists(paths.manifestTemporaryName)
            return .untrusted(untrusted)
        }
        if let loaded { return .stored(loaded, partialSize: 0) }
        return .nothing
    }

    /// Releases the lock, first removing what an unfinished download leaves behind that cannot help a
    /// later resume: the partial file when no manifest describes it.
    func release() {
        guard let paths, let lock else { return }
        if !paths.folder.exists(paths.manifestName) {
            // With a temporary manifest a killed process may have left beside it.
            try? ManifestStore.remove(paths, temporaryOnly: true)
            lock.removePartial()
            downloader.partials.forget(url.string, at: paths)
        }
        lock.unlock()
        self.lock = nil
        self.file = nil
    }

    private func partialFile() throws -> PartialFile {
        guard let file else { throw HaulError(.fileSystem, "no destination was chosen") }
        return file
    }

    private func destinationPaths() throws -> DownloadPaths {
        guard let paths else { throw HaulError(.fileSystem, "no destination was chosen") }
        return paths
    }

    // MARK: Stored data

    /// Keeps of a stored download what can be trusted: cuts a file written in order back to its
    /// trusted length, and re-checks the last recorded piece of every range (walking back over damaged
    /// ones, whose bytes are fetched again).
    func checkStoredData(_ trusted: Manifest) async throws -> StoredData {
        let file = try partialFile()
        var manifest = trusted
        if manifest.segments.count == 1 {
            let kept = manifest.segments[0].written
            if try file.size() > kept {
                // After a reboot the file may hold bytes that were never flushed (zeros or stale data).
                try await cut(&manifest, to: kept, file: file, durable: false)
            }
            let intact = try await Self.keptEnd(
                of: 0..<kept, pieces: &manifest.pieces, pieceSize: manifest.pieceSize, file: file)
            if intact < kept { try await cut(&manifest, to: intact, file: file, durable: true) }
            manifest.pieces = Array(manifest.pieces.prefix(Int(manifest.segments[0].written / manifest.pieceSize)))
        } else {
            let covered = Manifest.joined(manifest.segments.map { $0.start..<$0.start + $0.written })
            for range in covered {
                let kept = try await Self.keptEnd(
                    of: range, pieces: &manifest.pieces, pieceSize: manifest.pieceSize, file: file)
                guard kept < range.upperBound else { continue }
                for index in manifest.segments.indices where manifest.segments[index].start < range.upperBound {
                    let written = min(manifest.segments[index].written, max(0, kept - manifest.segments[index].start))
                    manifest.segments[index].written = written
                    manifest.segments[index].durable = min(manifest.segments[index].durable, written)
                }
            }
        }
        return StoredData(segments: manifest.segments, pieces: manifest.pieces)
    }

    /// Cuts the partial file and `manifest` back to `offset`, so neither claims a byte past it.
    private func cut(_ manifest: inout Manifest, to offset: Int64, file: PartialFile, durable: Bool) async throws {
        try await file.truncate(to: offset)
        manifest.truncate(to: offset)
        try await store(manifest, durable: durable)
    }

    /// Checks the recorded pieces wholly inside `range` from the last one back, until one is intact;
    /// returns the offset up to which the range's bytes can be kept: its end when the last recorded
    /// piece is intact (or none is recorded), else the end of the last intact piece before the damage
    /// (the start of the range when there is none). Damaged pieces lose their hashes.
    static func keptEnd(
        of range: Range<Int64>, pieces: inout [String?], pieceSize: Int64, file: PartialFile
    ) async throws -> Int64 {
        let first = Int((range.lowerBound + pieceSize - 1) / pieceSize)
        var index = min(Int(range.upperBound / pieceSize), pieces.count) - 1
        var damaged = false
        while index >= first {
            if let recorded = pieces[index] {
                if try await file.pieceHash(index, pieceSize: pieceSize) == recorded {
                    return damaged ? Int64(index + 1) * pieceSize : range.upperBound
                }
                damaged = true
                pieces[index] = nil
            }
            index -= 1
        }
        return damaged ? range.lowerBound : range.upperBound
    }

    // MARK: Preparing, checkpoints, cuts

    /// Makes the partial file ready for the bytes to come (see ``FilePreparation``).
    func prepare(_ preparation: FilePreparation) async throws {
        let file = try partialFile()
        let paths = try destinationPaths()
        let manifest = preparation.manifest
        let isNew = partialIsNew
        partialIsNew = false
        if let needed = preparation.neededBytes {
            try checkFreeSpace(
                needed: needed, countingPartial: preparation.startsOver && !isNew, paths: paths, file: file)
        }
        if preparation.startsOver {
            // When old data or an old manifest is replaced, the new manifest is flushed before any new
            // byte is written: after a power loss the old manifest can then never describe new data.
            let size = isNew ? 0 : try file.size()
            let replacing = manifestOnDisk || (!isNew && paths.folder.exists(paths.manifestName)) || size > 0
            if size > 0 { try await file.truncate(to: 0) }
            prefix = PrefixHash(algorithms: expectedAlgorithms(manifest.validator))
            if let total = manifest.totalLength, total <= Int64(configuration.storage.blockSize), !replacing {
                // A file that arrives in one block is finished as soon as it is written: it needs no
                // manifest unless it fails (a failure stores one), which spares a file creation, a
                // rename and a deletion per small file.
            } else {
                try await store(manifest, durable: replacing)
            }
        } else if preparation.storesLayout {
            try await store(manifest, durable: false)
        }
        if prefix == nil { prefix = PrefixHash(algorithms: expectedAlgorithms(manifest.validator)) }
        guard let reservation = preparation.reservation else { return }
        let storage = configuration.storage
        if let minimum = storage.directWriteMinimum, reservation.totalLength - reservation.from >= minimum {
            file.enableDirectWrites()
        }
        try await reserveSpace(
            total: reservation.totalLength, from: reservation.from, ranges: reservation.ranges, file: file)
        if reservation.ranges == 1, let prefix, !preparation.startsOver {
            // A resume hashes the part already on disk once, so the rest is hashed as it streams.
            try await prefix.catchUp(to: reservation.from, file: file)
        }
    }

    /// Refuses a download the volume cannot hold, before anything is written for it. Bytes a restart
    /// will truncate count as free.
    private func checkFreeSpace(needed: Int64, countingPartial: Bool, paths: DownloadPaths, file: PartialFile) throws {
        guard var free = paths.folder.freeSpace() else { return }
        if countingPartial { free += (try? file.size()) ?? 0 }
        let margin = configuration.storage.freeSpaceMargin
        guard needed + margin > free else { return }
        let keeping = margin > 0 ? " and \(ByteCount.format(margin)) must stay free" : ""
        throw HaulError(
            .insufficientSpace,
            "\(paths.directory) has \(ByteCount.format(free)) free, the download needs \(ByteCount.format(needed)) more"
                + keeping
        )
    }

    /// Reserves the space the rest of the download needs, as ``DownloaderConfiguration/FileAllocation``
    /// says. With one range the file's length must stay that of its written bytes (a resume on the same
    /// boot keeps what the length says), so only `fallocate` applies there, keeping the length. With
    /// several, the manifest already records each range's own progress, so the length may grow.
    /// What fits in one block is written in one go anyway: reserving it first would only cost a trip
    /// to the thread pool per small file.
    private func reserveSpace(total: Int64, from offset: Int64, ranges: Int, file: PartialFile) async throws {
        let allocation = configuration.storage.fileAllocation
        guard allocation != .none, total - offset > Int64(configuration.storage.blockSize) else { return }
        if allocation == .fallocate {
            if try await file.reserve(from: offset, upTo: total, keepingSize: ranges <= 1) { return }
            downloader.logger.notice(
                "the file system cannot reserve space for \(file.path); it grows as bytes arrive")
        }
        if ranges > 1 { try await file.extend(to: total) }
    }

    /// Stores `manifest` (replacing the one on disk atomically).
    func store(_ manifest: Manifest, durable: Bool) async throws {
        try await Checkpointer.storeStamped(
            manifest, at: try destinationPaths(), durable: durable, io: downloader.io,
            permit: configuration.writePermit)
        manifestOnDisk = true
    }

    /// What a checkpoint needs, to run beside the transfer.
    func checkpointer() throws -> Checkpointer {
        Checkpointer(
            file: try partialFile(), paths: try destinationPaths(), io: downloader.io,
            permit: configuration.writePermit)
    }

    /// Notes that a checkpoint beside the transfer stores a manifest.
    func noteManifestStored() { manifestOnDisk = true }

    /// Cuts a file written in order back to `offset`: the bytes after it are not kept.
    func cut(to offset: Int64) async throws {
        try await partialFile().truncate(to: offset)
        forgetHashes(from: offset)
    }

    /// Forgets the hash kept of the file's first bytes from `offset` on: they will be written again.
    func forgetHashes(from offset: Int64) {
        prefix?.forget(from: offset)
    }

    /// Deletes the partial data and the manifest: the download starts over.
    func discard() async throws {
        if let file { try await file.truncate(to: 0) }
        if let paths { try await downloader.io.run { try ManifestStore.remove(paths) } }
        manifestOnDisk = false
        prefix = nil
    }

    // MARK: Verifying and finishing

    /// The checksums the complete file must match: the caller's, and the strongest digest the server
    /// announced for the file.
    func expectedChecksums(_ validator: ResourceValidator?) -> [Checksum] {
        var expected: [Checksum] = []
        if let checksum = request.checksum { expected.append(checksum) }
        // With the same algorithm as the caller's checksum, the caller's value decides.
        if let strongest = validator?.digests.max(by: { $0.algorithm < $1.algorithm }),
            strongest.algorithm != request.checksum?.algorithm
        {
            expected.append(strongest)
        }
        return expected
    }

    private func expectedAlgorithms(_ validator: ResourceValidator) -> Set<DigestAlgorithm> {
        Set(expectedChecksums(validator).map(\.algorithm))
    }

    /// Checks the complete file against every expected checksum, hashing from the disk what the
    /// transfer did not hash as it streamed.
    ///
    /// A mismatch with the caller's checksum is final: the data stays under its partial name, so a
    /// corrected checksum finishes without downloading again. A mismatch with the server's own digest
    /// means the bytes are wrong, and the download starts over.
    func verify(totalBytes: Int64, validator: ResourceValidator) async throws -> Verification {
        let expected = expectedChecksums(validator)
        guard !expected.isEmpty, !completeInPlace, let file, let paths else { return .matches }
        let algorithms = Set(expected.map(\.algorithm))
        var hasher = prefix?.current(algorithms: algorithms) ?? StreamingHasher(algorithms: algorithms)
        if hasher.count > totalBytes { hasher = StreamingHasher(algorithms: algorithms) }
        hasher = try await file.hash(continuing: hasher, upTo: totalBytes)
        guard let mismatch = ChecksumMismatch.first(expected: expected, computed: hasher.finalize()) else {
            return .matches
        }
        if mismatch.expected == request.checksum {
            return .checksumMismatch(
                HaulError(
                    .checksumMismatch,
                    "checksum mismatch: \(mismatch.description); the data is kept in \(paths.partial)"))
        }
        return .digestMismatch(mismatch.description)
    }

    /// Moves the complete file into place: flush, rename, flush the directory, drop the manifest.
    /// `finishing.handedOver` runs as the file goes to the finisher; `finishing.beforeRename` once the
    /// data is durable, right before the rename (see ``FileFinisher/Handover/beforeRename``), where
    /// the write permit is asked.
    func finish(totalBytes: Int64, manifest: Manifest?, finishing: FinishingHooks) async throws -> String {
        let paths = try destinationPaths()
        if !completeInPlace, manifestOnDisk, var manifest {
            // Should the process die between the rename and the manifest's removal, the next session
            // finds the manifest saying the file is complete, and the file in place.
            manifest.segments = manifest.segments.map {
                Manifest.Segment(
                    start: $0.start, end: $0.end, written: ($0.end ?? totalBytes) - $0.start, durable: $0.durable)
            }
            try await store(manifest, durable: false)
        }
        // The data is flushed, the file renamed and the directory flushed together with the files
        // finishing beside this one; the manifest goes only after that, so a crash never leaves the
        // partial data without its manifest.
        if !completeInPlace, let file {
            let handover = FileFinisher.Handover(
                file: file, folder: paths.folder, partialName: paths.partialName, fileName: paths.fileName,
                confinement: downloader.confinement,
                beforeRename: { [destination = paths.destination] in await finishing.beforeRename(destination) },
                permit: configuration.writePermit, writtenSinceOpened: lock?.created == true)
            await finishing.handedOver()
            try await downloader.finisher.finish(handover, io: downloader.io)
        } else {
            await finishing.beforeRename(paths.destination)
        }
        if manifestOnDisk { try await downloader.io.run { try ManifestStore.remove(paths) } }
        manifestOnDisk = false
        // A session that found the file already complete created an empty partial file to lock.
        if completeInPlace, let lock, lock.created { lock.removePartial() }
        lock?.unlock()
        lock = nil
        downloader.partials.forget(url.string, at: paths)
        return paths.destination
    }
}

/// Stores checkpoints beside the transfer, on the I/O threads.
struct Checkpointer: Sendable {
    let file: PartialFile
    let paths: DownloadPaths
    let io: BlockingIO
    /// Asked right before the manifest replaces the last (see ``DownloaderConfiguration/writePermit``).
    let permit: (@Sendable () -> Bool)?

    /// Stores `checkpoint`: a durable one flushes the data first and records as durable what was
    /// written before the flush. Hashes from the file the written pieces no connection saw whole (those
    /// that straddle the start of a range, or a resume point) and returns them.
    func store(_ checkpoint: Checkpoint) async throws -> [Int: String] {
        var manifest = checkpoint.manifest
        if checkpoint.durable {
            try await file.syncData()
            for index in manifest.segments.indices {
                manifest.segments[index].durable = manifest.segments[index].written
            }
        }
        var found: [Int: String] = [:]
        let pieceSize = manifest.pieceSize
        for range in Manifest.joined(manifest.segments.map { $0.start..<$0.start + $0.written }) {
            let first = Int((range.lowerBound + pieceSize - 1) / pieceSize)
            let end = Int(range.upperBound / pieceSize)
            for index in first..<max(first, end) where index >= manifest.pieces.count || manifest.pieces[index] == nil {
                if let hash = try await file.pieceHash(index, pieceSize: pieceSize) { found[index] = hash }
            }
        }
        for (index, hash) in found {
            if manifest.pieces.count <= index {
                manifest.pieces += Array(repeating: nil, count: index + 1 - manifest.pieces.count)
            }
            manifest.pieces[index] = hash
        }
        try await Self.storeStamped(manifest, at: paths, durable: checkpoint.durable, io: io, permit: permit)
        return found
    }

    /// Stores `manifest` with this boot and the time on the I/O threads, replacing the one on disk
    /// atomically unless `permit` says no right before (see ``ManifestStore/store(_:at:durable:permit:)``).
    static func storeStamped(
        _ manifest: Manifest, at paths: DownloadPaths, durable: Bool, io: BlockingIO, permit: (@Sendable () -> Bool)?
    ) async throws {
        var manifest = manifest
        manifest.bootID = BootIdentity.current
        manifest.updatedAt = Int64(Date().timeIntervalSince1970)
        let snapshot = manifest
        try await io.run { try ManifestStore.store(snapshot, at: paths, durable: durable, permit: permit) }
    }
}

/// An expected checksum and the digest the bytes really have.
struct ChecksumMismatch {
    let expected: Checksum
    let actual: Checksum

    var description: String {
        "\(expected.algorithm.rawValue) is \(actual.hex), expected \(expected.hex)"
    }

    /// The first expected checksum that a computed digest of the same algorithm contradicts.
    static func first(expected: [Checksum], computed: [Checksum]) -> ChecksumMismatch? {
        for checksum in expected {
            if let actual = computed.first(where: { $0.algorithm == checksum.algorithm }), actual != checksum {
                return ChecksumMismatch(expected: checksum, actual: actual)
            }
        }
        return nil
    }
}
