import Observation
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One download as a UI shows it: properties that Observation tracks (SwiftUI redraws a view that
/// reads them), updated on the main actor from the manager's events, at most once per
/// ``DownloadManager/Configuration/progressInterval`` for progress.
///
/// ```swift
/// let model = try await manager.observe(id)
/// Text(model.state.description); ProgressView(value: model.fraction ?? 0)
/// ```
@MainActor @Observable
public final class ObservedDownload {
    /// The download as it stands.
    public private(set) var info: DownloadInfo

    /// The download's ID.
    public var id: DownloadID { info.id }
    /// Where it stands.
    public var state: DownloadState { info.state }
    /// Bytes on disk that a resume keeps.
    public var bytes: Int64 { info.bytes }
    /// The file's length, once known.
    public var totalBytes: Int64? { info.totalBytes }
    /// Between 0 and 1, once the length is known.
    public var fraction: Double? { info.fraction }
    /// Bytes per second, while running.
    public var bytesPerSecond: Double? { info.bytesPerSecond }
    /// Estimated seconds left, while running and when the length is known.
    public var secondsRemaining: Double? { info.secondsRemaining }
    /// Why it failed, or paused by itself.
    public var error: HaulError? { info.error }
    /// Where the file is or will be, once known.
    public var fileURL: URL? { info.fileURL }

    /// The task that keeps it up to date, ended with it.
    @ObservationIgnored let feed = Feed()

    init(_ info: DownloadInfo) { self.info = info }

    func update(_ info: DownloadInfo) { self.info = info }
}

/// The whole queue as a UI shows it: every download and their progress together, updated on the
/// main actor from the manager's events, at most once per
/// ``DownloadManager/Configuration/progressInterval`` for progress.
@MainActor @Observable
public final class ObservedQueue {
    /// Every download, oldest first.
    public private(set) var downloads: [DownloadInfo]
    /// Progress over every download, weighted by bytes.
    public private(set) var progress: AggregateProgress

    /// Downloads transferring now.
    public var running: Int { progress.running }
    /// Downloads waiting for a free slot.
    public var queued: Int { progress.queued }
    /// Downloads whose file is complete.
    public var completed: Int { progress.completed }
    /// Downloads that failed.
    public var failed: Int { progress.failed }
    /// Bytes done over bytes expected, over the downloads whose length is known.
    public var fraction: Double? { progress.fraction }

    /// The task that keeps it up to date, ended with it.
    @ObservationIgnored let feed = Feed()

    init(_ downloads: [DownloadInfo]) {
        self.downloads = downloads
        self.progress = AggregateProgress(downloads)
    }

    func update(_ downloads: [DownloadInfo]) {
        self.downloads = downloads
        self.progress = AggregateProgress(downloads)
    }
}

/// The task that feeds a model its events, cancelled when the model goes (its event subscription
/// ends with it).
final class Feed: Sendable {
    private let task = Mutex<Task<Void, Never>?>(nil)

    func attach(_ feeding: Task<Void, Never>) { task.withLock { $0 = feeding } }

    deinit { task.withLock { $0?.cancel() } }
}

extension DownloadManager {
    /// A model of download `id` for a UI, kept up to date until it is released or the manager
    /// closes.
    /// - Throws: ``HaulError/Code/unknownDownload`` for an ID the manager does not know.
    public func observe(_ id: DownloadID) async throws -> ObservedDownload {
        // Subscribed before the current state is read: no change in between is missed.
        let events = events()
        guard let info = download(id) else { throw HaulError(.unknownDownload, "there is no download \(id)") }
        let model = await ObservedDownload(info)
        // A download's progress events already come at most once per progress interval.
        model.feed.attach(
            Task { [weak model] in
                for await event in events where event.download.id == id {
                    guard let model else { return }
                    await model.update(event.download)
                }
            })
        return model
    }

    /// A model of `url`'s download (see ``info(for:)``) for a UI.
    /// - Throws: ``HaulError/Code/unknownDownload`` when there is no download of `url`.
    public func observe(_ url: URL) async throws -> ObservedDownload {
        guard let id = info(for: url)?.id else { throw HaulError(.unknownDownload, "there is no download of \(url)") }
        return try await observe(id)
    }

    /// A model of the whole queue for a UI, kept up to date until it is released or the manager
    /// closes.
    public func observeQueue() async -> ObservedQueue {
        let events = events()
        var known = Dictionary(uniqueKeysWithValues: downloads().map { ($0.id, $0) })
        let model = await ObservedQueue(Self.ordered(known))
        let interval = configuration.progressInterval
        let clock = self.clock
        model.feed.attach(
            Task { [weak model] in
                var lastUpdate: Moment?
                for await event in events {
                    if case .removed = event.kind {
                        known[event.download.id] = nil
                    } else {
                        known[event.download.id] = event.download
                    }
                    // Progress of many downloads is gathered and shown at most once per interval;
                    // anything else at once.
                    if case .transfer(.progress) = event.kind, let last = lastUpdate, clock.now - last < interval {
                        continue
                    }
                    lastUpdate = clock.now
                    guard let model else { return }
                    await model.update(Self.ordered(known))
                }
            })
        return model
    }

    private static func ordered(_ downloads: [DownloadID: DownloadInfo]) -> [DownloadInfo] {
        downloads.values.sorted { $0.id < $1.id }
    }
}
