import Haul
import Hummingbird

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One download as the API shows it: the request as ``DownloadRequest`` writes it (without its
/// secrets), and beside it what the daemon knows of the download.
struct DownloadBody: Codable, Sendable {
    var info: DownloadInfo

    init(_ info: DownloadInfo) { self.info = info }

    private enum CodingKeys: String, CodingKey {
        case id, name, destination, state, priority, bytes, totalBytes, fraction, bytesPerSecond, secondsRemaining
        case error, createdAt, finishedAt, hook, openConnections, worker
    }

    func encode(to encoder: any Encoder) throws {
        try info.request.encode(to: encoder)
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(info.id.rawValue, forKey: .id)
        try container.encode(info.name, forKey: .name)
        // A file named by the request is there already; a directory's file once the server named it.
        if info.directory != nil { try container.encodeIfPresent(info.destination, forKey: .destination) }
        try container.encode(info.state.rawValue, forKey: .state)
        try container.encode(info.priority.rawValue, forKey: .priority)
        try container.encode(info.bytes, forKey: .bytes)
        try container.encodeIfPresent(info.totalBytes, forKey: .totalBytes)
        try container.encodeIfPresent(info.fraction, forKey: .fraction)
        try container.encodeIfPresent(info.bytesPerSecond, forKey: .bytesPerSecond)
        try container.encodeIfPresent(info.secondsRemaining, forKey: .secondsRemaining)
        try container.encodeIfPresent(
            info.error.map { ErrorResponse.Detail(code: $0.code.name, message: $0.message) }, forKey: .error)
        try container.encode(info.createdAt, forKey: .createdAt)
        try container.encodeIfPresent(info.finishedAt, forKey: .finishedAt)
        try container.encodeIfPresent(info.hook, forKey: .hook)
        try container.encodeIfPresent(info.openConnections, forKey: .openConnections)
        try container.encodeIfPresent(info.worker, forKey: .worker)
    }

    init(from decoder: any Decoder) throws {
        let request = try DownloadRequest(from: decoder)
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let error = try container.decodeIfPresent(ErrorResponse.Detail.self, forKey: .error)
        let state = try container.decode(String.self, forKey: .state)
        var destination = try container.decodeIfPresent(String.self, forKey: .destination)
        if case .file(let path) = request.destination { destination = path }
        info = DownloadInfo(
            id: DownloadID(try container.decode(Int64.self, forKey: .id)), request: request, destination: destination,
            state: DownloadState(rawValue: state) ?? .failed,
            priority: DownloadPriority(try container.decode(Int.self, forKey: .priority)),
            bytes: try container.decode(Int64.self, forKey: .bytes),
            totalBytes: try container.decodeIfPresent(Int64.self, forKey: .totalBytes),
            bytesPerSecond: try container.decodeIfPresent(Double.self, forKey: .bytesPerSecond),
            secondsRemaining: try container.decodeIfPresent(Double.self, forKey: .secondsRemaining),
            error: error.map { HaulError(HaulError.Code($0.code), $0.message) },
            createdAt: try container.decode(Date.self, forKey: .createdAt),
            finishedAt: try container.decodeIfPresent(Date.self, forKey: .finishedAt),
            hook: try container.decodeIfPresent(String.self, forKey: .hook),
            openConnections: try container.decodeIfPresent(Int.self, forKey: .openConnections),
            worker: try container.decodeIfPresent(String.self, forKey: .worker))
    }
}

/// A download to add: the request as ``DownloadRequest`` reads it, and its place in the queue.
struct NewDownload: Codable, Sendable {
    var request: DownloadRequest
    /// Higher starts first; `low`, `normal` and `high` are -10, 0 and 10.
    var priority: Int?

    init(_ request: DownloadRequest, priority: Int?) {
        self.request = request
        self.priority = priority
    }

    private enum CodingKeys: String, CodingKey { case priority }

    init(from decoder: any Decoder) throws {
        request = try DownloadRequest(from: decoder)
        priority = try decoder.container(keyedBy: CodingKeys.self).decodeIfPresent(Int.self, forKey: .priority)
    }

    func encode(to encoder: any Encoder) throws {
        try request.encode(to: encoder)
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encodeIfPresent(priority, forKey: .priority)
    }
}

/// The body of `POST /api/v1/downloads`.
struct AddDownloads: Codable, Sendable {
    var downloads: [NewDownload]
}

/// The answer to `POST /api/v1/downloads`: the downloads as they stand once added.
struct AddedDownloads: Codable, Sendable {
    var downloads: [DownloadBody]
}

/// A list of downloads and where the page of it lies in the whole.
struct DownloadList: Codable, Sendable {
    var downloads: [DownloadBody]
    /// Downloads matching the filter, over every page.
    var total: Int
    var offset: Int
    var limit: Int
    /// The ID of the last event before this list was read: `GET /events` with it as
    /// `Last-Event-ID` replays every change since.
    var lastEventId: String
}

/// The body of `POST /api/v1/downloads/{id}/resume`.
struct ResumeBody: Codable, Sendable {
    /// A new URL for the same file (a link that expired).
    var url: String?
    /// Request headers for this and later attempts, in place of the stored ones (credentials are
    /// never stored, so a resume that needs them gives them again).
    var headers: [DownloadRequest.Header]?
    /// Basic credentials for this and later attempts, beside the headers (held in memory only).
    var credentials: Credentials?

    struct Credentials: Codable, Sendable {
        var user: String
        var password: String
    }
}

/// The queue's options a client may read and change.
struct OptionsBody: Codable, Sendable, Equatable {
    /// At most this many downloads transfer at once.
    var maxConcurrentDownloads: Int
    /// The most bytes per second all downloads together may receive; `null`: no limit.
    var totalLimitRate: Int64?

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(maxConcurrentDownloads, forKey: .maxConcurrentDownloads)
        // Written as null when there is no limit: the field is always there.
        try container.encode(totalLimitRate, forKey: .totalLimitRate)
    }
}

/// A change of the options: a field left out stays as it is; `totalLimitRate: null` removes the limit.
struct OptionsChange: Decodable, Sendable {
    var maxConcurrentDownloads: Int?
    /// `nil`: unchanged; `.some(nil)`: no limit.
    var totalLimitRate: Int64??

    enum CodingKeys: String, CodingKey {
        case maxConcurrentDownloads, totalLimitRate
    }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        if container.contains(.maxConcurrentDownloads) {
            // Present means a number: there is no "no limit" for downloads at once.
            maxConcurrentDownloads = try container.decode(Int.self, forKey: .maxConcurrentDownloads)
        }
        if container.contains(.totalLimitRate) {
            totalLimitRate = .some(
                try container.decodeNil(forKey: .totalLimitRate)
                    ? nil : try container.decode(Int64.self, forKey: .totalLimitRate))
        }
    }
}

/// The queue as a whole.
struct StatsBody: Codable, Sendable, Equatable {
    var bytesPerSecond: Double
    var bytes: Int64
    var totalBytes: Int64
    /// Downloads by state, every state present (0 when none).
    var counts: [String: Int]
    /// This daemon's name as a worker of a fleet (``DownloadInfo/worker``); absent when it runs a
    /// queue of its own.
    var worker: String?
}

// Answers the routes return as they are, written by the request context's encoder.
extension DownloadBody: ResponseEncodable {}
extension AddedDownloads: ResponseEncodable {}
extension DownloadList: ResponseEncodable {}
extension OptionsBody: ResponseEncodable {}
extension StatsBody: ResponseEncodable {}
extension RulesBody: ResponseEncodable {}

/// The daemon's schedules and rules, and where they stand now (`GET /api/v1/rules`).
struct RulesBody: Codable, Sendable, Equatable {
    /// Where the rules stand now.
    struct Now: Codable, Sendable, Equatable {
        /// The total limit a speed window sets now; `null` when none holds.
        var limitRate: Int64?
        /// Whether downloads start now (always, without start windows).
        var startsDownloads: Bool

        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            // Written as null when no window holds: the field is always there.
            try container.encode(limitRate, forKey: .limitRate)
            try container.encode(startsDownloads, forKey: .startsDownloads)
        }
    }

    var rules: QueueRules
    var now: Now
}
