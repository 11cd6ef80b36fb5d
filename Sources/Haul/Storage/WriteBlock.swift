import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Consecutive bytes of a download on their way to the file, held in page-aligned memory so that
/// their full pages can be written with direct I/O.
///
/// The byte at file offset `start` sits `start % pageSize` bytes into the memory, so every page
/// boundary of the file falls on a page boundary of the memory. One task owns a block at a time: the
/// receiving loop fills it, hands it to a write, and gets it back to fill again.
final class WriteBlock: @unchecked Sendable {
    static let pageSize = 4096

    private var memory: UnsafeMutableRawPointer
    private var capacity: Int
    /// The file offset of the first byte held.
    private(set) var start: Int64
    /// The number of bytes held.
    private(set) var count = 0

    init(capacity: Int, start: Int64) {
        self.capacity = Self.roundUp(capacity + Self.pageSize)
        self.memory = Self.allocate(self.capacity)
        self.start = start
    }

    deinit { free(memory) }

    private static func roundUp(_ value: Int) -> Int { (value + pageSize - 1) / pageSize * pageSize }

    private static func allocate(_ capacity: Int) -> UnsafeMutableRawPointer {
        var pointer: UnsafeMutableRawPointer?
        guard posix_memalign(&pointer, pageSize, capacity) == 0, let pointer else {
            fatalError("out of memory for a \(capacity)-byte write block")
        }
        return pointer
    }

    /// Where the byte at `start` sits in memory.
    private var lead: Int { Int(start % Int64(Self.pageSize)) }

    var end: Int64 { start + Int64(count) }

    var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: memory + lead, count: count) }

    func append(_ chunk: ByteBuffer) {
        chunk.withUnsafeReadableBytes { append($0) }
    }

    func append(_ source: UnsafeRawBufferPointer) {
        guard !source.isEmpty else { return }
        let needed = lead + count + source.count
        if needed > capacity {
            let larger = Self.roundUp(max(needed, capacity * 2))
            let moved = Self.allocate(larger)
            moved.copyMemory(from: memory, byteCount: lead + count)
            free(memory)
            memory = moved
            capacity = larger
        }
        (memory + lead + count).copyMemory(from: source.baseAddress!, byteCount: source.count)
        count += source.count
    }

    /// Empties the block to hold the bytes from file offset `start` on.
    func reset(start: Int64) {
        self.start = start
        count = 0
    }

    /// The bytes a write should take now: everything when `final`, else up to the last page boundary
    /// of the file (the rest waits for more bytes, so that direct writes stay whole pages).
    func writableCount(final: Bool) -> Int {
        if final { return count }
        let aligned = Int((end / Int64(Self.pageSize)) * Int64(Self.pageSize) - start)
        return max(0, aligned)
    }

    /// Moves the bytes past the first `count` into `next` (which starts where they do) and forgets them.
    func moveTail(after kept: Int, into next: WriteBlock) {
        next.reset(start: start + Int64(kept))
        next.append(UnsafeRawBufferPointer(rebasing: bytes[kept...]))
        count = kept
    }

    /// Writes the block to `file`: its full pages with direct I/O when the file allows it, the partial
    /// pages at its ends (and everything, without direct I/O) through the page cache.
    func write(to file: PartialFile) throws {
        let all = bytes
        guard file.usesDirectWrites else {
            try file.writeNow(all, at: start)
            return
        }
        let page = Self.pageSize
        let head = min(count, (page - lead) % page)
        let middle = (count - head) / page * page
        if head > 0 { try file.writeNow(UnsafeRawBufferPointer(rebasing: all[0..<head]), at: start) }
        if middle > 0 {
            try file.writeDirect(
                UnsafeRawBufferPointer(rebasing: all[head..<head + middle]), at: start + Int64(head))
        }
        if head + middle < count {
            try file.writeNow(
                UnsafeRawBufferPointer(rebasing: all[(head + middle)...]), at: start + Int64(head + middle))
        }
    }
}
