import Testing

@testable import Haul

struct SegmentTableTests {
    private func table(total: Int64, written: Int64 = 0, minimumSplit: Int64 = 1 << 20) -> SegmentTable {
        SegmentTable(
            [SegmentTable.Segment(start: 0, end: total, written: written, durable: 0, owner: nil)],
            minimumSplit: minimumSplit)
    }

    private func ranges(_ table: SegmentTable) -> [Range<Int64>] { table.segments.map { $0.start..<$0.end } }

    @Test func aFreshDownloadIsCutIntoEqualRangesOn64KiBBoundaries() {
        let mebibyte: Int64 = 1 << 20
        let total = 9 * mebibyte + 123
        let table = table(total: total)
        table.split(into: 3)
        #expect(ranges(table) == [0..<3 * mebibyte, 3 * mebibyte..<6 * mebibyte, 6 * mebibyte..<total])
        // Each connection claims its own range, in order, before any range is halved.
        let claims = (0..<3).compactMap { table.claim(worker: $0) }
        #expect(claims.map(\.from) == [0, 3 * mebibyte, 6 * mebibyte])
        #expect(claims.map(\.to) == [3 * mebibyte, 6 * mebibyte, total])
        #expect(table.segments.map(\.owner) == [0, 1, 2])
    }

    @Test func theSplitStartsAtTheBytesAlreadyWrittenAndKeepsToTheMinimum() {
        let mebibyte: Int64 = 1 << 20
        // 1 MiB written in order (a download that began on one connection), 3 MiB to go, 1 MiB minimum:
        // eight connections asked for, three ranges made.
        let table = table(total: 4 * mebibyte, written: mebibyte)
        table.split(into: 8)
        #expect(ranges(table) == [0..<2 * mebibyte, 2 * mebibyte..<3 * mebibyte, 3 * mebibyte..<4 * mebibyte])
        #expect(table.segments.map(\.written) == [mebibyte, 0, 0])
        // Too little left to split at all.
        let small = self.table(total: mebibyte + 65_536)
        small.split(into: 4)
        #expect(ranges(small) == [0..<mebibyte + 65_536])
    }

    @Test func aMinimumBelowTheBoundaryCountsAsOneBoundary() throws {
        // 256 KiB with a minimum of 1 byte, 64 connections asked for: four ranges of 64 KiB, none empty.
        let table = table(total: 262_144, minimumSplit: 1)
        table.split(into: 64)
        #expect(ranges(table) == [0..<65_536, 65_536..<131_072, 131_072..<196_608, 196_608..<262_144])
        // Halving what is left never cuts a range to nothing: 64 KiB is not split again.
        let claims = (0..<5).compactMap { table.claim(worker: $0) }
        #expect(claims.count == 4)
    }

    @Test func aRangeIsAskedForAsItStandsWhenItsRequestGoesOut() throws {
        let mebibyte: Int64 = 1 << 20
        let table = table(total: 8 * mebibyte)
        let first = try #require(table.claim(worker: 0))
        let second = try #require(table.claim(worker: 1))
        #expect((second.from, second.to) == (4 * mebibyte, 8 * mebibyte))
        // The first has fetched 1 MiB; a third connection takes half of the second's range, the largest
        // left, before the second's request went out.
        table.advance(first.index, to: mebibyte)
        let third = try #require(table.claim(worker: 2))
        #expect(third.from == 6 * mebibyte)
        #expect(
            table.current(second) == SegmentTable.Assignment(index: second.index, from: 4 * mebibyte, to: 6 * mebibyte))
        #expect(table.current(first)?.to == 4 * mebibyte)
        // A range taken over whole (its connection stalled) leaves nothing to ask for.
        let stalled = SegmentTable(
            [SegmentTable.Segment(start: 0, end: mebibyte, written: 0, durable: 0, owner: nil)],
            minimumSplit: mebibyte, stallTakeover: .zero)
        let claimed = try #require(stalled.claim(worker: 0))
        _ = try #require(stalled.claim(worker: 1))
        #expect(stalled.current(claimed) == nil)
    }
}
