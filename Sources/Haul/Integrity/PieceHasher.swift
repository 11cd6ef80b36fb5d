import NIOCore

/// Hashes a file in fixed-size pieces as its bytes arrive in order, so the manifest can record a
/// hash for every complete piece and a later resume (or `haul verify`) can find damaged data.
///
/// A piece hash is the piece's XXH64 in 16 hex digits: enough to catch any accidental damage (the
/// file as a whole is checked against the server's digest or the user's checksum), cheap enough to
/// compute on the write path, and small enough that a 100 GiB file's manifest stays under 1 MB.
struct PieceHasher: Sendable {
    let pieceSize: Int64
    /// The offset of the next byte to hash.
    private(set) var offset: Int64
    private var current = XXH64()

    /// A hasher positioned at the start of piece `index`.
    init(pieceSize: Int64, startingAtPiece index: Int) {
        self.pieceSize = pieceSize
        self.offset = Int64(index) * pieceSize
    }

    /// Hashes the next bytes of the file (which must start at ``offset``); returns the hashes of the
    /// pieces these bytes completed, in order.
    mutating func update(_ bytes: UnsafeRawBufferPointer) -> [String] {
        var completed: [String] = []
        var position = 0
        while position < bytes.count {
            let roomInPiece = Int(pieceSize - offset % pieceSize)
            let count = min(roomInPiece, bytes.count - position)
            current.update(UnsafeRawBufferPointer(rebasing: bytes[position..<position + count]))
            position += count
            offset += Int64(count)
            if offset % pieceSize == 0 {
                completed.append(Self.encode(current.finalize()))
                current = XXH64()
            }
        }
        return completed
    }

    mutating func update(_ buffer: ByteBuffer) -> [String] {
        buffer.withUnsafeReadableBytes { update($0) }
    }

    /// The hash of the final, shorter piece of a file that ends at ``offset`` (nothing when the file
    /// ends on a piece boundary).
    func finalPartialPiece() -> String? {
        offset % pieceSize == 0 ? nil : Self.encode(current.finalize())
    }

    static func hash(_ bytes: UnsafeRawBufferPointer) -> String {
        encode(XXH64.hash(bytes))
    }

    private static func encode(_ hash: UInt64) -> String {
        let digits = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}
