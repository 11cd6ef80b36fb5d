/// Generated file content: byte `i` of a resource is a pure function of its seed and `i`, so a
/// file of any size costs no memory or disk and any range can be produced or checked cheaply.
public enum TestContent {
    /// The 64-bit word holding bytes `8 * index ..< 8 * index + 8`.
    @inline(__always)
    static func word(seed: UInt64, index: UInt64) -> UInt64 {
        // SplitMix64 over the word index: fast, and neighbouring words look unrelated.
        var z = seed &+ (index &+ 1) &* 0x9E37_79B9_7F4A_7C15
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// Fills `buffer` with the bytes starting at `offset`.
    public static func fill(_ buffer: UnsafeMutableRawBufferPointer, seed: UInt64, offset: Int64) {
        var position = 0
        var absolute = UInt64(offset)
        // Leading bytes up to a word boundary.
        while position < buffer.count && absolute % 8 != 0 {
            buffer[position] = UInt8(truncatingIfNeeded: word(seed: seed, index: absolute / 8) >> (8 * (absolute % 8)))
            position += 1
            absolute += 1
        }
        while buffer.count - position >= 8 {
            buffer.storeBytes(
                of: word(seed: seed, index: absolute / 8).littleEndian, toByteOffset: position, as: UInt64.self)
            position += 8
            absolute += 8
        }
        while position < buffer.count {
            buffer[position] = UInt8(truncatingIfNeeded: word(seed: seed, index: absolute / 8) >> (8 * (absolute % 8)))
            position += 1
            absolute += 1
        }
    }

    /// The bytes in `range`.
    public static func bytes(seed: UInt64, range: Range<Int64>) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: Int(range.count)) { buffer, count in
            fill(UnsafeMutableRawBufferPointer(buffer), seed: seed, offset: range.lowerBound)
            count = Int(range.count)
        }
    }

    /// A stable seed for a resource name and version.
    public static func seed(name: String, version: Int) -> UInt64 {
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325
        for byte in name.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x0000_0100_0000_01B3
        }
        return hash ^ (UInt64(truncatingIfNeeded: version) &* 0xD6E8_FEB8_6659_FD93)
    }
}
