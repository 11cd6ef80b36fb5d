import Haul
import HaulTestServer

/// The parsers that read what servers and users send, each with the properties its result must have.
/// A violated property is a crash, so the fuzzer reports it like any other.
enum FuzzTarget: String, CaseIterable {
    case contentRange = "content-range"
    case range
    case contentDisposition = "content-disposition"
    case retryAfter = "retry-after"
    case digest
    case manifest
    case url

    static var selected: FuzzTarget {
        let name = getenv("HAUL_FUZZ_TARGET").map { String(cString: $0) } ?? ""
        guard let target = FuzzTarget(rawValue: name) else {
            fatalError("set HAUL_FUZZ_TARGET to one of: \(allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return target
    }

    func run(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        switch self {
        case .contentRange:
            guard let range = ContentRange(text) else { return }
            if let first = range.first, let last = range.last {
                check(first >= 0 && first <= last, "range \(range)")
                if let total = range.completeLength { check(last < total, "range beyond its total \(range)") }
            } else {
                check(range.completeLength != nil, "unsatisfied range without a length")
            }
        case .range:
            guard let set = ByteRangeSet(text) else { return }
            for length in [Int64(0), 1, 1000, 1 << 40] {
                for resolved in set.resolve(length: length) {
                    check(resolved.lowerBound >= 0 && resolved.upperBound <= length, "range \(resolved) of \(length)")
                    check(!resolved.isEmpty, "empty range for \(text)")
                }
            }
        case .contentDisposition:
            let suggested = ContentDisposition.filename(text) ?? text
            guard let name = FileNaming.sanitize(suggested) else { return }
            // Bytes, not characters: a "/" joined to a mark before it is still a "/" to the file system.
            check(
                !name.utf8.contains(UInt8(ascii: "/")) && !name.utf8.contains(UInt8(ascii: "\\")),
                "separator in \(name)")
            check(name.utf8.first != UInt8(ascii: "."), "hidden or dot name \(name)")
            check(name.utf8.count <= FileNaming.maximumNameBytes, "name too long")
            check(!name.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, "control character")
            check(!FileNaming.name(fromURLPath: text).utf8.contains(UInt8(ascii: "/")), "separator in a URL name")
        case .retryAfter:
            if let delay = RetryAfter.delay(text, now: 1_800_000_000) { check(delay >= 0, "negative delay") }
            if let date = HTTPDate.parse(text) {
                check(HTTPDate.parse(HTTPDate.format(date)) == date, "date round trip")
            }
        case .digest:
            for checksum in DigestFields.structured(text) + DigestFields.legacyDigest(text) {
                check(checksum.digest.count == checksum.algorithm.digestByteCount, "digest length")
            }
            if let checksum = try? Checksum(parsing: text) {
                check((try? Checksum(parsing: checksum.description)) == checksum, "checksum round trip")
            }
        case .manifest:
            guard let manifest = try? Manifest.decode(bytes) else { return }
            for segment in manifest.segments { check(segment.durable <= segment.written, "durable beyond written") }
            _ = manifest.trustedPrefix(currentBootID: "fuzz", partialSize: Int64(bytes.count))
        case .url:
            guard let url = try? DownloadURL(text) else { return }
            check(url.isHTTPS || url.url.scheme?.lowercased() == "http", "scheme \(url.string)")
            _ = try? RedirectPolicy.follow(
                location: text, from: url, headers: [("Authorization", "x")], allowHTTPSToHTTP: false,
                isSecret: DownloadRequest.looksSecret)
        }
    }

    private func check(_ condition: Bool, _ message: @autoclosure () -> String) {
        if !condition { fatalError("\(rawValue): \(message())") }
    }
}

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
