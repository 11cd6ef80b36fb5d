import Testing

@testable import Haul

struct XXH64Tests {
    /// Reference values from `xxhsum -H1`.
    static let vectors: [(String, UInt64)] = [
        ("", 0xEF46_DB37_51D8_E999),
        ("a", 0xD24E_C4F1_A98C_6E5B),
        ("abc", 0x44BC_2CF5_AD77_0999),
        (String(repeating: "x", count: 100), 0x92F0_DE5A_88A3_C094),
        ((1...100_000).map { "\($0)\n" }.joined(), 0xE9C2_321C_22A9_ABA2),
    ]

    @Test func matchesTheReferenceImplementation() {
        for (text, expected) in Self.vectors {
            let bytes = Array(text.utf8)
            #expect(bytes.withUnsafeBytes { XXH64.hash($0) } == expected, "\(bytes.count) bytes")
        }
    }

    @Test func feedingInPiecesGivesTheSameHash() {
        let bytes = Array((1...100_000).map { "\($0)\n" }.joined().utf8)
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<50 {
            var hasher = XXH64()
            var offset = 0
            while offset < bytes.count {
                let count = min(bytes.count - offset, Int.random(in: 0...100, using: &generator))
                bytes[offset..<offset + count].withUnsafeBytes { hasher.update($0) }
                offset += count
            }
            #expect(hasher.finalize() == 0xE9C2_321C_22A9_ABA2)
        }
    }
}
