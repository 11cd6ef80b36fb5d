/// What happens during a download, in order: `started`, then `progress` (and possibly `restarted`
/// or `retrying`, each followed by a new `started`), then `completed` or `failed`.
public enum DownloadEvent: Sendable {
    /// The server answered: what it told, and where the transfer starts.
    case started(DownloadStart)
    /// Bytes stored so far, at most once per progress interval.
    case progress(DownloadProgress)
    /// The partial data was discarded and the download starts again from byte 0.
    case restarted(RestartReason)
    /// An attempt failed; the next one starts after `delay`, from the last stored byte.
    case retrying(attempt: Int, delay: Duration, error: HaulError)
    /// How a download with mirrors uses them, or a mirror it stopped using.
    case mirror(MirrorReport)
    /// The file is complete (and verified, when a checksum or digest was known) under its final name.
    case completed(DownloadResult)
    /// The download stopped: the error says why; the partial data is kept unless it cannot be trusted.
    case failed(HaulError)
}

/// The facts known once the server has answered.
public struct DownloadStart: Sendable, Equatable, Codable {
    /// The path of the file being written.
    public let destination: String
    /// The URL the bytes come from, after redirects.
    public let url: String
    /// The complete length, if the server announced it.
    public let totalBytes: Int64?
    /// Bytes already on disk from earlier attempts, not fetched again.
    public let resumedFrom: Int64
    /// Whether an interruption can be resumed (byte ranges and a validator).
    public let resumable: Bool
    /// What identifies the version of the file being downloaded.
    public let validator: ResourceValidator
}

/// A progress report; `bytes` never decreases between two `started` events and never exceeds `totalBytes`.
public struct DownloadProgress: Sendable, Equatable {
    /// Bytes stored so far.
    public let bytes: Int64
    /// The file's length, when known.
    public let totalBytes: Int64?
    /// Average over the last few seconds, in bytes per second.
    public let bytesPerSecond: Double
    /// Estimated time left, when the total and a speed are known.
    public let secondsRemaining: Double?
    /// Connections with a request out or an answer arriving when the report was made.
    public let connections: Int

    /// A report as a daemon's event describes it.
    package init(bytes: Int64, totalBytes: Int64?, bytesPerSecond: Double, secondsRemaining: Double?, connections: Int)
    {
        self.bytes = bytes
        self.totalBytes = totalBytes
        self.bytesPerSecond = bytesPerSecond
        self.secondsRemaining = secondsRemaining
        self.connections = connections
    }

    /// Between 0 and 1, when the total is known.
    public var fraction: Double? {
        guard let totalBytes, totalBytes > 0 else { return totalBytes == 0 ? 1 : nil }
        return min(1, Double(bytes) / Double(totalBytes))
    }
}

/// What a download with mirrors (``DownloadRequest/mirrors``) does with them.
public enum MirrorReport: Sendable, Equatable, Codable, CustomStringConvertible {
    /// The mirrors serve ranges of the file side by side: `proof` says what shows they hold the same bytes.
    case mixed(proof: String)
    /// Nothing shows the mirrors hold the same bytes: they are used one after another, never mixed.
    case inTurn(reason: String)
    /// The download stopped using the URL, for the reason given; the others fetch its ranges.
    case dropped(url: String, reason: String)

    /// A one-line explanation for people.
    public var description: String {
        switch self {
        case .mixed(let proof): "ranges come from every mirror: \(proof)"
        case .inTurn(let reason): "mirrors are used one after another, never mixed: \(reason)"
        case .dropped(let url, let reason): "mirror \(url) dropped: \(reason)"
        }
    }
}

/// Why Haul threw away partial data and started again.
public enum RestartReason: Sendable, Equatable, CustomStringConvertible {
    /// The validator changed: the server holds a different file now.
    case remoteChanged(String)
    /// The server answered a range request with the whole file.
    case rangeIgnored
    /// The `Content-Range` of the answer did not match the request.
    case invalidContentRange(String)
    /// The server applied a content coding, so byte positions do not match the file.
    case contentEncoded(String)
    /// The server answered a range with `multipart/byteranges`.
    case multipartResponse
    /// `416` with a length that does not match the stored one.
    case rangeNotSatisfiable(String)
    /// The server gave no validator, so the partial data could not be checked.
    case unvalidated
    /// The manifest was missing, unreadable or did not match the partial file.
    case untrustedPartial(String)
    /// The complete file does not match the digest the server announced for it.
    case digestMismatch(String)
    /// The URL in use failed, and nothing shows the next mirror holds the same bytes: the file
    /// comes from that mirror from byte 0.
    case mirrorFallback(String)

    /// The case's name and its detail, as a daemon's event carries them.
    package var parts: (name: String, detail: String?) {
        switch self {
        case .remoteChanged(let detail): ("remoteChanged", detail)
        case .rangeIgnored: ("rangeIgnored", nil)
        case .invalidContentRange(let detail): ("invalidContentRange", detail)
        case .contentEncoded(let coding): ("contentEncoded", coding)
        case .multipartResponse: ("multipartResponse", nil)
        case .rangeNotSatisfiable(let detail): ("rangeNotSatisfiable", detail)
        case .unvalidated: ("unvalidated", nil)
        case .untrustedPartial(let detail): ("untrustedPartial", detail)
        case .digestMismatch(let detail): ("digestMismatch", detail)
        case .mirrorFallback(let detail): ("mirrorFallback", detail)
        }
    }

    /// The reason with this name and detail (see ``parts``); `nil` for a name Haul does not know.
    package init?(name: String, detail: String?) {
        let detail = detail ?? ""
        switch name {
        case "remoteChanged": self = .remoteChanged(detail)
        case "rangeIgnored": self = .rangeIgnored
        case "invalidContentRange": self = .invalidContentRange(detail)
        case "contentEncoded": self = .contentEncoded(detail)
        case "multipartResponse": self = .multipartResponse
        case "rangeNotSatisfiable": self = .rangeNotSatisfiable(detail)
        case "unvalidated": self = .unvalidated
        case "untrustedPartial": self = .untrustedPartial(detail)
        case "digestMismatch": self = .digestMismatch(detail)
        case "mirrorFallback": self = .mirrorFallback(detail)
        default: return nil
        }
    }

    /// A one-line explanation for people.
    public var description: String {
        switch self {
        case .remoteChanged(let detail): "the remote file changed (\(detail))"
        case .rangeIgnored: "the server sent the whole file instead of the requested range"
        case .invalidContentRange(let detail): "the server sent the wrong range (\(detail))"
        case .contentEncoded(let coding):
            "the server applied Content-Encoding \(coding), so the range cannot be trusted"
        case .multipartResponse: "the server answered a single range with multipart/byteranges"
        case .rangeNotSatisfiable(let detail): "the server refused the range (\(detail))"
        case .unvalidated:
            "the server sends no ETag or Last-Modified, so the partial file cannot be checked"
        case .untrustedPartial(let detail): "the partial file cannot be trusted (\(detail))"
        case .digestMismatch(let detail): "the file does not match the server's digest (\(detail))"
        case .mirrorFallback(let detail): "fetching the file from the next mirror from byte 0 (\(detail))"
        }
    }
}

/// A finished download.
public struct DownloadResult: Sendable, Equatable, Codable {
    /// The path of the complete file.
    public let destination: String
    /// The URL the caller asked for.
    public let url: String
    /// The size of the file.
    public let bytes: Int64
    /// Bytes that came over the network during this call (including any re-fetched overlap).
    public let bytesFetched: Int64
    /// Bytes kept from earlier sessions.
    public let resumedFrom: Int64
    /// How often the download started over from byte 0 in this call.
    public let restarts: Int
    /// What identifies the version of the file being downloaded.
    public let validator: ResourceValidator

    /// A finished download as far as its record tells it.
    package init(
        destination: String, url: String, bytes: Int64, bytesFetched: Int64, resumedFrom: Int64, restarts: Int,
        validator: ResourceValidator
    ) {
        self.destination = destination
        self.url = url
        self.bytes = bytes
        self.bytesFetched = bytesFetched
        self.resumedFrom = resumedFrom
        self.restarts = restarts
        self.validator = validator
    }
}
