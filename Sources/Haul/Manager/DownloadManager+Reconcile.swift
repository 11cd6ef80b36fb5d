import HeapModule

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

extension DownloadManager {
    /// How many queued downloads of its own a manager holds in memory, best first (see
    /// ``line(_:)``); the rest wait in the store until these have started.
    static let windowSize = 512

    /// Makes the store agree with the processes alive, without reading every record: what a
    /// manager that died left queued is claimed, paused or let go as configured (one statement
    /// each, however many there are); what it left running, or any other record it owned, is
    /// reconciled one by one (a download whose manager died is queued again, its bytes come from
    /// the partial file's manifest, a download whose file was completed just before its process
    /// died is completed). Returns the first ``windowSize`` queued downloads this manager owns,
    /// and whether there are more. Other records are reconciled with the disk when they are read
    /// (see ``reload(_:)``).
    static func reconcile(
        store: any QueueStore, claim: any QueueOwnership, restoring: Configuration.RestoredDownloads,
        confinement: DownloadConfinement
    ) throws -> (entries: [DownloadID: Entry], waiting: Heap<WaitingDownload>, more: Bool) {
        let gone = try store.owners().filter { $0 == claim.name || !claim.isAlive($0) }
        // Queued downloads of gone managers (and ownerless ones), all together.
        switch restoring {
        case .resume:
            try store.reassignQueued(from: gone, includingUnowned: true, to: claim.name, now: now)
        case .leave:
            try store.reassignQueued(from: gone, includingUnowned: false, to: nil, now: now)
        case .pause:
            for owner in gone.map(Optional.some) + [nil] {
                while true {
                    let page = try store.downloads(ownedBy: owner, in: [.queued], after: nil, limit: 1_000)
                    guard !page.isEmpty else { break }
                    try store.update(
                        try page.map { original in
                            var record = original
                            try record.move(to: .paused, at: now)
                            record.owner = nil
                            return record
                        })
                }
            }
        }
        // Anything else a gone manager owned, and whatever was left running: few, one by one.
        var orphans: [StoredDownload] = []
        for owner in gone {
            orphans += try everyPage { after in
                try store.downloads(
                    ownedBy: owner, in: [.running, .paused, .completed, .failed, .cancelled], after: after, limit: 1_000
                )
            }
        }
        orphans += try everyPage { after in
            try store.downloads(ownedBy: nil, in: [.running], after: after, limit: 1_000)
        }
        var changed: [StoredDownload] = []
        for original in orphans {
            var record = original
            record.owner = nil
            if record.state == .running { try record.move(to: .queued, at: now) }
            record.bytesPerSecond = nil
            refreshFromDisk(&record, confinement: confinement)
            if record.state != .completed {
                switch restoring {
                case .resume:
                    if record.state == .queued || record.storedError?.code == .diskFull {
                        record.owner = claim.name
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
        }
        if !changed.isEmpty { try store.update(changed) }
        // Kept in memory: downloads paused by a full disk that this manager resumes once there is room.
        var entries: [DownloadID: Entry] = [:]
        for record in changed where record.owner == claim.name && record.state == .paused {
            entries[record.downloadID] = Entry(record: record)
        }
        let (window, more) = try loadWindow(store: store, owner: claim.name, confinement: confinement)
        var waiting = Heap<WaitingDownload>()
        for entry in window {
            entries[entry.id] = entry
            waiting.insert(WaitingDownload(priority: entry.record.priority, id: entry.id))
        }
        return (entries, waiting, more)
    }

    /// Every record of the pages `page` reads (from the first when given `nil`, then after the last
    /// ID it gave), in order: for the few records of a kind, read in bounded steps.
    static func everyPage(_ page: (DownloadID?) throws -> [StoredDownload]) throws -> [StoredDownload] {
        var all: [StoredDownload] = []
        var after: DownloadID?
        while true {
            let records = try page(after)
            all += records
            guard let last = records.last else { return all }
            after = last.downloadID
        }
    }

    /// The best ``windowSize`` queued downloads `owner` owns in the store, made to agree with the
    /// disk (a file completed by a process that died makes its download completed, and leaves it
    /// out), and whether there are more.
    static func loadWindow(
        store: any QueueStore, owner: String, confinement: DownloadConfinement, skipping held: Set<DownloadID> = []
    ) throws -> (entries: [Entry], more: Bool) {
        let records = try store.nextQueued(ownedBy: owner, limit: windowSize)
        var changed: [StoredDownload] = []
        var entries: [Entry] = []
        var folders = OpenFolders(confinement: confinement)
        for original in records where !held.contains(original.downloadID) {
            var record = original
            refreshFromDisk(&record, folders: &folders)
            if record != original {
                record.updatedAt = now
                if record.state == .completed { record.owner = nil }
                changed.append(record)
            }
            if record.state == .queued { entries.append(Entry(record: record)) }
        }
        if !changed.isEmpty { try store.update(changed) }
        return (entries, records.count == windowSize)
    }

    /// Sets a record's bytes (and state, where the files tell) from what is on disk now, as far as
    /// `confinement` lets its directory be opened (one that cannot be holds nothing).
    static func refreshFromDisk(_ record: inout StoredDownload, confinement: DownloadConfinement) {
        var folders = OpenFolders(confinement: confinement)
        refreshFromDisk(&record, folders: &folders)
    }

    /// ``refreshFromDisk(_:confinement:)`` with the directories of `folders`.
    static func refreshFromDisk(_ record: inout StoredDownload, folders: inout OpenFolders) {
        guard let destination = record.destination else {
            record.bytes = 0
            return
        }
        let paths = folders.paths(destination)
        func finished() -> stat? { paths?.folder.status(paths!.fileName) }
        switch record.state {
        case .completed:
            if let finished = finished() {
                record.bytes = Int64(finished.st_size)
            } else {
                let vanished = HaulError(.fileSystem, "the finished file \(destination) is no longer on disk")
                try? record.move(to: .failed, at: now, error: vanished)
                // Nothing of it is left: a retry starts from byte 0, and says so.
                record.bytes = 0
            }
        case .cancelled:
            record.bytes = 0
        case .queued, .paused, .failed, .running:
            if let progress = paths.flatMap(storedProgress) {
                record.bytes = progress.bytes
                record.totalBytes = progress.total ?? record.totalBytes
            } else if record.startedAt != nil, record.state == .queued, let finished = finished(),
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
        // Most downloads looked at (a long list just added) have neither: two looks, no open.
        let hasManifest = paths.folder.exists(paths.manifestName)
        if partialSize == nil && !hasManifest { return nil }
        guard hasManifest, let manifest = try? ManifestStore.load(paths) else { return (0, nil) }
        let bytes = manifest.trustedBytes(currentBootID: BootIdentity.current, partialSize: partialSize ?? 0)
        return (bytes, manifest.totalLength)
    }
}
