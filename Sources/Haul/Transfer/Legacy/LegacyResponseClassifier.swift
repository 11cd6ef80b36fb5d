import NIOHTTP1

/// What to do with the final (non-redirect) response to a request made under a ``ResumePlan``.
enum ResponseAction: Equatable, Sendable {
    /// Stream the body into the partial file.
    case stream(StreamPlan)
    /// The stored bytes are the complete file (`416` confirming the stored length and validator).
    case alreadyComplete
    /// Discard this response and the partial data; ask again from byte 0.
    case restart(RestartReason)
    /// Try again later, after `retryAfter` seconds when the server said so.
    case retry(status: Int, retryAfter: Int64?)
    case fail(HaulError.Code, String, status: Int)
}

/// How to store one response body.
struct StreamPlan: Equatable, Sendable {
    /// Offset in the file of the first body byte (below `writeStart` when an overlap is re-fetched).
    let bodyStart: Int64
    /// Offset of the first byte to write; body bytes before it are compared with the disk.
    let writeStart: Int64
    let totalLength: Int64?
    let validator: ResourceValidator
    let acceptsRanges: Bool
    let contentEncoding: String?
    /// Set when this response replaces the partial data (a `200` to a range request).
    let restartReason: RestartReason?
    /// Digests of this response's body (`Content-Digest`, `Content-MD5`).
    var contentDigests: [Checksum] = []
    /// Whether the server answered with `206`: ranges demonstrably work.
    var isPartialResponse = false

    /// True when the partial file must be emptied before writing.
    var startsOver: Bool { writeStart == 0 }
}

/// Decides, without any I/O, whether a response may extend the partial file.
///
/// A `206` is accepted only when its `Content-Range` starts where it was asked to, runs to the end,
/// has the stored total length, carries no content coding and no contradicting validator; a `200`
/// always means starting over; a `416` is success only when it confirms exactly what is stored.
enum LegacyResponseClassifier {
    static func classify(status: Int, headers: HTTPHeaders, plan: ResumePlan, now: Int64) -> ResponseAction {
        let validator = ResourceValidator(headers: headers)
        let coding = contentCoding(headers)
        let action = classifyStatus(
            status, headers: headers, plan: plan, validator: validator, coding: coding, now: now)
        guard case .stream(var stream) = action else { return action }
        stream.contentDigests = DigestFields.contentDigests(headers)
        stream.isPartialResponse = status == 206
        return .stream(stream)
    }

    private static func classifyStatus(
        _ status: Int, headers: HTTPHeaders, plan: ResumePlan, validator: ResourceValidator, coding: String?, now: Int64
    ) -> ResponseAction {
        switch status {
        case 200:
            let length = headers.first(name: "content-length").flatMap { Int64(decimalDigits: $0) }
            var reason: RestartReason?
            if plan.isResume, let stored = plan.stored {
                reason =
                    stored.validator.contradiction(with: validator).map(RestartReason.remoteChanged) ?? .rangeIgnored
            }
            let acceptsRanges = headers[canonicalForm: "accept-ranges"].contains { $0.lowercased() == "bytes" }
            return .stream(
                StreamPlan(
                    bodyStart: 0, writeStart: 0, totalLength: length, validator: validator,
                    acceptsRanges: acceptsRanges,
                    contentEncoding: coding, restartReason: reason
                )
            )
        case 206:
            return classifyPartial(headers: headers, plan: plan, validator: validator, coding: coding)
        case 416:
            guard plan.isResume, let stored = plan.stored else {
                return .fail(
                    .httpStatus, "the server answered 416 Range Not Satisfiable to a request without a range",
                    status: 416)
            }
            let range = headers.first(name: "content-range").flatMap(ContentRange.init)
            let detail = "416 with Content-Range \(headers.first(name: "content-range") ?? "missing")"
            guard let range, range.first == nil, let length = range.completeLength, length == stored.totalLength,
                plan.resumeOffset == length, stored.validator.contradiction(with: validator) == nil || validator.isEmpty
            else { return .restart(.rangeNotSatisfiable(detail)) }
            return .alreadyComplete
        case 408, 429, 500, 502, 503, 504, 507...599:
            let retryAfter = headers.first(name: "retry-after").flatMap { RetryAfter.delay($0, now: now) }
            return .retry(status: status, retryAfter: retryAfter)
        default:
            return .fail(
                .httpStatus, "the server answered \(status) \(HTTPResponseStatus(statusCode: status).reasonPhrase)",
                status: status)
        }
    }

    private static func classifyPartial(
        headers: HTTPHeaders, plan: ResumePlan, validator: ResourceValidator, coding: String?
    ) -> ResponseAction {
        if let contentType = headers.first(name: "content-type"),
            contentType.lowercased().hasPrefix("multipart/byteranges")
        {
            return .restart(.multipartResponse)
        }
        if let coding { return .restart(.contentEncoded(coding)) }
        let header = headers.first(name: "content-range") ?? "missing"
        guard let range = ContentRange(header), let first = range.first, let last = range.last else {
            return .restart(.invalidContentRange("Content-Range \(header)"))
        }
        let total = range.completeLength
        guard first == plan.rangeStart else {
            return .restart(.invalidContentRange("asked from byte \(plan.rangeStart), got Content-Range \(header)"))
        }
        let storedTotal = plan.stored?.totalLength
        if let storedTotal, total != storedTotal {
            return .restart(.remoteChanged("length \(storedTotal) became \(total.map(String.init) ?? "unknown")"))
        }
        if let total, last != total - 1 {
            return .restart(.invalidContentRange("asked for the rest of the file, got Content-Range \(header)"))
        }
        if let length = headers.first(name: "content-length").flatMap({ Int64(decimalDigits: $0) }),
            length != range.length
        {
            return .restart(.invalidContentRange("Content-Length \(length) does not match Content-Range \(header)"))
        }
        guard let stored = plan.stored, plan.isResume else {
            // A 206 to a request without a range is only usable if it covers the whole file.
            guard first == 0, let total else {
                return .restart(.invalidContentRange("unrequested partial answer \(header)"))
            }
            return .stream(
                StreamPlan(
                    bodyStart: 0, writeStart: 0, totalLength: total, validator: validator, acceptsRanges: true,
                    contentEncoding: nil, restartReason: nil
                )
            )
        }
        if let contradiction = stored.validator.contradiction(with: validator) {
            // With If-Range the server already compared; a 206 without the validator is tolerated there,
            // but a different one never is.
            let onlyMissing = plan.ifRange != nil && (validator.entityTag == nil && validator.lastModified == nil)
            if !onlyMissing { return .restart(.remoteChanged(contradiction)) }
        }
        var resumed = stored.validator
        if resumed.digests.isEmpty { resumed.digests = validator.digests }
        return .stream(
            StreamPlan(
                bodyStart: first, writeStart: plan.resumeOffset, totalLength: total ?? storedTotal,
                validator: resumed, acceptsRanges: true, contentEncoding: nil, restartReason: nil
            )
        )
    }

    /// The content coding of a response, `nil` for none or `identity`.
    static func contentCoding(_ headers: HTTPHeaders) -> String? {
        let codings = headers[canonicalForm: "content-encoding"].map { $0.lowercased() }.filter { $0 != "identity" }
        return codings.isEmpty ? nil : codings.joined(separator: ", ")
    }
}
