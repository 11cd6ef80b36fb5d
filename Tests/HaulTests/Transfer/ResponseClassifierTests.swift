import NIOHTTP1
import Testing

@testable import Haul

/// The one classifier that judges the answers of every connection.
struct ResponseClassifierTests {
    static let expected = RangeAsk.Expected(
        validator: ResourceValidator(etag: "\"v1\"", lastModified: nil, date: nil), totalLength: 1000)
    /// The rest of a file stored in order, from byte 400.
    static let resume = RangeAsk.resume(
        ResumePlan(resumeOffset: 400, overlap: 0, ifRange: "\"v1\"", stored: nil), expected: expected)
    /// Bytes 400..<700 of a file fetched in ranges.
    static let range = RangeAsk.range(from: 400, to: 700, ifRange: "\"v1\"", expected: expected)
    static let probe = RangeAsk.fresh(probesRanges: true)

    func classify(_ status: Int, _ pairs: [(String, String)], _ ask: RangeAsk) -> ResponseVerdict {
        ResponseClassifier.classify(status: status, headers: HTTPHeaders(pairs), ask: ask, now: 0)
    }

    func accepted(_ verdict: ResponseVerdict) -> ResponseFacts? {
        if case .accept(let facts) = verdict { facts } else { nil }
    }

    @Test func aResumeAcceptsTheExactRestOfTheFile() throws {
        let verdict = classify(
            206, [("Content-Range", "bytes 400-999/1000"), ("ETag", "\"v1\""), ("Content-Length", "600")], Self.resume)
        let facts = try #require(accepted(verdict), "\(verdict)")
        #expect(facts.writeStart == 400 && facts.bodyStart == 400 && facts.totalLength == 1000)
        #expect(facts.isPartialResponse && facts.replaces == nil)
    }

    @Test func aRangeAcceptsExactlyItsBytes() throws {
        let verdict = classify(
            206, [("Content-Range", "bytes 400-699/1000"), ("ETag", "\"v1\""), ("Content-Length", "300")], Self.range)
        let facts = try #require(accepted(verdict), "\(verdict)")
        #expect(facts.writeStart == 400 && facts.totalLength == 1000 && facts.validator == Self.expected.validator)
    }

    /// Answers that must never extend the stored bytes, whichever kind of ask they answer.
    @Test(arguments: [
        [("Content-Range", "bytes 401-999/1000")],
        [("Content-Range", "bytes 400-998/1000")],
        [("Content-Range", "bytes 400-1999/2000")],
        [("Content-Range", "bytes 400-999/*")],
        [("Content-Range", "bytes 400-999/1000"), ("ETag", "\"v2\"")],
        [("Content-Range", "bytes 400-999/1000"), ("Content-Length", "10")],
        [("Content-Range", "bytes 400-999/1000"), ("Content-Encoding", "gzip")],
        [("Content-Type", "multipart/byteranges; boundary=x")],
        [("Content-Range", "bytes */1000")],
        [],
    ])
    func aResumeRestartsOnAnyMismatch(pairs: [(String, String)]) {
        guard case .restart = classify(206, pairs, Self.resume) else {
            Issue.record("expected restart for \(pairs), got \(classify(206, pairs, Self.resume))")
            return
        }
    }

    @Test(arguments: [
        [("Content-Range", "bytes 400-999/1000")],
        [("Content-Range", "bytes 400-698/1000")],
        [("Content-Range", "bytes 401-699/1000")],
        [("Content-Range", "bytes 400-699/2000")],
        [("Content-Range", "bytes 400-699/*")],
        [("Content-Range", "bytes 400-699/1000"), ("ETag", "\"v2\"")],
        [("Content-Range", "bytes 400-699/1000"), ("Content-Length", "301")],
        [("Content-Range", "bytes 400-699/1000"), ("Content-Encoding", "br")],
        [("Content-Type", "multipart/byteranges; boundary=x")],
    ])
    func aRangeRestartsOnAnyMismatch(pairs: [(String, String)]) {
        guard case .restart = classify(206, pairs, Self.range) else {
            Issue.record("expected restart for \(pairs), got \(classify(206, pairs, Self.range))")
            return
        }
    }

    /// With `If-Range` the server compared the validator itself: an answer without one is tolerated,
    /// a different one never is.
    @Test func aMissingValidatorIsToleratedUnderIfRange() {
        #expect(accepted(classify(206, [("Content-Range", "bytes 400-699/1000")], Self.range)) != nil)
        let weak = RangeAsk.resume(
            ResumePlan(resumeOffset: 400, overlap: 64, ifRange: nil, stored: nil),
            expected: RangeAsk.Expected(
                validator: ResourceValidator(etag: "W/\"v1\"", lastModified: nil, date: nil), totalLength: 1000))
        guard case .restart(.remoteChanged) = classify(206, [("Content-Range", "bytes 336-999/1000")], weak) else {
            Issue.record("without If-Range, a validator that disappeared means the file changed")
            return
        }
    }

    @Test func aFullAnswerToAResumeReplacesTheStoredBytes() throws {
        let verdict = classify(200, [("ETag", "\"v2\""), ("Content-Length", "1000")], Self.resume)
        let facts = try #require(accepted(verdict), "\(verdict)")
        #expect(facts.startsOver && facts.totalLength == 1000)
        #expect(facts.replaces == .remoteChanged("ETag changed from \"v1\" to \"v2\""))
        let same = try #require(accepted(classify(200, [("ETag", "\"v1\"")], Self.resume)))
        #expect(same.replaces == .rangeIgnored)
    }

    @Test func aFullAnswerToARangeRestartsTheDownload() {
        #expect(classify(200, [("ETag", "\"v1\"")], Self.range) == .restart(.rangeIgnored))
        #expect(
            classify(200, [("ETag", "\"v2\"")], Self.range)
                == .restart(.remoteChanged("ETag changed from \"v1\" to \"v2\"")))
    }

    @Test func aFreshDownloadTakesTheWholeFileFromEitherStatus() throws {
        let whole = try #require(
            accepted(
                classify(200, [("Content-Length", "1000"), ("Accept-Ranges", "bytes")], .fresh(probesRanges: false))))
        #expect(whole.startsOver && whole.acceptsRanges && !whole.isPartialResponse && whole.replaces == nil)
        let ranged = try #require(accepted(classify(206, [("Content-Range", "bytes 0-999/1000")], Self.probe)))
        #expect(ranged.isPartialResponse && ranged.totalLength == 1000)
        guard case .restart = classify(206, [("Content-Range", "bytes 0-499/1000")], Self.probe) else {
            Issue.record("a probe answered with part of the file must not be taken for the file")
            return
        }
        guard case .restart = classify(206, [("Content-Range", "bytes 0-999/*")], Self.probe) else {
            Issue.record("a probe answered without the total length must not be taken for the file")
            return
        }
    }

    @Test func rangeNotSatisfiableIsSuccessOnlyWhenItConfirmsTheStoredFile() {
        let complete = RangeAsk.resume(
            ResumePlan(resumeOffset: 1000, overlap: 0, ifRange: "\"v1\"", stored: nil), expected: Self.expected)
        #expect(classify(416, [("Content-Range", "bytes */1000")], complete) == .alreadyComplete)
        let longer = RangeAsk.resume(
            ResumePlan(resumeOffset: 1200, overlap: 0, ifRange: "\"v1\"", stored: nil),
            expected: RangeAsk.Expected(validator: Self.expected.validator, totalLength: 1200))
        guard case .restart = classify(416, [("Content-Range", "bytes */1000")], longer) else {
            Issue.record("a shorter remote file must restart")
            return
        }
        guard case .restart(.rangeNotSatisfiable) = classify(416, [("Content-Range", "bytes */1000")], Self.range)
        else {
            Issue.record("a 416 to a range restarts the download")
            return
        }
        #expect(classify(416, [], Self.probe) == .probeRefused)
        guard case .fail(.httpStatus, _, 416) = classify(416, [], .fresh(probesRanges: false)) else {
            Issue.record("a 416 to a request without a range fails")
            return
        }
    }

    @Test(arguments: [RangeAsk.fresh(probesRanges: true), Self.resume, Self.range])
    func statusesAreRetriedOrFailedAlikeForEveryAsk(ask: RangeAsk) {
        #expect(classify(503, [("Retry-After", "7")], ask) == .retry(status: 503, retryAfter: 7))
        #expect(classify(429, [], ask) == .retry(status: 429, retryAfter: nil))
        #expect(classify(508, [], ask) == .retry(status: 508, retryAfter: nil))
        guard case .fail(.httpStatus, _, 404) = classify(404, [], ask) else {
            Issue.record("404 must fail")
            return
        }
        guard case .fail(.httpStatus, _, 501) = classify(501, [], ask) else {
            Issue.record("501 must fail")
            return
        }
    }

    @Test func theRequestHeadersFollowTheAsk() {
        #expect(Self.probe.headers.map(\.0) == ["Range"] && Self.probe.headers.first?.1 == "bytes=0-")
        #expect(RangeAsk.fresh(probesRanges: false).headers.isEmpty)
        #expect(Self.resume.headers.map(\.1) == ["bytes=400-", "\"v1\""])
        #expect(Self.range.headers.map(\.1) == ["bytes=400-699", "\"v1\""])
    }
}
