/// What the next request asks for, decided from the manifest before anything is sent.
struct ResumePlan: Equatable, Sendable {
    /// Where new bytes are appended; 0 for a fresh download.
    let resumeOffset: Int64
    /// Bytes before `resumeOffset` that are fetched again and compared with the disk.
    let overlap: Int64
    /// The `If-Range` value sent, when the stored validator allows one.
    let ifRange: String?
    /// The manifest the plan resumes, `nil` for a fresh download.
    let stored: Manifest?

    static let fresh = ResumePlan(resumeOffset: 0, overlap: 0, ifRange: nil, stored: nil)

    var isResume: Bool { stored != nil && resumeOffset > 0 }
    /// The first byte of the requested range.
    var rangeStart: Int64 { resumeOffset - overlap }

    /// The request headers the plan needs.
    var headers: [(String, String)] {
        guard isResume else { return [] }
        var headers = [("Range", "bytes=\(rangeStart)-")]
        if let ifRange { headers.append(("If-Range", ifRange)) }
        return headers
    }

    /// Chooses how to resume `manifest` with `trusted` bytes on disk.
    ///
    /// Returns a restart reason instead when the partial data cannot be checked against the server.
    static func resuming(
        _ manifest: Manifest, trusted: Int64, trustUnvalidated: Bool, overlapCheckBytes: Int
    ) -> Result<ResumePlan, RestartReasonBox> {
        guard trusted > 0 else { return .success(.fresh) }
        if let coding = manifest.contentEncoding { return .failure(.init(.contentEncoded(coding))) }
        guard manifest.acceptsRanges else { return .failure(.init(.rangeIgnored)) }
        if let ifRange = manifest.validator.ifRangeValue {
            return .success(ResumePlan(resumeOffset: trusted, overlap: 0, ifRange: ifRange, stored: manifest))
        }
        // A weak ETag or a weak date cannot go in If-Range: the 206's validators are compared instead,
        // and a few bytes before the resume point are fetched again and compared with the disk.
        guard !manifest.validator.isEmpty || trustUnvalidated else { return .failure(.init(.unvalidated)) }
        let overlap = min(Int64(overlapCheckBytes), trusted)
        return .success(ResumePlan(resumeOffset: trusted, overlap: overlap, ifRange: nil, stored: manifest))
    }
}

/// A ``RestartReason`` that can travel as the failure of a `Result`.
struct RestartReasonBox: Error, Equatable {
    let reason: RestartReason
    init(_ reason: RestartReason) { self.reason = reason }
}
