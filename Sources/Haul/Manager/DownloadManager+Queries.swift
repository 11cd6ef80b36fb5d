extension DownloadManager {
    /// The download with this ID, running or not.
    public func download(_ id: DownloadID) -> DownloadInfo? {
        entries[id]?.info
    }

    /// Downloads in the order they were enqueued, optionally only those in `states`.
    public func downloads(in states: Set<DownloadState>? = nil) -> [DownloadInfo] {
        entries.values.filter { states?.contains($0.state) ?? true }.map(\.info).sorted { $0.id < $1.id }
    }

    /// Progress over `ids` (every download when `nil`), weighted by bytes: a 1 GiB download counts
    /// a thousand times more than a 1 MiB one.
    public func aggregateProgress(of ids: [DownloadID]? = nil) -> AggregateProgress {
        let selected = ids.map { $0.compactMap { entries[$0] } } ?? Array(entries.values)
        return AggregateProgress(selected.map(\.info))
    }

    /// The process ID of the `haul` process running a download, when it is another live one.
    public func runningProcess(of id: DownloadID) -> String? {
        guard let owner = entries[id]?.record.owner, owner != claim.name, claim.isAlive(owner) else { return nil }
        return ProcessClaim.processID(of: owner)
    }
}
