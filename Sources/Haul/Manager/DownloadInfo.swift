#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The stable identity of a download in a ``DownloadManager``; it survives restarts of the process.
public struct DownloadID: Hashable, Sendable, Comparable, CustomStringConvertible, Codable {
    public let rawValue: Int64

    public init(_ rawValue: Int64) { self.rawValue = rawValue }

    public var description: String { String(rawValue) }

    public static func < (left: DownloadID, right: DownloadID) -> Bool { left.rawValue < right.rawValue }
}

/// Which waiting download starts first: higher priorities first, then in the order they were enqueued.
public struct DownloadPriority: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: Int

    public init(_ rawValue: Int) { self.rawValue = rawValue }

    public static let low = DownloadPriority(-10)
    public static let normal = DownloadPriority(0)
    public static let high = DownloadPriority(10)

    public var description: String {
        switch self {
        case .low: "low"
        case .normal: "normal"
        case .high: "high"
        default: String(rawValue)
        }
    }

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

    public var description: String { rawValue }

    /// Whether the download has ended (it starts again only when asked to).
    public var isFinished: Bool { self == .completed || self == .failed || self == .cancelled }
}

/// Everything known about one download, whether or not it is running and in whichever process.
public struct DownloadInfo: Sendable, Identifiable {
    public let id: DownloadID
    /// The URL the next attempt uses (the latest one given, for links that expire).
    public var url: String
    /// The path of the file, once known (a download into a directory learns its name from the server).
    public var destination: String?
    /// The directory the file goes to, when the request named a directory rather than a file.
    public var directory: String?
    public var state: DownloadState
    public var priority: DownloadPriority
    /// Bytes on disk that a resume keeps.
    public var bytes: Int64
    public var totalBytes: Int64?
    /// Bytes per second, while running.
    public var bytesPerSecond: Double?
    /// Estimated time left, while running and when the total is known.
    public var secondsRemaining: Double?
    /// Why the download failed, or why it paused by itself (a full disk).
    public var error: HaulError?
    public var createdAt: Date
    public var finishedAt: Date?

    /// Between 0 and 1, when the total is known.
    public var fraction: Double? {
        guard let totalBytes else { return state == .completed ? 1 : nil }
        guard totalBytes > 0 else { return 1 }
        return min(1, Double(bytes) / Double(totalBytes))
    }

    /// The file's name: the destination's last component, else the URL's last path segment.
    public var name: String {
        if let destination { return DownloadPaths(destination: destination).fileName }
        return URL(string: url)?.lastPathComponent.nonEmpty ?? url
    }
}

/// Progress summed over several downloads, weighted by bytes.
public struct AggregateProgress: Sendable, Equatable {
    public var bytes: Int64 = 0
    /// The sum of the known totals.
    public var totalBytes: Int64 = 0
    /// Downloads whose total is not known yet; while any are, `fraction` is only a lower bound.
    public var downloadsWithUnknownTotal: Int = 0
    public var bytesPerSecond: Double = 0
    public var running: Int = 0
    public var queued: Int = 0
    public var completed: Int = 0
    public var failed: Int = 0
    public var downloads: Int = 0

    /// Bytes done over bytes expected, counting only downloads whose total is known.
    public var fraction: Double? {
        guard totalBytes > 0 else { return nil }
        return min(1, Double(bytes) / Double(totalBytes))
    }
}

/// What a ``DownloadManager`` reports about its downloads.
public struct DownloadManagerEvent: Sendable {
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

    public let kind: Kind
    /// The download as it stands after the event.
    public let download: DownloadInfo
}

extension String {
    var nonEmpty: String? { isEmpty ? nil : self }
}
