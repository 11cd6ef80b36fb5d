/// A list of requests too long to hold at once (a file of a million URLs), read a chunk at a time
/// and as often as a queue needs: ``DownloadQueue/enqueue(_:priority:)-(DownloadRequestList,_)``
/// reads it twice, first to check every request, then to add them, so that nothing is added
/// when one of them is refused (once, when it gives all its requests in one chunk).
///
/// ```swift
/// let list = DownloadRequestList { chunk in
///     for lines in try readLines(of: path, by: 2_000) {   // read again on each call
///         try chunk(lines.map { DownloadRequest(url: $0, destination: .directory("/data")) })
///     }
/// }
/// let ids = try await manager.enqueue(list)
/// ```
public struct DownloadRequestList: Sendable {
    private let reading: @Sendable (_ chunk: ([DownloadRequest]) throws -> Void) throws -> Void

    /// A list that `read` gives: each call of it passes every request, in order and the same each
    /// time, to its argument in chunks (of a few thousand, so that a chunk is added in one
    /// transaction), and throws what reading throws (a line that is not a request), which stops
    /// the queue's add before anything is added.
    public init(_ read: @escaping @Sendable (_ chunk: ([DownloadRequest]) throws -> Void) throws -> Void) {
        self.reading = read
    }

    /// The requests of `requests`, in chunks.
    public init(_ requests: [DownloadRequest]) {
        self.init { chunk in
            for slice in DownloadManager.chunks(of: requests) { try chunk(Array(slice)) }
        }
    }

    /// Reads the list once, passing each chunk to `chunk`.
    public func read(_ chunk: ([DownloadRequest]) throws -> Void) throws {
        try reading(chunk)
    }

    /// Every request, in one array.
    public func all() throws -> [DownloadRequest] {
        var requests: [DownloadRequest] = []
        try read { requests += $0 }
        return requests
    }
}
