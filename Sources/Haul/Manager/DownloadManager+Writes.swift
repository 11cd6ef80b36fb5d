import GRDB

/// How the manager writes its records. Changes made while downloads run (a download starts, learns
/// its file name, ends) are collected and written together: with many short downloads at once, one
/// transaction then carries the changes of several, and the manager spends its time starting
/// downloads rather than waiting for the database. Every write, deferred or not, carries all changes
/// still waiting, so a record is never overwritten by an older version of itself.
extension DownloadManager {
    /// Writes `records`, every change still waiting, and whatever `more` does, in one transaction.
    /// `more` runs last, so what it writes wins over a change that was still waiting.
    func write(_ records: [StoredDownload], more: (Database) throws -> Void = { _ in }) throws {
        let waiting = unwritten
        try store.write { db in
            for record in waiting.values where !records.contains(where: { $0.id == record.id }) {
                do {
                    try record.updateManagedColumns(db)
                } catch is RecordError {
                    // Removed meanwhile: nothing left to update.
                }
            }
            for record in records { try record.updateManagedColumns(db) }
            try more(db)
        }
        unwritten = [:]
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
