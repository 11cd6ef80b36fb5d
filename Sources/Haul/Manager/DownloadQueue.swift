/// What a download queue does, wherever it runs: a ``DownloadManager`` in this process, or a haul
/// daemon through its client. Code written against it (the `haul` command's verbs, an app's own
/// screens) works with either.
public protocol DownloadQueue: Sendable {
    /// Adds downloads, all of them or none when one is refused, and returns them as they stand once
    /// added.
    func add(_ requests: [DownloadRequest], priority: DownloadPriority) async throws -> [DownloadInfo]

    /// Adds downloads as ``add(_:priority:)`` does and returns only their IDs, in order: a long list
    /// added this way holds no answer for each download.
    func enqueue(_ requests: [DownloadRequest], priority: DownloadPriority) async throws -> [DownloadID]

    /// Adds the downloads of a list read a chunk at a time, all of them or none when one is
    /// refused, and returns their IDs in order (see ``DownloadManager/enqueue(_:priority:)-(DownloadRequestList,_)``).
    func enqueue(_ list: DownloadRequestList, priority: DownloadPriority) async throws -> [DownloadID]

    /// A page of the downloads (those in `states`, when given), in the order they were added, and how
    /// many there are over every page.
    func downloads(in states: Set<DownloadState>?, offset: Int, limit: Int) async throws -> DownloadPage

    /// The download with this ID; throws ``HaulError/Code/unknownDownload`` when there is none.
    func download(id: DownloadID) async throws -> DownloadInfo

    /// Stops a download, keeping its partial data, and returns it as it stands then.
    @discardableResult
    func pause(_ id: DownloadID) async throws -> DownloadInfo

    /// Queues a paused, interrupted or failed download again, changed as `change` says.
    @discardableResult
    func resume(_ id: DownloadID, with change: ResumeChange) async throws -> DownloadInfo

    /// Starts a failed or cancelled download again.
    @discardableResult
    func retry(_ id: DownloadID) async throws -> DownloadInfo

    /// Forgets a download: its partial data and record, and its finished file when `deletingFiles`.
    func remove(_ id: DownloadID, deletingFiles: Bool) async throws

    /// How many downloads run at once and the limit they share.
    func options() async throws -> QueueOptions

    /// Changes the options `change` names and returns them all as they stand then.
    func changeOptions(_ change: QueueOptions.Change) async throws -> QueueOptions

    /// The queue's events from now on: what happens to every download, and a reset when some were
    /// missed (read the downloads again). The stream ends when the queue closes, or with an error
    /// when it can no longer be followed.
    func queueEvents() async throws -> AsyncThrowingStream<QueueEvent, any Error>
}

extension DownloadQueue {
    /// The IDs of ``add(_:priority:)``'s answer.
    public func enqueue(_ requests: [DownloadRequest], priority: DownloadPriority) async throws -> [DownloadID] {
        try await add(requests, priority: priority).map(\.id)
    }

    /// ``enqueue(_:priority:)-([DownloadRequest],_)`` of every request of `list`, read into memory
    /// at once (a queue elsewhere takes a list in one call).
    public func enqueue(_ list: DownloadRequestList, priority: DownloadPriority) async throws -> [DownloadID] {
        try await enqueue(try list.all(), priority: priority)
    }
}

/// One page of a queue's downloads.
public struct DownloadPage: Sendable {
    /// The downloads on this page.
    public var downloads: [DownloadInfo]
    /// How many downloads match, over every page.
    public var total: Int

    /// A page of `downloads` out of `total`.
    public init(downloads: [DownloadInfo], total: Int) {
        self.downloads = downloads
        self.total = total
    }
}

/// What a resume changes of a download before queueing it again. Secrets (headers marked or named
/// so, credentials, cookies) are held in memory only, so a resume in a later process gives them again.
public struct ResumeChange: Sendable {
    /// A new URL for the same file (a link that expired); the partial data is kept when the file
    /// is unchanged.
    public var url: String?
    /// Headers in place of the stored ones.
    public var headers: [(name: String, value: String)]?
    /// Which of ``headers`` to hold as secret, beside those ``DownloadRequest/looksSecret(_:)`` knows.
    public var secretHeaders: Set<String>
    /// Basic credentials to send beside the headers.
    public var credentials: BasicCredentials?
    /// Cookies in place of the download's cookie jar (a queue in this process only: they are never
    /// handed to another process).
    public var cookies: CookieJar?

    /// A change of the parts given; the rest stays as it is.
    public init(
        url: String? = nil, headers: [(name: String, value: String)]? = nil, secretHeaders: Set<String> = [],
        credentials: BasicCredentials? = nil, cookies: CookieJar? = nil
    ) {
        self.url = url
        self.headers = headers
        self.secretHeaders = secretHeaders
        self.credentials = credentials
        self.cookies = cookies
    }
}

/// A queue's settings that may change while it runs.
public struct QueueOptions: Sendable, Equatable {
    /// At most this many downloads transfer at once.
    public var maxConcurrentDownloads: Int
    /// The most bytes per second all downloads together may receive (`nil`: no limit).
    public var totalBytesPerSecondLimit: Int64?

    /// Options as given.
    public init(maxConcurrentDownloads: Int, totalBytesPerSecondLimit: Int64?) {
        self.maxConcurrentDownloads = maxConcurrentDownloads
        self.totalBytesPerSecondLimit = totalBytesPerSecondLimit
    }

    /// The options to change; `nil` leaves one as it is.
    public struct Change: Sendable {
        /// The new number of downloads at once (at least 1).
        public var maxConcurrentDownloads: Int?
        /// The new total limit: `.some(nil)` removes it.
        public var totalBytesPerSecondLimit: Int64??

        /// A change of the options given.
        public init(maxConcurrentDownloads: Int? = nil, totalBytesPerSecondLimit: Int64?? = nil) {
            self.maxConcurrentDownloads = maxConcurrentDownloads
            self.totalBytesPerSecondLimit = totalBytesPerSecondLimit
        }
    }
}

/// One event of a queue's stream.
public enum QueueEvent: Sendable {
    /// What happened to a download.
    case download(DownloadManagerEvent)
    /// Events were missed: what is shown must be read again.
    case reset
}

extension DownloadManager: DownloadQueue {
    /// Adds downloads (see ``enqueue(_:priority:)-([DownloadRequest],_)``) and returns them.
    public func add(_ requests: [DownloadRequest], priority: DownloadPriority) async throws -> [DownloadInfo] {
        // As the add left them, without reading any again.
        try await enqueueAnswering(requests, priority: priority).compactMap(\.info)
    }

    /// A page of ``downloads(in:)``, read from the store (with this manager's own versions of the
    /// downloads it holds), and the total from the store's counts.
    public func downloads(in states: Set<DownloadState>?, offset: Int, limit: Int) throws -> DownloadPage {
        let counts = try counts()
        let total = counts.filter { states?.contains($0.key) ?? true }.values.reduce(0, +)
        let records = try store.downloads(in: states, offset: max(0, offset), limit: max(0, limit))
        return DownloadPage(downloads: records.map { listed($0).info }, total: total)
    }

    /// A page of the downloads in `states` in the order they start (higher priority first, then
    /// older), and how many there are over every page. Each page sorts the downloads in `states`:
    /// meant for the waiting line of a queue of moderate length.
    public func downloadsInStartOrder(in states: Set<DownloadState>, offset: Int, limit: Int) throws -> DownloadPage {
        let total = try counts().filter { states.contains($0.key) }.values.reduce(0, +)
        let records = try store.downloadsInStartOrder(in: states, offset: max(0, offset), limit: max(0, limit))
        return DownloadPage(downloads: records.map { listed($0).info }, total: total)
    }

    /// The download with this ID, as the database has it when another process added or runs it;
    /// throws ``HaulError/Code/unknownDownload`` when there is none.
    public func download(id: DownloadID) throws -> DownloadInfo {
        try learn(id)
        guard let info = download(id) else { throw HaulError(.unknownDownload, "there is no download \(id)") }
        return info
    }

    /// Queues a download again (see ``resume(_:url:headers:secretHeaders:credentials:cookies:)``).
    public func resume(_ id: DownloadID, with change: ResumeChange) throws -> DownloadInfo {
        try resume(
            id, url: change.url, headers: change.headers, secretHeaders: change.secretHeaders,
            credentials: change.credentials, cookies: change.cookies)
        return try download(id: id)
    }

    /// The queue's options as they stand.
    public func options() -> QueueOptions {
        QueueOptions(
            maxConcurrentDownloads: configuration.maxConcurrentDownloads,
            totalBytesPerSecondLimit: configuration.bytesPerSecondLimit)
    }

    /// Changes the options given (see ``setMaxConcurrentDownloads(_:)`` and
    /// ``setBytesPerSecondLimit(_:)``).
    public func changeOptions(_ change: QueueOptions.Change) throws -> QueueOptions {
        if let count = change.maxConcurrentDownloads, count < 1 {
            throw HaulError(.invalidArgument, "downloads at once must be at least 1, not \(count)")
        }
        if case .some(.some(let limit)) = change.totalBytesPerSecondLimit, limit < 1 {
            throw HaulError(.invalidArgument, "a rate limit must be a positive number of bytes per second")
        }
        if let count = change.maxConcurrentDownloads { setMaxConcurrentDownloads(count) }
        if let limit = change.totalBytesPerSecondLimit { setBytesPerSecondLimit(limit) }
        return options()
    }

    /// ``events()``, as a queue's events.
    public nonisolated func queueEvents() -> AsyncThrowingStream<QueueEvent, any Error> {
        let events = events()
        return AsyncThrowingStream { continuation in
            let task = Task {
                for await event in events { continuation.yield(.download(event)) }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }
}
