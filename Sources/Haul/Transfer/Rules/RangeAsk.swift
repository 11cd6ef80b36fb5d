/// What one request asks the server for, and what its answer must match to be written.
///
/// Every request of a download is one of three kinds: the first request of a fresh download, the
/// continuation of a file written in order from its start (one range), or a range of a file fetched
/// over several connections. ``ResponseClassifier`` judges every answer against its ask.
struct RangeAsk: Equatable, Sendable {
    enum Kind: Equatable, Sendable {
        /// The whole file, for a download with nothing stored. With `probesRanges` it asks for
        /// `bytes=0-`, so that a `206` shows the rest could come over several connections.
        case fresh(probesRanges: Bool)
        /// Everything from `from` on, continuing a file stored in order from its start. A `200`
        /// answer replaces the stored bytes.
        case resume
        /// Bytes `from..<to` of a file fetched in ranges; the answer must be exactly those bytes.
        case range
    }

    /// The validator and length a stored download has, which every answer must agree with.
    struct Expected: Equatable, Sendable {
        var validator: ResourceValidator
        var totalLength: Int64?
    }

    let kind: Kind
    /// The first byte asked for.
    let from: Int64
    /// One past the last byte asked for; `nil` asks for everything from `from` on.
    let to: Int64?
    /// Where writing starts: body bytes before it (a re-fetched overlap) are compared with the disk.
    let writeStart: Int64
    /// The `If-Range` value sent, when the stored validator allows one.
    let ifRange: String?
    /// What a resumed or ranged answer must agree with (`nil` for a fresh download).
    let expected: Expected?

    /// The first request of a download with nothing stored.
    static func fresh(probesRanges: Bool) -> RangeAsk {
        RangeAsk(kind: .fresh(probesRanges: probesRanges), from: 0, to: nil, writeStart: 0, ifRange: nil, expected: nil)
    }

    /// Continues a file stored in order, as `plan` says (from its resume point, with or without
    /// `If-Range`, re-fetching an overlap when the validator is weak).
    static func resume(_ plan: ResumePlan, expected: Expected) -> RangeAsk {
        RangeAsk(
            kind: .resume, from: plan.rangeStart, to: nil, writeStart: plan.resumeOffset, ifRange: plan.ifRange,
            expected: expected)
    }

    /// Bytes `from..<to` (to the end of the file when `to` is `nil`) of a file fetched in ranges,
    /// checked with `If-Range` (a mirror's first request has no validator to send yet).
    static func range(from: Int64, to: Int64?, ifRange: String?, expected: Expected) -> RangeAsk {
        RangeAsk(kind: .range, from: from, to: to, writeStart: from, ifRange: ifRange, expected: expected)
    }

    /// Bytes `from..<to` of a file fetched in ranges, to compare with the disk: none is written.
    static func compare(from: Int64, to: Int64, ifRange: String?, expected: Expected) -> RangeAsk {
        RangeAsk(kind: .range, from: from, to: to, writeStart: to, ifRange: ifRange, expected: expected)
    }

    /// The bytes body must hold beyond those compared with the disk.
    var overlap: Int64 { writeStart - from }

    /// Whether the answer may go on past the end of the range its bytes are written to: it asked for
    /// everything to the end of the file.
    var isOpenEnded: Bool { to == nil || to == expected?.totalLength }

    /// The request headers the ask needs (`Range`, `If-Range`).
    var headers: [(String, String)] {
        switch kind {
        case .fresh(let probesRanges):
            return probesRanges ? [("Range", "bytes=0-")] : []
        case .resume, .range:
            var headers = [("Range", "bytes=\(from)-\(to.map { String($0 - 1) } ?? "")")]
            if let ifRange { headers.append(("If-Range", ifRange)) }
            return headers
        }
    }
}
