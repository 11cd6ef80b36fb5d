#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The stable identity of a download in a ``DownloadManager``; it survives restarts of the process.
public struct DownloadID: Hashable, Sendable, Comparable, CustomStringConvertible, Codable {
    /// The number the state database gave the download.
    public let rawValue: Int64

    /// The ID with this number.
    public init(_ rawValue: Int64) { self.rawValue = rawValue }

    /// The number, as `haul ls` shows it.
    public var description: String { String(rawValue) }

    /// Earlier downloads have smaller IDs.
    public static func < (left: DownloadID, right: DownloadID) -> Bool { left.rawValue < right.rawValue }
}

/// Which waiting download starts first: higher priorities first, then in the order they were enqueued.
public struct DownloadPriority: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// Higher numbers start first.
    public let rawValue: Int

    /// A priority of `rawValue`; ``low``, ``normal`` and ``high`` are -10, 0 and 10.
    public init(_ rawValue: Int) { self.rawValue = rawValue }

    /// Starts after every normal and high priority download.
    public static let low = DownloadPriority(-10)
    /// The default.
    public static let normal = DownloadPriority(0)
    /// Starts before every normal and low priority download.
    public static let high = DownloadPriority(10)

    /// `low`, `normal`, `high`, or the number.
    public var description: String {
        switch self {
        case .low: "low"
        case .normal: "normal"
        case .high: "high"
        default: String(rawValue)
        }
    }

    /// Lower priorities compare smaller.
    public static func < (left: DownloadPriority, right: DownloadPriority) -> Bool { left.rawValue < right.rawValue }
}

/// Where a download stands. No state is transitional: a download that was running when its process
/// died is `queued` again when the state is next opened.
public enum DownloadState: String, Sendable, CaseIterable, Codable, CustomStringConvertible {
    /// Waiting for a free slot.
    case queued
    /// Transferring now.
    case running
    /// Stopped with its partial data kept; `resume` continues it. A download paused because the disk
    /// filled up resumes by itself once there is room again.
    case paused
    /// The file is complete under its final name.
    case completed
    /// Stopped by an error that retrying on its own would not fix; `retry` tries again.
    case failed
    /// Stopped for good by the user; its partial data was deleted.
    case cancelled

    /// The state's name, as the database and `haul ls` write it.
    public var description: String { rawValue }

    /// Whether the download has ended (it starts again only when asked to).
    public var isFinished: Bool { self == .completed || self == .failed || self == .cancelled }
}

/// Everything known about one download, whether or not it is running and in whichever process.
public struct DownloadInfo: Sendable, Identifiable {
    /// The download's ID, stable while its record exists.
    public let id: DownloadID
    /// What was asked for, as the next attempt asks for it: the latest URL given (for links that
    /// expire), the headers, mirrors, checksum and limits. Its destination's path is absolute.
    /// Secret headers and cookies are there only in the process that was given them.
    public var request: DownloadRequest
    /// The path of the file, once known (a download into a directory learns its name from the server).
    public var destination: String?
    /// Where the download stands.
    public var state: DownloadState
    /// Its place in the queue: higher priorities start first.
    public var priority: DownloadPriority
    /// Bytes on disk that a resume keeps.
    public var bytes: Int64
    /// The file's length, once the server announced it.
    public var totalBytes: Int64?
    /// Bytes per second, while running.
    public var bytesPerSecond: Double?
    /// Estimated time left, while running and when the total is known.
    public var secondsRemaining: Double?
    /// Why the download failed, or why it paused by itself (a full disk).
    public var error: HaulError?
    /// When the download was first enqueued.
    public var createdAt: Date
    /// When it completed, failed or was cancelled.
    public var finishedAt: Date?
    /// What the program run at the download's end reported (`on-complete exited 0`), if one ran;
    /// see ``DownloadManager/recordHookResult(_:_:)``.
    public var hook: String?
    /// Connections open at the last progress report, while running.
    public var openConnections: Int?
    /// Who runs the download, while it runs: the worker's name in a fleet sharing a queue in
    /// PostgreSQL (`host.pid.n`), else the haul process's (`pid.n`).
    public var worker: String?

    /// A download as a daemon's answer describes it.
    package init(
        id: DownloadID, request: DownloadRequest, destination: String?, state: DownloadState,
        priority: DownloadPriority, bytes: Int64, totalBytes: Int64?, bytesPerSecond: Double?,
        secondsRemaining: Double?, error: HaulError?, createdAt: Date, finishedAt: Date?, hook: String?,
        openConnections: Int? = nil, worker: String? = nil
    ) {
        self.id = id
        self.request = request
        self.destination = destination
        self.state = state
        self.priority = priority
        self.bytes = bytes
        self.totalBytes = totalBytes
        self.bytesPerSecond = bytesPerSecond
        self.secondsRemaining = secondsRemaining
        self.error = error
        self.createdAt = createdAt
        self.finishedAt = finishedAt
        self.hook = hook
        self.openConnections = openConnections
        self.worker = worker
    }

    /// The URL the next attempt uses (``DownloadRequest/url``).
    public var url: String { request.url }
    /// The directory the file goes to, when the request named a directory rather than a file.
    public var directory: String? {
        guard case .directory(let path) = request.destination else { return nil }
        return path
    }

    /// Whether the download paused by itself because its disk is full; it goes on once there is room.
    public var isWaitingForSpace: Bool { state == .paused && error?.code == .diskFull }

    /// Between 0 and 1, when the total is known.
    public var fraction: Double? {
        guard let totalBytes else { return state == .completed ? 1 : nil }
        guard totalBytes > 0 else { return 1 }
        return min(1, Double(bytes) / Double(totalBytes))
    }

    /// The file's name: the destination's last component, else the URL's last path segment.
    public var name: String {
        if let destination { return DownloadPaths.split(destination).fileName }
        return URL(string: url)?.lastPathComponent.nonEmpty ?? url
    }
}

/// Progress summed over several downloads, weighted by bytes.
public struct AggregateProgress: Sendable, Equatable {
    /// Bytes stored, over every download counted.
    public var bytes: Int64 = 0
    /// The sum of the known totals.
    public var totalBytes: Int64 = 0
    /// Downloads whose total is not known yet; while any are, `fraction` is only a lower bound.
    public var downloadsWithUnknownTotal: Int = 0
    /// The running downloads' speed together, in bytes per second.
    public var bytesPerSecond: Double = 0
    /// Downloads transferring now.
    public var running: Int = 0
    /// Downloads waiting for a free slot.
    public var queued: Int = 0
    /// Downloads stopped with their data kept, until resumed.
    public var paused: Int = 0
    /// Downloads stopped for good by the user.
    public var cancelled: Int = 0
    /// Downloads whose file is complete.
    public var completed: Int = 0
    /// Downloads that failed.
    public var failed: Int = 0
    /// Every download counted.
    public var downloads: Int = 0

    /// Bytes done over bytes expected, counting only downloads whose total is known.
    public var fraction: Double? {
        guard totalBytes > 0 else { return nil }
        return min(1, Double(bytes) / Double(totalBytes))
    }

    /// Nothing counted yet.
    public init() {}

    /// The progress over `downloads`.
    public init(_ downloads: [DownloadInfo]) {
        for info in downloads {
            self.downloads += 1
            bytes += info.bytes
            if let size = info.totalBytes {
                totalBytes += size
            } else {
                downloadsWithUnknownTotal += 1
            }
            bytesPerSecond += info.bytesPerSecond ?? 0
            switch info.state {
            case .running: running += 1
            case .queued: queued += 1
            case .completed: completed += 1
            case .failed: failed += 1
            case .paused: paused += 1
            case .cancelled: cancelled += 1
            }
        }
    }
}

/// What a ``DownloadManager`` reports about its downloads.
public struct DownloadManagerEvent: Sendable {
    /// What happened.
    public enum Kind: Sendable {
        /// A download was enqueued.
        case added
        /// The download's state changed (see `download.state`).
        case stateChanged
        /// An event of the running transfer: progress, restarts, retries.
        case transfer(DownloadEvent)
        /// The download and its record were removed.
        case removed
    }

    /// What happened.
    public let kind: Kind
    /// The download as it stands after the event.
    public let download: DownloadInfo
    /// Whether another worker of a fleet made the change, and this manager only heard of it
    /// through the queue: what should happen once per change (a program run when a download
    /// completes) happens on the worker that made it.
    public let isFromAnotherWorker: Bool

    /// An event as a daemon's event stream describes it.
    package init(kind: Kind, download: DownloadInfo, isFromAnotherWorker: Bool = false) {
        self.kind = kind
        self.download = download
        self.isFromAnotherWorker = isFromAnotherWorker
    }
}

extension String {
    var nonEmpty: String? { isEmpty ? nil : self }
}
