/// XXH64, a fast non-cryptographic 64-bit hash (Yann Collet's xxHash, 64-bit variant), in a
/// streaming form.
///
/// Piece hashes guard against damage on disk (torn or reverted writes, a bad disk, another program),
/// not against an adversary: the server's digest or the user's checksum covers that. XXH64 does
/// this job at several gigabytes per second, where SHA-256 costs a core for every ~2 GB/s of download.
struct XXH64: Sendable {
    private static let prime1: UInt64 = 0x9E37_79B1_85EB_CA87
    private static let prime2: UInt64 = 0xC2B2_AE3D_27D4_EB4F
    private static let prime3: UInt64 = 0x1656_67B1_9E37_79F9
    private static let prime4: UInt64 = 0x85EB_CA77_C2B2_AE63
    private static let prime5: UInt64 = 0x27D4_EB2F_1656_67C5

    private let seed: UInt64
    private var lanes: (UInt64, UInt64, UInt64, UInt64)
    /// Up to 31 bytes waiting for a whole 32-byte stripe.
    private var pending: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
    private var pendingCount = 0
    private var length: UInt64 = 0

    init(seed: UInt64 = 0) {
        self.seed = seed
        self.lanes = (seed &+ Self.prime1 &+ Self.prime2, seed &+ Self.prime2, seed, seed &- Self.prime1)
    }

    static func hash(_ bytes: UnsafeRawBufferPointer, seed: UInt64 = 0) -> UInt64 {
        var hasher = XXH64(seed: seed)
        hasher.update(bytes)
        return hasher.finalize()
    }

    @inline(__always)
    private static func round(_ accumulator: UInt64, _ input: UInt64) -> UInt64 {
        let mixed = accumulator &+ input &* prime2
        return ((mixed << 31) | (mixed >> 33)) &* prime1
    }

    @inline(__always)
    private static func merge(_ accumulator: UInt64, _ lane: UInt64) -> UInt64 {
        (accumulator ^ round(0, lane)) &* prime1 &+ prime4
    }

    @inline(__always)
    private static func rotate(_ value: UInt64, _ count: UInt64) -> UInt64 {
        (value << count) | (value >> (64 &- count))
    }

    /// Consumes whole 32-byte stripes from `bytes`; returns how many bytes it used.
    @inline(__always)
    private mutating func consumeStripes(_ bytes: UnsafeRawBufferPointer) -> Int {
        var (lane1, lane2, lane3, lane4) = lanes
        var offset = 0
        let limit = bytes.count - 32
        while offset <= limit {
            lane1 = Self.round(
                lane1, UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self)))
            lane2 = Self.round(
                lane2, UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset + 8, as: UInt64.self)))
            lane3 = Self.round(
                lane3, UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset + 16, as: UInt64.self)))
            lane4 = Self.round(
                lane4, UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset + 24, as: UInt64.self)))
            offset += 32
        }
        lanes = (lane1, lane2, lane3, lane4)
        return offset
    }

    mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty else { return }
        length &+= UInt64(bytes.count)
        var input = bytes
        if pendingCount > 0 {
            let take = min(32 - pendingCount, input.count)
            withUnsafeMutableBytes(of: &pending) { buffer in
                buffer.baseAddress!.advanced(by: pendingCount).copyMemory(from: input.baseAddress!, byteCount: take)
            }
            pendingCount += take
            input = UnsafeRawBufferPointer(rebasing: input[take...])
            guard pendingCount == 32 else { return }
            let stripe = pending
            withUnsafeBytes(of: stripe) { _ = consumeStripes($0) }
            pendingCount = 0
        }
        let used = consumeStripes(input)
        let rest = input.count - used
        if rest > 0 {
            withUnsafeMutableBytes(of: &pending) { buffer in
                buffer.baseAddress!.copyMemory(from: input.baseAddress!.advanced(by: used), byteCount: rest)
            }
            pendingCount = rest
        }
    }

    func finalize() -> UInt64 {
        var hash: UInt64
        if length >= 32 {
            let (lane1, lane2, lane3, lane4) = lanes
            hash = Self.rotate(lane1, 1) &+ Self.rotate(lane2, 7) &+ Self.rotate(lane3, 12) &+ Self.rotate(lane4, 18)
            hash = Self.merge(hash, lane1)
            hash = Self.merge(hash, lane2)
            hash = Self.merge(hash, lane3)
            hash = Self.merge(hash, lane4)
        } else {
            hash = seed &+ Self.prime5
        }
        hash &+= length
        let count = pendingCount
        withUnsafeBytes(of: pending) { tail in
            var offset = 0
            while offset + 8 <= count {
                let word = UInt64(littleEndian: tail.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
                hash = Self.rotate(hash ^ Self.round(0, word), 27) &* Self.prime1 &+ Self.prime4
                offset += 8
            }
            if offset + 4 <= count {
                let word = UInt64(UInt32(littleEndian: tail.loadUnaligned(fromByteOffset: offset, as: UInt32.self)))
                hash = Self.rotate(hash ^ (word &* Self.prime1), 23) &* Self.prime2 &+ Self.prime3
                offset += 4
            }
            while offset < count {
                hash = Self.rotate(hash ^ (UInt64(tail[offset]) &* Self.prime5), 11) &* Self.prime1
                offset += 1
            }
        }
        hash ^= hash >> 33
        hash &*= Self.prime2
        hash ^= hash >> 29
        hash &*= Self.prime3
        hash ^= hash >> 32
        return hash
    }
}
