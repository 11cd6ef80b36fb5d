import Haul

extension DaemonClient: DownloadQueue {
    /// A page of the daemon's downloads (in `states`, when given), oldest first.
    public func downloads(in states: Set<DownloadState>?, offset: Int, limit: Int) async throws -> DownloadPage {
        let filter = states.map { "&state=" + $0.map(\.rawValue).sorted().joined(separator: ",") } ?? ""
        let page: DownloadList = try await call(.GET, "/downloads?offset=\(offset)&limit=\(limit)\(filter)")
        return DownloadPage(downloads: page.downloads.map(\.info), total: page.total)
    }

    /// One download; ``HaulError/Code/unknownDownload`` when the daemon has none with this ID.
    public func download(id: DownloadID) async throws -> DownloadInfo { try await download(id) }

    /// Queues a download in the daemon again, changed as `change` says. Cookies stay in this process:
    /// a change that carries them is refused.
    public func resume(_ id: DownloadID, with change: ResumeChange) async throws -> DownloadInfo {
        guard change.cookies == nil else {
            throw HaulError(
                .invalidArgument, "cookies are not handed to a haul daemon: give them to the daemon's own client")
        }
        return try await resume(
            id, url: change.url, headers: change.headers, secretHeaders: change.secretHeaders,
            credentials: change.credentials)
    }

    /// The daemon's options.
    public func options() async throws -> QueueOptions {
        let body: OptionsBody = try await call(.GET, "/options")
        return QueueOptions(
            maxConcurrentDownloads: body.maxConcurrentDownloads, totalBytesPerSecondLimit: body.totalLimitRate)
    }

    /// Changes the daemon's options.
    public func changeOptions(_ change: QueueOptions.Change) async throws -> QueueOptions {
        let body: OptionsBody = try await call(
            .PATCH, "/options",
            body: OptionsPatch(
                maxConcurrentDownloads: change.maxConcurrentDownloads, totalLimitRate: change.totalBytesPerSecondLimit))
        return QueueOptions(
            maxConcurrentDownloads: body.maxConcurrentDownloads, totalBytesPerSecondLimit: body.totalLimitRate)
    }

    /// The daemon's events from now on (see ``events(after:)``).
    public func queueEvents() async throws -> AsyncThrowingStream<QueueEvent, any Error> {
        let stream = try await events()
        return AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    for try await event in stream {
                        switch event {
                        case .download(let event): continuation.yield(.download(event))
                        case .reset: continuation.yield(.reset)
                        case .position: break
                        }
                    }
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }
}

/// The body of `PATCH /options`: only the options given, `null` to remove the total limit.
private struct OptionsPatch: Encodable {
    var maxConcurrentDownloads: Int?
    var totalLimitRate: Int64??

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: OptionsChange.CodingKeys.self)
        try container.encodeIfPresent(maxConcurrentDownloads, forKey: .maxConcurrentDownloads)
        if let limit = totalLimitRate { try container.encode(limit, forKey: .totalLimitRate) }
    }
}
