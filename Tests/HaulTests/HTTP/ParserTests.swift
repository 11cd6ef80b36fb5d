import NIOHTTP1
import Testing

@testable import Haul

struct ContentRangeTests {
    @Test(arguments: [
        ("bytes 0-499/1234", ContentRange(first: 0, last: 499, completeLength: 1234)),
        ("bytes 500-999/*", ContentRange(first: 500, last: 999, completeLength: nil)),
        ("bytes */1234", ContentRange(first: nil, last: nil, completeLength: 1234)),
        (
            "BYTES 4294967296-4294967395/5000000000",
            ContentRange(first: 4_294_967_296, last: 4_294_967_395, completeLength: 5_000_000_000)
        ),
        ("  bytes 1-1/2 ", ContentRange(first: 1, last: 1, completeLength: 2)),
    ])
    func parsesValidValues(text: String, expected: ContentRange) {
        #expect(ContentRange(text) == expected)
    }

    @Test(arguments: [
        "", "bytes", "bytes 5-4/10", "bytes 0-10/10", "bytes -1-5/10", "bytes 0-5", "items 0-5/10", "bytes */*",
        "bytes 0-5/-1", "bytes +0-5/10", "bytes 0-99999999999999999999/1", "bytes 0 -5/10", "bytes a-b/c",
    ])
    func rejectsMalformedValues(text: String) {
        #expect(ContentRange(text) == nil)
    }
}

struct EntityTagTests {
    @Test func parsesStrongAndWeakTags() throws {
        let strong = try #require(EntityTag("\"abc\""))
        let weak = try #require(EntityTag("W/\"abc\""))
        #expect(!strong.isWeak && weak.isWeak)
        #expect(strong.weaklyMatches(weak))
        #expect(!strong.stronglyMatches(weak))
        #expect(strong.stronglyMatches(strong))
        #expect(weak.description == "W/\"abc\"")
    }

    @Test(arguments: ["abc", "\"a\"b\"", "W/abc", "\"", "\"a b\""])
    func rejectsMalformedTags(text: String) {
        #expect(EntityTag(text) == nil)
    }
}

struct HTTPDateTests {
    @Test(arguments: [
        "Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
    ])
    func parsesAllThreeFormats(text: String) {
        #expect(HTTPDate.parse(text) == 784_111_777)
    }

    @Test func formatsIMFFixdate() {
        #expect(HTTPDate.format(784_111_777) == "Sun, 06 Nov 1994 08:49:37 GMT")
        #expect(HTTPDate.parse(HTTPDate.format(1_767_225_600)) == 1_767_225_600)
    }

    @Test(arguments: [
        "", "yesterday", "Sun, 32 Nov 1994 08:49:37 GMT", "Sun, 06 Foo 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 25:00:00 GMT",
    ])
    func rejectsOtherText(text: String) {
        #expect(HTTPDate.parse(text) == nil)
    }

    /// The byte-by-byte reading of an IMF-fixdate agrees with the field-by-field one, on dates
    /// across the range and on near misses of the form.
    @Test func theQuickReadingAgreesWithTheGeneralOne() {
        var texts: [String] = []
        var seconds: Int64 = -2_208_988_800  // 1900-01-01
        while seconds < 253_402_300_799 {  // 9999-12-31
            texts.append(HTTPDate.format(seconds))
            seconds += 86_400 * 397 + 3_727
        }
        let base = "Sun, 06 Nov 1994 08:49:37 GMT"
        for index in base.indices {
            for replacement in ["x", " ", "\t", "9", ",", ":", "-"] {
                var text = base
                text.replaceSubrange(index...index, with: replacement)
                texts.append(text)
            }
        }
        texts += [
            "Xyz, 06 Nov 1994 08:49:37 GMT", "Sun, 31 Feb 2023 23:59:60 GMT", "Sun, 00 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1899 08:49:37 GMT", "Sun, 06 nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 gmt",
        ]
        for text in texts {
            #expect(HTTPDate.parse(text) == HTTPDate.parseFields(text), "\(text)")
        }
        #expect(texts.filter { HTTPDate.parse($0) != nil }.count > 20)
    }
}

struct RetryAfterTests {
    @Test func readsSecondsAndDates() {
        #expect(RetryAfter.delay("120", now: 0) == 120)
        #expect(RetryAfter.delay("Sun, 06 Nov 1994 08:49:37 GMT", now: 784_111_777 - 30) == 30)
        #expect(RetryAfter.delay("Sun, 06 Nov 1994 08:49:37 GMT", now: 784_111_777 + 30) == 0)
        #expect(RetryAfter.delay("-5", now: 0) == nil)
        #expect(RetryAfter.delay("soon", now: 0) == nil)
    }
}

struct ContentDispositionTests {
    @Test(arguments: [
        ("attachment; filename=\"a.txt\"", "a.txt"),
        ("attachment; filename=a.txt", "a.txt"),
        ("attachment; filename=\"a\\\"b.txt\"", "a\"b.txt"),
        ("attachment; filename*=UTF-8''%E2%82%AC%20rates.txt", "€ rates.txt"),
        ("attachment; filename=\"fallback.txt\"; filename*=utf-8''real.txt", "real.txt"),
        ("attachment; filename*=iso-8859-1''caf%E9.txt", "café.txt"),
        ("attachment; FILENAME=\"upper.txt\"", "upper.txt"),
    ])
    func extractsFilenames(header: String, expected: String) {
        #expect(ContentDisposition.filename(header) == expected)
    }

    @Test(arguments: [
        "attachment", "inline; size=3", "attachment; filename*=UTF-8''%ZZ", "attachment; filename*=koi8-r''x",
    ])
    func returnsNothingWithoutAUsableName(header: String) {
        #expect(ContentDisposition.filename(header) == nil)
    }
}

struct FileNamingTests {
    @Test(
        arguments: [
            ("../../x", "x"), ("/etc/passwd", "passwd"), ("..\\..\\win.ini", "win.ini"), ("...", nil), ("..", nil),
            (".hidden", "hidden"), ("a\u{0}b", "ab"), ("tab\there", "tabhere"), ("name. ", "name"), ("", nil),
            ("dir/", "dir"), ("ok.tar.gz", "ok.tar.gz"),
            // Invisible formatting: a right-to-left override would show this one as "evilexe.jpg".
            ("evil\u{202E}gpj.exe", "evilgpj.exe"), ("a\u{200B}b\u{2066}c\u{2069}d\u{200F}", "abcd"),
            ("\u{FEFF}bom.txt", "bom.txt"), ("line\u{2028}break", "linebreak"), ("\u{202E}", nil),
            ("naïve café.txt", "naïve café.txt"),
            // A prepended mark makes one character of itself and the "/" after it; the "/" still splits.
            ("a\u{0600}/b", "b"), ("x\u{0600}\\y", "y"), ("\u{0600}/", nil), (".\u{0301}x", "\u{0301}x"),
            // Joiners join letters and emoji, and stay.
            (
                "\u{0645}\u{06CC}\u{200C}\u{062E}\u{0648}\u{0627}\u{0645}.txt",
                "\u{0645}\u{06CC}\u{200C}\u{062E}\u{0648}\u{0627}\u{0645}.txt"
            ),
            ("\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467}.png", "\u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467}.png"),
        ] as [(String, String?)])
    func sanitizes(input: String, expected: String?) {
        #expect(FileNaming.sanitize(input) == expected)
    }

    /// Every name the quick check passes comes out of the scalar-by-scalar walk unchanged.
    @Test func aPlainNameIsWhatTheWalkWouldGive() {
        let pieces = ["a", "Z", "0", ".", " ", "/", "\\", "\t", "\u{7F}", "~", "é", "-", "_"]
        var names = [""]
        for _ in 0..<3 { names = names.flatMap { name in pieces.map { name + $0 } } }
        names += [String(repeating: "a", count: 200), String(repeating: "a", count: 201), "report 2026.pdf"]
        var plain = 0
        for name in names {
            #expect(FileNaming.sanitize(name) == FileNaming.sanitizedScalarByScalar(name), "\(name.debugDescription)")
            if FileNaming.isPlain(name) {
                plain += 1
                #expect(FileNaming.sanitizedScalarByScalar(name) == name)
            }
        }
        #expect(plain > 100)
    }

    @Test func longNamesKeepTheirExtensionWithinTheLimit() throws {
        let name = try #require(FileNaming.sanitize(String(repeating: "é", count: 5000) + ".tar.gz"))
        #expect(name.utf8.count <= FileNaming.maximumNameBytes)
        #expect(name.hasSuffix(".gz"))
    }

    /// A first character too long for the limit with its extension (one letter with a thousand
    /// combining marks) does not leave a hidden ".ext": the name is cut scalar by scalar.
    @Test func aGiantFirstCharacterDoesNotLeaveAHiddenExtension() throws {
        let name = try #require(FileNaming.sanitize("a" + String(repeating: "\u{0301}", count: 1000) + ".txt"))
        #expect(!name.hasPrefix("."))
        #expect(name.unicodeScalars.first == "a" && name.utf8.count <= FileNaming.maximumNameBytes)
        #expect(name.utf8.count > 100)
    }
}

struct ResourceValidatorTests {
    @Test func lastModifiedIsStrongOnlyWhenOlderThanTheDate() {
        let strong = ResourceValidator(
            etag: nil, lastModified: "Sun, 06 Nov 1994 08:49:37 GMT", date: "Sun, 06 Nov 1994 08:49:39 GMT")
        let weak = ResourceValidator(
            etag: nil, lastModified: "Sun, 06 Nov 1994 08:49:37 GMT", date: "Sun, 06 Nov 1994 08:49:37 GMT")
        #expect(strong.ifRangeValue == "Sun, 06 Nov 1994 08:49:37 GMT")
        #expect(weak.ifRangeValue == nil)
    }

    @Test func weakTagIsNeverUsedInIfRangeNorReplacedByADate() {
        let validator = ResourceValidator(
            etag: "W/\"x\"", lastModified: "Sun, 06 Nov 1994 08:49:37 GMT", date: "Mon, 07 Nov 1994 08:49:37 GMT"
        )
        #expect(validator.ifRangeValue == nil)
        #expect(ResourceValidator(etag: "\"x\"", lastModified: nil, date: nil).ifRangeValue == "\"x\"")
    }

    @Test func contradictions() {
        let stored = ResourceValidator(etag: "\"a\"", lastModified: nil, date: nil)
        #expect(stored.contradiction(with: ResourceValidator(etag: "\"a\"", lastModified: nil, date: nil)) == nil)
        #expect(stored.contradiction(with: ResourceValidator(etag: "\"b\"", lastModified: nil, date: nil)) != nil)
        #expect(stored.contradiction(with: ResourceValidator()) != nil)
    }
}

struct ProgressMeterTests {
    @Test func reportsAreMonotonicCappedAndThrottled() {
        var meter = ProgressMeter(startingAt: 100, totalBytes: 1000, interval: .milliseconds(100))
        let start = Moment.zero
        let due = meter.record(200, at: start)
        #expect(due)
        let first = meter.report(connections: 1)
        #expect(first.bytes == 200 && first.connections == 1)
        let early = meter.record(300, at: start + .milliseconds(10))
        #expect(!early, "not due within the interval")
        let later = meter.record(150, at: start + .milliseconds(200))
        #expect(later)
        let second = meter.report(connections: 4)
        #expect(second.bytes == 300 && second.connections == 4)
        let last = meter.record(5000, at: start + .milliseconds(400))
        #expect(last)
        let third = meter.report(connections: 0)
        #expect(third.bytes == 1000)
        #expect(third.fraction == 1)
        #expect(third.bytesPerSecond > 0)
        let forced = meter.record(1000, at: start + .milliseconds(401), force: true)
        #expect(forced, "a forced report is due at once")
    }
}

struct RedirectPolicyTests {
    @Test func httpsToHTTPIsRefusedUnlessAllowed() throws {
        let current = try DownloadURL("https://a.example/x")
        #expect(throws: HaulError.self) {
            try RedirectPolicy.follow(
                location: "http://a.example/y", from: current, headers: [], allowHTTPSToHTTP: false,
                isSecret: DownloadRequest.looksSecret)
        }
        let (next, _) = try RedirectPolicy.follow(
            location: "http://a.example/y", from: current, headers: [], allowHTTPSToHTTP: true,
            isSecret: DownloadRequest.looksSecret)
        #expect(next.string == "http://a.example/y")
    }

    @Test func credentialsStayWithTheirOrigin() throws {
        let current = try DownloadURL("https://a.example/x")
        let headers = [("Authorization", "t"), ("Cookie", "c"), ("Accept", "*/*")]
        let (_, same) = try RedirectPolicy.follow(
            location: "/y", from: current, headers: headers, allowHTTPSToHTTP: false,
            isSecret: DownloadRequest.looksSecret)
        #expect(same.count == 3)
        let (_, otherPort) = try RedirectPolicy.follow(
            location: "https://a.example:8443/y", from: current, headers: headers, allowHTTPSToHTTP: false,
            isSecret: DownloadRequest.looksSecret)
        #expect(otherPort.map(\.0) == ["Accept"])
    }
}
