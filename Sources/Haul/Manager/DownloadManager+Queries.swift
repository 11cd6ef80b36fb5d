extension DownloadManager {
    /// The download with this ID, running or not, as this manager or the store has it.
    public func download(_ id: DownloadID) -> DownloadInfo? {
        trim()
        try? learn(id)
        return entries[id]?.info
    }

    /// The downloads with these IDs that exist, in the order given: each as ``download(_:)`` gives
    /// it, but read from the store many at a time, and not held in memory once answered.
    ///
    /// With `states`, only those in one of them: the others are not read from the store, so asking
    /// which of many downloads did not complete costs what those do. A download the store has in
    /// another state is left out even when a look at its file would change its state (a completed
    /// download whose file is gone fails as it is read).
    public func downloads(ids: [DownloadID], in states: Set<DownloadState>? = nil) -> [DownloadInfo] {
        var found: [DownloadID: DownloadInfo] = [:]
        var reading: [DownloadID] = []
        for id in ids {
            if let entry = entries[id], entry.record.owner == claim.name || unwritten.holds(id) {
                found[id] = entry.info
            } else {
                reading.append(id)
            }
        }
        var folders = OpenFolders(confinement: confinement)
        for start in stride(from: 0, to: reading.count, by: 500) {
            let chunk = Array(reading[start..<min(reading.count, start + 500)])
            guard let records = try? store.downloads(ids: chunk, in: states) else { continue }
            for record in records {
                try? reload(record.downloadID, stored: record, folders: &folders)
                found[record.downloadID] = entries[record.downloadID]?.info
            }
            trim()
        }
        // Those held in memory were not read through the store's filter.
        return ids.compactMap { found[$0] }.filter { states?.contains($0.state) ?? true }
    }

    /// Every download in the order they were enqueued, optionally only those in `states`. It
    /// holds them all: a long queue is better read by pages (``downloads(in:after:limit:)``).
    public func downloads(in states: Set<DownloadState>? = nil) -> [DownloadInfo] {
        var all: [DownloadInfo] = []
        var after: DownloadID?
        while let page = try? downloads(in: states, after: after, limit: 1_000), let last = page.last {
            all += page
            after = last.id
        }
        return all
    }

    /// At most `limit` downloads (those in `states`, when given) whose ID is greater than `after`
    /// (from the first when `nil`), in the order they were enqueued: a page read from the store,
    /// with what this manager knows better (the progress of what it runs). Pages read one after
    /// another, each after the last ID of the one before, list a queue of any size in little memory.
    public func downloads(in states: Set<DownloadState>?, after: DownloadID?, limit: Int) throws -> [DownloadInfo] {
        try storedPage(in: states, after: after, limit: limit).map(\.info)
    }

    /// How many downloads there are in each state (a state without any is absent).
    public func counts() throws -> [DownloadState: Int] {
        writeWaiting()
        return try store.counts()
    }

    /// The ID of the download added last that is still recorded; 0 when there is none.
    package func newestID() throws -> DownloadID {
        writeWaiting()
        return try store.newestID() ?? DownloadID(0)
    }

    /// A page of stored records by ID (see ``downloads(in:after:limit:)``), as entries: the held
    /// ones as this manager has them.
    func storedPage(in states: Set<DownloadState>?, after: DownloadID?, limit: Int = 500) throws -> [Entry] {
        writeWaiting()
        return try store.downloads(in: states, after: after, limit: max(0, limit)).map(listed)
    }

    /// The entry a list shows for a record it read from the store: what this manager runs or owns
    /// it knows best; what another runs, the store does (a fleet's worker holds downloads it
    /// queued that other workers then run).
    func listed(_ record: StoredDownload) -> Entry {
        if let known = entries[record.downloadID],
            known.record.owner == claim.name || unwritten.holds(known.id) || jobs[known.id] != nil
        {
            return known
        }
        return Entry(record: record)
    }

    /// Progress over `ids` (every download when `nil`), weighted by bytes: a 1 GiB download counts
    /// a thousand times more than a 1 MiB one.
    public func aggregateProgress(of ids: [DownloadID]? = nil) -> AggregateProgress {
        guard let ids else {
            // Summed by the store, with the speed of what runs here.
            writeWaiting()
            var progress = AggregateProgress()
            for (state, totals) in (try? store.totals()) ?? [:] {
                progress.downloads += totals.count
                progress.bytes += totals.bytes
                progress.totalBytes += totals.totalBytes
                progress.downloadsWithUnknownTotal += totals.unknownTotals
                switch state {
                case .running: progress.running += totals.count
                case .queued: progress.queued += totals.count
                case .completed: progress.completed += totals.count
                case .failed: progress.failed += totals.count
                case .paused: progress.paused += totals.count
                case .cancelled: progress.cancelled += totals.count
                }
            }
            for id in jobs.keys {
                guard let info = entries[id]?.info else { continue }
                progress.bytesPerSecond += info.bytesPerSecond ?? 0
            }
            return progress
        }
        return AggregateProgress(ids.compactMap { download($0) })
    }

    /// The process ID of the `haul` process running a download, when it is another live one.
    public func runningProcess(of id: DownloadID) -> String? {
        try? learn(id)
        guard let owner = entries[id]?.record.owner, owner != claim.name, claim.isAlive(owner) else { return nil }
        return ProcessClaim.processID(of: owner)
    }

    /// Writes the changes still waiting (see ``WriteBehind``), so that the store answers as this
    /// manager would; on failure they stay waiting.
    func writeWaiting() {
        guard !unwritten.isEmpty else { return }
        try? write([])
    }
}
