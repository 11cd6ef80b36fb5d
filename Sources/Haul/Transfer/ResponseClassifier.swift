import NIOHTTP1

/// What to do with the final (non-redirect) answer to a ``RangeAsk``.
enum ResponseVerdict: Equatable, Sendable {
    /// Write the body, as the facts say.
    case accept(ResponseFacts)
    /// The stored bytes are the complete file (a `416` confirming the stored length and validator).
    case alreadyComplete
    /// The answer shows the stored bytes cannot be continued: discard them and start from byte 0.
    case restart(RestartReason)
    /// Try again later, after `retryAfter` seconds when the server said so.
    case retry(status: Int, retryAfter: Int64?)
    /// A failure no retry can mend.
    case fail(HaulError.Code, String, status: Int)
    /// A `416` to the `bytes=0-` of a fresh download: the file is empty, or the server refuses
    /// ranges. Ask again without a range.
    case probeRefused
}

/// What an accepted answer tells about its body and the file.
struct ResponseFacts: Equatable, Sendable {
    /// The offset in the file of the first body byte.
    let bodyStart: Int64
    /// The offset of the first byte to write; body bytes before it are compared with the disk.
    let writeStart: Int64
    let totalLength: Int64?
    let validator: ResourceValidator
    /// Whether the server showed it serves ranges (`Accept-Ranges: bytes`, or a `206`).
    let acceptsRanges: Bool
    let contentEncoding: String?
    /// Set when this answer replaces the stored bytes (a `200` to a resume), and why.
    let replaces: RestartReason?
    /// Digests of this answer's body (`Content-Digest`, `Content-MD5`).
    var contentDigests: [Checksum] = []
    /// Whether the server answered `206`: ranges demonstrably work.
    var isPartialResponse = false

    /// Whether the body is the file from byte 0, with nothing kept from before.
    var startsOver: Bool { writeStart == 0 }

    /// Whether a download that stops after this answer can resume: the server serves ranges of an
    /// uncoded body, and a validator (or the caller's trust) tells the version apart.
    func resumable(trustingUnvalidated: Bool) -> Bool {
        acceptsRanges && contentEncoding == nil && (!validator.isEmpty || trustingUnvalidated)
    }
}

/// Judges every answer of every connection, without any I/O: only an answer that is exactly what
/// was asked, of the same version of the file, is ever written.
///
/// A `206` is accepted only when its `Content-Range` is the range asked for (from the asked byte to
/// the asked end, or to the end of the file), has the stored total length, carries no content
/// coding and no contradicting validator, and is not multipart. A `200` starts the download over
/// (its body is the new file when it answers the first request). A `416` is success only when it
/// confirms exactly what is stored.
enum ResponseClassifier {
    static func classify(status: Int, headers: HTTPHeaders, ask: RangeAsk, now: Int64) -> ResponseVerdict {
        if let length = headers.first(name: "content-length"),
            Int64(decimalDigits: length.trimmingHTTPWhitespace()) == nil
        {
            return .fail(
                .protocolViolation, "the server sent \"Content-Length: \(length)\", which is no length", status: status)
        }
        let validator = ResourceValidator(headers: headers)
        let verdict = verdict(status, headers: headers, ask: ask, validator: validator, now: now)
        guard case .accept(var facts) = verdict else { return verdict }
        facts.contentDigests = DigestFields.contentDigests(headers)
        facts.isPartialResponse = status == 206
        return .accept(facts)
    }

    /// The refusal of a length no disk holds (see ``Manifest/largestLength``): a lie, said so at once
    /// rather than taken for a broken range or a stall later.
    private static func impossibleLength(_ length: Int64, status: Int) -> ResponseVerdict? {
        guard length > Manifest.largestLength else { return nil }
        return .fail(
            .protocolViolation,
            "the server announced a file of \(length) bytes (\(ByteCount.format(length))), more than any disk holds",
            status: status)
    }

    /// The statuses worth another attempt later.
    static func isRetryable(_ status: Int) -> Bool {
        [408, 429, 500, 502, 503, 504].contains(status) || (507...599).contains(status)
    }

    private static func verdict(
        _ status: Int, headers: HTTPHeaders, ask: RangeAsk, validator: ResourceValidator, now: Int64
    ) -> ResponseVerdict {
        switch status {
        case 200:
            return whole(headers: headers, ask: ask, validator: validator)
        case 206:
            return partial(headers: headers, ask: ask, validator: validator)
        case 416:
            return notSatisfiable(headers: headers, ask: ask, validator: validator)
        case _ where isRetryable(status):
            let retryAfter = headers.first(name: "retry-after").flatMap { RetryAfter.delay($0, now: now) }
            return .retry(status: status, retryAfter: retryAfter)
        default:
            return .fail(
                .httpStatus, "the server answered \(status) \(HTTPResponseStatus(statusCode: status).reasonPhrase)",
                status: status)
        }
    }

    private static func whole(headers: HTTPHeaders, ask: RangeAsk, validator: ResourceValidator) -> ResponseVerdict {
        // If-Range failed, or the server ignores ranges: this is the whole file, from byte 0.
        let reason = ask.expected.map { expected in
            expected.validator.contradiction(with: validator).map(RestartReason.remoteChanged) ?? .rangeIgnored
        }
        if ask.kind == .range, let reason { return .restart(reason) }
        if let length = headers.first(name: "content-length").flatMap({ Int64(decimalDigits: $0) }),
            let impossible = impossibleLength(length, status: 200)
        {
            return impossible
        }
        return .accept(
            ResponseFacts(
                bodyStart: 0, writeStart: 0,
                totalLength: headers.first(name: "content-length").flatMap { Int64(decimalDigits: $0) },
                validator: validator,
                acceptsRanges: headers[canonicalForm: "accept-ranges"].contains { $0.lowercased() == "bytes" },
                contentEncoding: contentCoding(headers), replaces: reason))
    }

    private static func partial(headers: HTTPHeaders, ask: RangeAsk, validator: ResourceValidator) -> ResponseVerdict {
        if let contentType = headers.first(name: "content-type"),
            contentType.lowercased().hasPrefix("multipart/byteranges")
        {
            return .restart(.multipartResponse)
        }
        if let coding = contentCoding(headers) { return .restart(.contentEncoded(coding)) }
        let header = headers.first(name: "content-range") ?? "missing"
        let asked = "asked for bytes \(ask.from)-\(ask.to.map { String($0 - 1) } ?? "")"
        guard let range = ContentRange(header), let first = range.first, let last = range.last else {
            return .restart(.invalidContentRange("\(asked), got Content-Range \(header)"))
        }
        guard first == ask.from else { return .restart(.invalidContentRange("\(asked), got Content-Range \(header)")) }
        let total = range.completeLength
        if let total, let impossible = impossibleLength(total, status: 206) { return impossible }
        if let storedTotal = ask.expected?.totalLength, total != storedTotal {
            return .restart(.remoteChanged("length \(storedTotal) became \(total.map(String.init) ?? "unknown")"))
        }
        let end = ask.to ?? total
        if let end, last != end - 1 { return .restart(.invalidContentRange("\(asked), got Content-Range \(header)")) }
        if let length = headers.first(name: "content-length").flatMap({ Int64(decimalDigits: $0) }),
            length != range.length
        {
            return .restart(.invalidContentRange("Content-Length \(length) does not match Content-Range \(header)"))
        }
        guard let expected = ask.expected else {
            // The first request of a fresh download: only the whole file, with its length, will do.
            guard let total else { return .restart(.invalidContentRange("unrequested partial answer \(header)")) }
            return .accept(
                ResponseFacts(
                    bodyStart: 0, writeStart: 0, totalLength: total, validator: validator, acceptsRanges: true,
                    contentEncoding: nil, replaces: nil))
        }
        if let contradiction = expected.validator.contradiction(with: validator) {
            // With If-Range the server already compared; an answer without any validator is tolerated
            // there, but a different one never is.
            let onlyMissing = ask.ifRange != nil && validator.entityTag == nil && validator.lastModified == nil
            if !onlyMissing { return .restart(.remoteChanged(contradiction)) }
        }
        var kept = expected.validator
        if kept.digests.isEmpty { kept.digests = validator.digests }
        return .accept(
            ResponseFacts(
                bodyStart: first, writeStart: ask.writeStart, totalLength: total ?? expected.totalLength,
                validator: kept, acceptsRanges: true, contentEncoding: nil, replaces: nil))
    }

    private static func notSatisfiable(headers: HTTPHeaders, ask: RangeAsk, validator: ResourceValidator)
        -> ResponseVerdict
    {
        let header = headers.first(name: "content-range")
        switch ask.kind {
        case .fresh(let probesRanges):
            if probesRanges { return .probeRefused }
            return .fail(
                .httpStatus, "the server answered 416 Range Not Satisfiable to a request without a range", status: 416)
        case .resume:
            let range = header.flatMap(ContentRange.init)
            guard let expected = ask.expected, let range, range.first == nil, let length = range.completeLength,
                length == expected.totalLength, ask.writeStart == length,
                expected.validator.contradiction(with: validator) == nil || validator.isEmpty
            else { return .restart(.rangeNotSatisfiable("416 with Content-Range \(header ?? "missing")")) }
            return .alreadyComplete
        case .range:
            let total = ask.expected?.totalLength.map(String.init) ?? "*"
            let end = ask.to.map { String($0 - 1) } ?? ""
            return .restart(.rangeNotSatisfiable("416 to bytes \(ask.from)-\(end) of \(total)"))
        }
    }

    /// The content coding of a response, `nil` for none or `identity`.
    static func contentCoding(_ headers: HTTPHeaders) -> String? {
        let codings = headers[canonicalForm: "content-encoding"].map { $0.lowercased() }.filter { $0 != "identity" }
        return codings.isEmpty ? nil : codings.joined(separator: ", ")
    }
}
