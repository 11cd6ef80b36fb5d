#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// What apps have at hand: the URL they asked for and where the file should go. These calls are the
/// same queue as the ID-based ones, keyed differently: the same URL and destination are one download.
extension DownloadManager {
    // MARK: Running without a task group

    /// Runs the queue in a task this manager owns, for apps without a task group of their own, and
    /// returns at once; ``stop()`` ends it. Downloads an earlier stop interrupted go on (once that
    /// stop is over, when it is still under way). Does nothing while the queue already runs (from
    /// here or from a caller's ``run()``) and after ``close()``.
    public func start() {
        lifecycle.start { previous in
            Task {
                await previous?.value
                self.takeBackInterrupted()
                await self.run(stoppingWhenIdle: false, owned: true)
            }
        }
    }

    /// Stops the queue ``start()`` started: every running download stores a durable checkpoint and is
    /// queued again, to go on at the next ``start()`` (or in the next manager on this state). Returns
    /// once they have stopped.
    public func stop() async {
        guard let task = lifecycle.beginStop() else { return }
        task.cancel()
        await task.value
        lifecycle.endStop(task)
    }

    /// Queues again what a stop interrupted, as ``resume(_:url:headers:secretHeaders:credentials:cookies:)`` would
    /// (which reads the record anew: another process may have taken it meanwhile).
    private func takeBackInterrupted() {
        for id in interrupted.sorted() where download(id)?.state == .queued { try? resume(id) }
        interrupted = []
    }

    // MARK: Keyed by URL

    /// How ``download(_:to:options:checksum:headers:priority:onProgress:onStateChange:)`` treats
    /// the destination, as Alamofire's download options do.
    public struct Options: OptionSet, Sendable {
        public let rawValue: Int
        /// The options of this raw value.
        public init(rawValue: Int) { self.rawValue = rawValue }
        /// Make the folders of a `.file` destination that are missing (a `.directory` one is always made).
        public static let createIntermediateDirectories = Options(rawValue: 1 << 0)
        /// Replace a file already at the destination once the new one is complete (without it, a
        /// file in the way is refused with ``HaulError/Code/destinationExists``).
        public static let removePreviousFile = Options(rawValue: 1 << 1)
    }

    /// Queues a download of `url` into `destination` and returns its ID; the same URL and
    /// destination give the same download, and a completed one whose file is still there is
    /// reported complete, not fetched again. A download of them the user paused stays paused:
    /// ``resume(_:)-(URL)`` goes on with it.
    ///
    /// The callbacks are this call's own: each call adds its own pair, for as long as the download
    /// lasts. To follow a download from a screen that comes and goes (after a relaunch too), use
    /// ``updates(of:)-(URL)`` instead, which attaches without changing anything and ends when its task is
    /// cancelled.
    ///
    /// - Parameters:
    ///   - url: the http or https URL of the file.
    ///   - destination: the file, or the directory to name it in from the server's answer.
    ///   - options: what to do about missing folders and a file already there.
    ///   - checksum: the digest the complete file must have.
    ///   - headers: extra request headers; credentials among them are never stored.
    ///   - priority: its place in the queue.
    ///   - onProgress: called with the download as it stands after each progress report (at most
    ///     once per ``Configuration/progressInterval``).
    ///   - onStateChange: called with the download's current state at once, then after each change.
    ///   Both are called in order, on a task of their own (not on the main actor: a view model
    ///   follows ``updates(of:)-(URL)`` from a main-actor task instead), until the download completes, is
    ///   cancelled or removed, or the manager closes.
    /// - Throws: as ``enqueue(_:priority:)-(DownloadRequest,_)``.
    @discardableResult
    public func download(
        _ url: URL, to destination: DownloadRequest.Destination, options: Options = [], checksum: Checksum? = nil,
        headers: [(name: String, value: String)] = [], priority: DownloadPriority = .normal,
        onProgress: (@Sendable (DownloadInfo) -> Void)? = nil,
        onStateChange: (@Sendable (DownloadInfo) -> Void)? = nil
    ) async throws -> DownloadID {
        let request = DownloadRequest(
            url: url.absoluteString, destination: destination, headers: headers,
            overwrite: options.contains(.removePreviousFile), checksum: checksum)
        if options.contains(.createIntermediateDirectories), case .file(let path) = destination {
            try POSIX.makeDirectories(DownloadPaths.split(POSIX.absolutePath(path)).directory)
        }
        let added: DownloadID
        if let known = self.id(of: url), let info = download(known), info.state == .paused,
            info.request.destination == request.destination
        {
            // The user paused it: asking for it again (a screen shown anew) leaves it so.
            added = known
        } else {
            added = try await enqueue(request, priority: priority)
        }
        let id = added
        if onProgress != nil || onStateChange != nil {
            let events = events(for: id)
            Task {
                for await event in events {
                    switch event.kind {
                    case .transfer(.progress): onProgress?(event.download)
                    case .stateChanged: onStateChange?(event.download)
                    case .added, .removed, .transfer: break
                    }
                }
            }
        }
        return id
    }

    /// The download as it changes, starting with how it stands now, until it completes, is
    /// cancelled or removed, or the manager closes: for a view model, which iterates it on the main
    /// actor (`for await info in manager.updates(of: id) { rows[url] = info }`), in order. Attaching
    /// changes nothing of the download; cancelling the iterating task detaches.
    public func updates(of id: DownloadID) -> AsyncStream<DownloadInfo> {
        let events = events(for: id)
        let (stream, continuation) = AsyncStream<DownloadInfo>.makeStream(bufferingPolicy: .bufferingNewest(64))
        let forwarding = Task {
            for await event in events {
                switch event.kind {
                case .removed: continuation.finish()
                case .added, .stateChanged, .transfer(.progress): continuation.yield(event.download)
                case .transfer: break
                }
            }
            continuation.finish()
        }
        continuation.onTermination = { _ in forwarding.cancel() }
        return stream
    }

    /// ``updates(of:)-(DownloadID)`` of `url`'s download.
    /// - Throws: ``HaulError/Code/unknownDownload`` when there is no download of `url`.
    public func updates(of url: URL) throws -> AsyncStream<DownloadInfo> {
        updates(of: try existing(url))
    }

    /// The download of `url` (the latest one, when the same URL goes to several places); `nil` when
    /// there is none. A download given a new URL by ``resume(_:url:headers:secretHeaders:credentials:cookies:)`` is found by that one.
    public func info(for url: URL) -> DownloadInfo? {
        self.id(of: url).flatMap { download($0) }
    }

    /// Where the file of `url`'s download is (once complete) or will be; `nil` while a download into
    /// a directory has not learnt its name from the server, or when there is no download of `url`.
    public func fileURL(for url: URL) -> URL? {
        info(for: url)?.fileURL
    }

    /// Whether `url`'s download is complete and its file is still in place.
    public func isCompleted(_ url: URL) -> Bool {
        guard let info = info(for: url), info.state == .completed, let path = info.destination else { return false }
        return POSIX.exists(path)
    }

    /// Pauses `url`'s download (see ``pause(_:)-(DownloadID)``).
    /// - Throws: ``HaulError/Code/unknownDownload`` when there is no download of `url`.
    public func pause(_ url: URL) async throws {
        try await pause(try existing(url))
    }

    /// Queues `url`'s paused download again (see ``resume(_:url:headers:secretHeaders:credentials:cookies:)``).
    /// - Throws: ``HaulError/Code/unknownDownload`` when there is no download of `url`.
    public func resume(_ url: URL) throws {
        try resume(try existing(url))
    }

    /// Removes `url`'s download, and its finished file when `deletingFiles` (see
    /// ``remove(_:deletingFiles:)-(DownloadID,_)``).
    /// - Throws: ``HaulError/Code/unknownDownload`` when there is no download of `url`.
    public func remove(_ url: URL, deletingFiles: Bool = false) async throws {
        try await remove(try existing(url), deletingFiles: deletingFiles)
    }

    /// Cancels `url`'s download: stopped for good, its partial data deleted, its record kept as
    /// cancelled (see ``cancel(_:)-(DownloadID)``).
    /// - Throws: ``HaulError/Code/unknownDownload`` when there is no download of `url`.
    public func cancel(_ url: URL) async throws {
        try await cancel(try existing(url))
    }

    /// Removes every download of this queue, and their finished files when `deletingFiles`: what an
    /// app's "clear all" does. A running one is stopped first; one another process runs is left.
    /// Returns how many were removed.
    @discardableResult
    public func removeAll(deletingFiles: Bool = false) async -> Int {
        var removed = 0
        var after: DownloadID?
        while let page = try? storedPage(in: nil, after: after), let last = page.last {
            after = last.id
            for entry in page where (try? await remove(entry.id, deletingFiles: deletingFiles)) != nil {
                removed += 1
            }
        }
        return removed
    }

    /// The latest download of `url`: the store's records read page by page (an app's queue is
    /// short), with this manager's own versions of those it holds.
    private func id(of url: URL) -> DownloadID? {
        let text = url.absoluteString
        var found: DownloadID?
        var after: DownloadID?
        while let page = try? storedPage(in: nil, after: after), let last = page.last {
            after = last.id
            if let id = page.last(where: { $0.record.url == text })?.id { found = id }
        }
        return found
    }

    private func existing(_ url: URL) throws -> DownloadID {
        guard let id = id(of: url) else { throw HaulError(.unknownDownload, "there is no download of \(url)") }
        return id
    }
}

extension DownloadRequest.Destination {
    /// Exactly this file.
    public static func file(_ url: URL) -> Self { .file(url.path) }
    /// A file in this directory, named from the server's answer (as the case that takes a path).
    public static func directory(_ url: URL) -> Self { .directory(url.path) }
}

extension DownloadInfo {
    /// ``destination`` as a file URL, once known.
    public var fileURL: URL? { destination.map { URL(fileURLWithPath: $0) } }
}
