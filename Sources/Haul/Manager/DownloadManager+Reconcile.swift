import HeapModule

extension DownloadManager {
    /// Loads every record and makes it agree with the files on disk and the processes alive:
    /// a download whose manager died is queued again (then claimed, paused or left as configured);
    /// bytes come from the partial file's manifest; a missing partial means starting from zero; a
    /// finished file that vanished makes the download failed; a download whose file was completed
    /// just before its process died is completed.
    static func reconcile(
        store: any QueueStore, claim: ProcessClaim, restoring: Configuration.RestoredDownloads,
        confinement: DownloadConfinement
    ) throws -> ([DownloadID: Entry], Heap<WaitingDownload>) {
        var entries: [DownloadID: Entry] = [:]
        var waiting = Heap<WaitingDownload>()
        var changed: [StoredDownload] = []
        var alive: [String: Bool] = [:]
        for original in try store.allDownloads() {
            var record = original
            var orphan = false
            if let owner = record.owner {
                let ownerAlive = alive[owner] ?? claim.isAlive(owner)
                alive[owner] = ownerAlive
                if owner != claim.name && ownerAlive {
                    entries[record.downloadID] = Entry(record: record)
                    continue
                }
                record.owner = nil
                orphan = true
            } else if record.state == .queued || record.state == .running {
                orphan = true
            }
            if record.state == .running { try record.move(to: .queued, at: now) }
            record.bytesPerSecond = nil
            refreshFromDisk(&record, confinement: confinement)
            if orphan && record.state != .completed {
                switch restoring {
                case .resume:
                    if record.state == .queued || record.storedError?.code == .diskFull {
                        record.owner = claim.name
                    }
                    if record.state == .queued {
                        waiting.insert(WaitingDownload(priority: record.priority, id: record.downloadID))
                    }
                case .pause:
                    if record.state == .queued { try record.move(to: .paused, at: now) }
                case .leave:
                    break
                }
            }
            if record != original {
                record.updatedAt = now
                changed.append(record)
            }
            entries[record.downloadID] = Entry(record: record)
        }
        if !changed.isEmpty { try store.update(changed) }
        return (entries, waiting)
    }

    /// Sets a record's bytes (and state, where the files tell) from what is on disk now, as far as
    /// `confinement` lets its directory be opened (one that cannot be holds nothing).
    static func refreshFromDisk(_ record: inout StoredDownload, confinement: DownloadConfinement) {
        guard let destination = record.destination else {
            record.bytes = 0
            return
        }
        let paths = try? DownloadPaths.open(destination, confinement: confinement)
        let finished = paths?.folder.status(paths!.fileName)
        switch record.state {
        case .completed:
            if let finished {
                record.bytes = Int64(finished.st_size)
            } else {
                let vanished = HaulError(.fileSystem, "the finished file \(destination) is no longer on disk")
                try? record.move(to: .failed, at: now, error: vanished)
            }
        case .cancelled:
            record.bytes = 0
        case .queued, .paused, .failed, .running:
            if let progress = paths.flatMap(storedProgress) {
                record.bytes = progress.bytes
                record.totalBytes = progress.total ?? record.totalBytes
            } else if record.startedAt != nil, record.state == .queued, let finished,
                record.totalBytes == nil || record.totalBytes == Int64(finished.st_size)
            {
                // The file got its final name, but the process died before the record said so.
                try? record.move(to: .completed, at: now)
                record.bytes = Int64(finished.st_size)
                record.totalBytes = record.bytes
            } else {
                record.bytes = 0
            }
        }
    }

    /// The bytes a resume would keep and the total, from the manifest beside `paths`; `nil` when
    /// neither the partial file nor the manifest exists.
    static func storedProgress(_ paths: DownloadPaths) -> (bytes: Int64, total: Int64?)? {
        let partialSize = paths.folder.status(paths.partialName).map { Int64($0.st_size) }
        guard let manifest = try? ManifestStore.load(paths) else {
            return partialSize == nil && !paths.folder.exists(paths.manifestName) ? nil : (0, nil)
        }
        let bytes = manifest.trustedBytes(currentBootID: BootIdentity.current, partialSize: partialSize ?? 0)
        return (bytes, manifest.totalLength)
    }
}
