/// Something the test server does wrong on purpose, for one request or for all of them.
public enum Fault: Sendable, Equatable {
    /// Send the response head and this many body bytes, then close the connection.
    case closeAfter(bytes: Int64)
    /// Send this many body bytes, then send nothing more for `seconds` (the connection stays open).
    case stall(afterBytes: Int64, seconds: Double)
    /// Send the body at this rate.
    case throttle(bytesPerSecond: Int)
    /// Answer a range request with `200` and the whole file.
    case ignoreRange
    /// Serve the requested range but claim in `Content-Range` that it starts `shift` bytes later.
    case wrongContentRange(shift: Int64)
    /// Announce the full length but leave out the last `missing` bytes, then close.
    case shortBody(missing: Int64)
    /// Answer with this status (and `Retry-After` when given) instead of the file.
    case status(Int, retryAfter: String? = nil)
    /// Answer every request that carries a `Range` header with this status (and `Retry-After` when
    /// given), like a host that allows one connection per client or serves ranges only later. With
    /// `sparingFromStart`, a range from byte 0 (`bytes=0-`) is served.
    case refuseRanges(status: Int, retryAfter: String?, sparingFromStart: Bool)
    /// Before answering, replace the resource with this version (new content and validators).
    case switchVersion(to: Int)
    /// Label the response with this `Content-Encoding`.
    case contentEncoding(String)
    /// Answer a single range with `multipart/byteranges`.
    case multipart
    /// Leave out this response header.
    case omitHeader(String)
    /// Set this response header, replacing any value the server would send (e.g. a bogus `Content-Length`).
    case setHeader(String, String)
    /// Add this many junk headers to the response.
    case headerFlood(Int)
    /// Send the body with the byte at this file offset changed (headers and digests stay as if it were not).
    case corruptByte(at: Int64)
}
