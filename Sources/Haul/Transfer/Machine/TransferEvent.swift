import NIOHTTP1

/// What opening a download's destination found there.
enum FoundDownload: Sendable {
    /// Nothing stored: the download starts from byte 0.
    case nothing
    /// The destination is a directory: the file is named by the first answer.
    case unnamed
    /// A partial download with its manifest, and the partial file's size.
    case stored(Manifest, partialSize: Int64)
    /// A complete file already renamed into place by a session that died before removing its manifest.
    case complete(totalBytes: Int64)
    /// Partial data that cannot be used (a corrupt manifest, data without one…).
    case untrusted(RestartReason)
}

/// One request of one connection: events of a request that is no longer the connection's current one
/// (an answer dropped, a request abandoned) are told apart by the serial number.
struct RequestTag: Hashable, Sendable, CustomStringConvertible {
    /// The connection (0 for the first).
    let connection: Int
    /// Counts the requests of a download.
    let serial: Int
    /// The URL it goes to: 0 for the request's own, then its mirrors in order.
    var source = 0

    var description: String { "connection \(connection) request \(serial)" }
}

/// The final (non-redirect) answer a connection received.
struct ResponseHead: Sendable {
    let status: Int
    let headers: HTTPHeaders
    /// The URL the answer came from, after redirects.
    let finalURL: String
    /// Seconds since the epoch when the answer arrived (a `Retry-After` may be a date).
    let date: Int64
}

/// How a connection's request ended.
enum ConnectionEnd: Sendable {
    /// The body ended, or the connection stopped at the end of its range, at this offset.
    case finished(at: Int64)
    /// The request or the body failed; everything received was written and reported before.
    case failed(TransferFailure)
    /// The answer was dropped, or the connection stopped when asked to before writing anything.
    case dropped
}

/// Why a connection's request failed.
enum TransferFailure: Sendable {
    /// Worth another attempt from the last stored byte (a reset, a timeout, a 5xx…).
    case retryable(HaulError, retryAfter: Duration?)
    /// The host refused the connection: retried like ``retryable(_:retryAfter:)``, unless nothing has
    /// come from any server yet and refusals are not to be retried.
    case refused(HaulError)
    /// No attempt can mend it (TLS, a refused redirect, a disk error…).
    case fatal(HaulError)
    /// The bytes before the resume point, fetched again, differ from the disk.
    case overlapMismatch
    /// The body does not match its `Content-Digest`; the bytes it wrote from `from` are not kept.
    case bodyDigestMismatch(String, from: Int64)
    /// The connection was stopped (the download is pausing, restarting or failing).
    case cancelled
}

/// What the stored bytes turned out to hold, once checked.
struct StoredData: Sendable {
    /// The ranges with the bytes that can be kept (written past what is trusted is already cut).
    let segments: [Manifest.Segment]
    /// The piece hashes, without those of damaged pieces.
    let pieces: [String?]
}

/// The result of checking a complete file against the expected checksums.
enum Verification: Sendable {
    case matches
    /// The caller's checksum does not match: final, the data is kept.
    case checksumMismatch(HaulError)
    /// The server's digest does not match: the bytes are wrong, the download starts over.
    case digestMismatch(String)
}

/// What happens to a transfer, as its I/O shell reports it to the ``TransferMachine``.
enum TransferEvent: Sendable {
    /// The destination was opened (or is to be named by the first answer).
    case start(FoundDownload)
    /// The stored bytes of a resumed download were checked.
    case storedDataChecked(StoredData)
    /// The destination named by the first answer was opened.
    case destinationChosen(FoundDownload)
    /// A request waits for a connection to its host (the cap on connections per host) before it is sent.
    case queued(RequestTag)
    /// A request that waited for a connection got one and is sent.
    case admitted(RequestTag)
    /// A request received the head of its answer.
    case head(RequestTag, ResponseHead)
    /// A request wrote its range's bytes up to `upTo`, completing the pieces in `pieces`.
    case wrote(RequestTag, segment: Int, upTo: Int64, pieces: [Int: String])
    /// A rate limit holds a request's bytes back until `until`: its silence until then is no stall.
    case throttled(RequestTag, until: Moment)
    /// The transport hears from the server while the request's bytes are out of Haul's sight (a
    /// download task's body going to a file): its silence until now is no stall.
    case active(RequestTag)
    /// A request reached the end of its range while its answer goes on.
    case reachedLimit(RequestTag, at: Int64)
    /// A request is over.
    case ended(RequestTag, ConnectionEnd)
    /// The time asked for by ``TransferMachine/nextDeadline`` has come.
    case timer
    /// The caller cancelled the download: it pauses, keeping its data.
    case cancel
    /// A checkpoint was stored; `pieces` are hashes read back from the file for it.
    case checkpointed(pieces: [Int: String])
    /// The partial data and its manifest are gone.
    case discarded
    /// The complete file was checked.
    case verified(Verification)
    /// The complete file has its final name.
    case finished
    /// Something the shell did for the transfer failed.
    case failed(HaulError)
}
