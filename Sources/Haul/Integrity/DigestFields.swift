import NIOHTTP1

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Reads the digests servers send.
///
/// - `Repr-Digest` (RFC 9530) and the obsolete `Digest` (RFC 3230) describe the whole representation:
///   the complete file, whatever range a response carries.
/// - `Content-Digest` (RFC 9530) and the obsolete `Content-MD5` describe this response's body only.
///
/// Unknown algorithms and malformed members are skipped, never trusted.
package enum DigestFields {
    /// Digests of the complete file announced by a response.
    package static func representationDigests(_ headers: HTTPHeaders) -> [Checksum] {
        let modern = headers[canonicalForm: "repr-digest"].flatMap { structured(String($0)) }
        let legacy = headers[canonicalForm: "digest"].flatMap { legacyDigest(String($0)) }
        return unique(modern + legacy)
    }

    /// Digests of this response's body.
    package static func contentDigests(_ headers: HTTPHeaders) -> [Checksum] {
        let modern = headers[canonicalForm: "content-digest"].flatMap { structured(String($0)) }
        let md5 = headers.first(name: "content-md5").flatMap { base64Checksum(.md5, $0) }.map { [$0] } ?? []
        return unique(modern + md5)
    }

    /// An RFC 9530 dictionary member list: `sha-256=:BASE64:, sha-512=:BASE64:`.
    package static func structured(_ value: String) -> [Checksum] {
        value.split(separator: ",").compactMap { member in
            let parts = member.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, let algorithm = DigestAlgorithm(name: String(parts[0].trimmingHTTPWhitespace()))
            else {
                return nil
            }
            // Drop parameters (`;key=value`) after the byte sequence.
            let item = parts[1].split(separator: ";", maxSplits: 1).first.map { $0.trimmingHTTPWhitespace() } ?? ""
            guard item.count >= 2, item.first == ":", item.last == ":" else { return nil }
            return base64Checksum(algorithm, String(item.dropFirst().dropLast()))
        }
    }

    /// An RFC 3230 `Digest` value: `SHA-256=BASE64,MD5=BASE64`.
    package static func legacyDigest(_ value: String) -> [Checksum] {
        value.split(separator: ",").compactMap { member in
            let parts = member.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, let algorithm = DigestAlgorithm(name: String(parts[0].trimmingHTTPWhitespace()))
            else {
                return nil
            }
            return base64Checksum(algorithm, String(parts[1].trimmingHTTPWhitespace()))
        }
    }

    static func base64Checksum(_ algorithm: DigestAlgorithm, _ text: String) -> Checksum? {
        guard let data = Data(base64Encoded: text.trimmingHTTPWhitespace().description),
            data.count == algorithm.digestByteCount
        else { return nil }
        return Checksum(algorithm: algorithm, digest: [UInt8](data))
    }

    private static func unique(_ checksums: [Checksum]) -> [Checksum] {
        var seen: Set<DigestAlgorithm> = []
        return checksums.filter { seen.insert($0.algorithm).inserted }
    }
}
