import Haul
import Hummingbird

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One download as the API shows it.
struct DownloadBody: Codable, Sendable, Equatable {
    var id: Int64
    var url: String
    var name: String
    var destination: String?
    var directory: String?
    var state: String
    var priority: Int
    var bytes: Int64
    var totalBytes: Int64?
    var fraction: Double?
    var bytesPerSecond: Double?
    var secondsRemaining: Double?
    var error: ErrorResponse.Detail?
    var createdAt: Date
    var finishedAt: Date?
    /// What the program run at the download's end did, e.g. `on-complete exited 0`.
    var hook: String?
    /// The connections the download asked for; absent: the daemon's default.
    var connections: Int?
    /// Connections open now, while running.
    var openConnections: Int?
    /// Other URLs of the same file; absent: none.
    var mirrors: [String]?

    init(_ info: DownloadInfo) {
        id = info.id.rawValue
        url = info.url
        name = info.name
        destination = info.destination
        directory = info.directory
        state = info.state.rawValue
        priority = info.priority.rawValue
        bytes = info.bytes
        totalBytes = info.totalBytes
        fraction = info.fraction
        bytesPerSecond = info.bytesPerSecond
        secondsRemaining = info.secondsRemaining
        error = info.error.map { .init(code: $0.code.name, message: $0.message) }
        createdAt = info.createdAt
        finishedAt = info.finishedAt
        hook = info.hook
        connections = info.connections
        openConnections = info.openConnections
        mirrors = info.mirrors.isEmpty ? nil : info.mirrors
    }
}

/// A download to add.
struct NewDownload: Codable, Sendable {
    /// The http or https URL.
    var url: String
    /// The file to write; relative paths are taken from the first download root.
    var destination: String?
    /// The directory to write into, the file named from the server's answer; relative paths are taken
    /// from the first download root. Neither given: the first download root.
    var directory: String?
    /// `ALGORITHM=HEX`, e.g. `sha256=9f86…`.
    var checksum: String?
    /// Higher starts first; `low`, `normal` and `high` are -10, 0 and 10.
    var priority: Int?
    /// This download's own limit, in bytes per second.
    var limitRate: Int64?
    /// Request headers; secret ones (credentials, names that look like them, and those marked
    /// `secret`) are held in memory only.
    var headers: [Header]?
    /// Replace an existing file at the destination once the download is complete.
    var overwrite: Bool?
    /// Connections to open at once when the server serves ranges; absent: the daemon's default.
    var connections: Int?
    /// Other http or https URLs of the same file.
    var mirrors: [String]?

    struct Header: Codable, Sendable {
        var name: String
        var value: String
        /// Hold this header as secret: never stored, sent to the URL's origin only.
        var secret: Bool?
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
    var headers: [NewDownload.Header]?
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
}

// Answers the routes return as they are, written by the request context's encoder.
extension DownloadBody: ResponseEncodable {}
extension AddedDownloads: ResponseEncodable {}
extension DownloadList: ResponseEncodable {}
extension OptionsBody: ResponseEncodable {}
extension StatsBody: ResponseEncodable {}
