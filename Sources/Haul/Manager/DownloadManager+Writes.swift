/// How the manager writes its records. Changes made while downloads run (a download starts, learns
/// its file name, ends) are collected and written together: with many short downloads at once, one
/// transaction then carries the changes of several, and the manager spends its time starting
/// downloads rather than waiting for the database. Every write, deferred or not, carries all changes
/// still waiting, so a record is never overwritten by an older version of itself.
extension DownloadManager {
    /// Writes `records` and every change still waiting in one transaction.
    func write(_ records: [StoredDownload]) throws {
        try write(QueueChanges(updates: records))
    }

    /// Makes `changes` and every change still waiting in one transaction, and returns the IDs of
    /// the new records. The waiting changes go first (and only for records still stored), so what
    /// `changes` writes wins over them.
    @discardableResult
    func write(_ changes: QueueChanges) throws -> [DownloadID] {
        var changes = changes
        if !unwritten.isEmpty {
            let written = Set(changes.updates.lazy.map(\.downloadID))
            changes.updatesIfPresent =
                unwritten.values.filter { !written.contains($0.downloadID) } + changes.updatesIfPresent
        }
        let ids = try store.commit(changes)
        unwritten = [:]
        return ids
    }

    /// Notes a change to write with the next transaction; that follows at the latest once the work
    /// already queued on the manager is done.
    func writeSoon(_ record: StoredDownload) {
        unwritten[record.downloadID] = record
        guard !flushScheduled else { return }
        flushScheduled = true
        Task { self.flushUnwritten() }
    }

    /// Writes the changes still waiting. On failure they stay waiting for the next write.
    func flushUnwritten() {
        flushScheduled = false
        guard !unwritten.isEmpty else { return }
        try? write([])
    }

    /// Forgets a waiting change of a record that is being deleted.
    func dropUnwritten(_ id: DownloadID) {
        unwritten[id] = nil
    }
}
