#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A hash algorithm Haul can verify files with.
public enum DigestAlgorithm: String, Sendable, Codable, CaseIterable, Comparable {
    /// MD5: catches corruption, not a deliberate forgery; for legacy mirrors.
    case md5 = "md5"
    /// SHA-1: catches corruption, not a deliberate forgery; for legacy mirrors.
    case sha1 = "sha-1"
    /// SHA-256.
    case sha256 = "sha-256"
    /// SHA-512.
    case sha512 = "sha-512"

    /// Accepts the RFC 9530 names and the common spellings (`sha256`, `SHA-256`, `sha_256`).
    public init?(name: String) {
        let normalized = name.lowercased().filter { $0 != "-" && $0 != "_" }
        switch normalized {
        case "md5": self = .md5
        case "sha1", "sha": self = .sha1
        case "sha256": self = .sha256
        case "sha512": self = .sha512
        default: return nil
        }
    }

    /// MD5 and SHA-1 still catch corruption but no longer resist a deliberate forgery.
    public var isWeak: Bool { self == .md5 || self == .sha1 }

    /// The length of a digest of this algorithm, in bytes.
    public var digestByteCount: Int {
        switch self {
        case .md5: 16
        case .sha1: 20
        case .sha256: 32
        case .sha512: 64
        }
    }

    private var strength: Int { Self.allCases.firstIndex(of: self)! }

    /// Weaker algorithms compare smaller.
    public static func < (left: DigestAlgorithm, right: DigestAlgorithm) -> Bool { left.strength < right.strength }
}

/// An expected digest of a file (or of one response body).
public struct Checksum: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The hash function.
    public let algorithm: DigestAlgorithm
    /// The digest's bytes.
    public let digest: [UInt8]

    /// A checksum of `algorithm` with these digest bytes.
    public init(algorithm: DigestAlgorithm, digest: [UInt8]) {
        self.algorithm = algorithm
        self.digest = digest
    }

    /// Parses `ALG=HEX` or `ALG:HEX`, e.g. `sha-256=9f86d0…`.
    public init(parsing text: String) throws {
        guard let separator = text.firstIndex(where: { $0 == "=" || $0 == ":" }) else {
            throw HaulError(.invalidArgument, "checksum \"\(text)\" must look like sha-256=HEX")
        }
        let name = String(text[..<separator])
        guard let algorithm = DigestAlgorithm(name: name) else {
            let known = DigestAlgorithm.allCases.map(\.rawValue).joined(separator: ", ")
            throw HaulError(.invalidArgument, "unknown checksum algorithm \"\(name)\" (known: \(known))")
        }
        let hex = text[text.index(after: separator)...].lowercased()
        guard hex.count == algorithm.digestByteCount * 2, let digest = Self.bytes(fromHex: hex) else {
            throw HaulError(
                .invalidArgument,
                "a \(algorithm.rawValue) checksum is \(algorithm.digestByteCount * 2) hexadecimal digits, got \"\(hex)\""
            )
        }
        self.init(algorithm: algorithm, digest: digest)
    }

    /// The digest in lowercase hexadecimal.
    public var hex: String { digest.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() }

    /// `ALG=HEX`, as `--checksum` takes it.
    public var description: String { "\(algorithm.rawValue)=\(hex)" }

    static func bytes(fromHex hex: String) -> [UInt8]? {
        var bytes: [UInt8] = []
        var high: UInt8?
        for character in hex.utf8 {
            let value: UInt8
            switch character {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = character - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): value = character - UInt8(ascii: "a") + 10
            default: return nil
            }
            if let first = high {
                bytes.append(first << 4 | value)
                high = nil
            } else {
                high = value
            }
        }
        return high == nil ? bytes : nil
    }
}
