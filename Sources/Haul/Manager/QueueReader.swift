/// Reads a queue's records as downloads, without a manager: what `haul ls --queue` shows of a
/// fleet's queue in PostgreSQL, where no process of this machine owns anything. It writes nothing,
/// so a record reads as its store has it (a download whose worker died reads as running on that
/// worker until another worker takes it over).
package struct QueueReader: Sendable {
    let store: any QueueStore

    /// A reader of `store`.
    package init(store: any QueueStore) { self.store = store }

    /// At most `limit` downloads (those in `states`, when given) whose ID is greater than `after`,
    /// in the order they were added (see ``DownloadManager/downloads(in:after:limit:)``).
    package func downloads(in states: Set<DownloadState>?, after: DownloadID?, limit: Int) throws -> [DownloadInfo] {
        try store.downloads(in: states, after: after, limit: max(0, limit)).map {
            DownloadManager.Entry(record: $0).info
        }
    }

    /// The ID of the download added last that is still recorded; 0 when there is none.
    package func newestID() throws -> DownloadID { try store.newestID() ?? DownloadID(0) }
}
