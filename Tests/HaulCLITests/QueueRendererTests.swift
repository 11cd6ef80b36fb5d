import Foundation
import Haul
import Testing

@testable import HaulCLI

@Suite("The queue's progress on a terminal") struct QueueRendererTests {
    static func info(_ id: Int64, _ state: DownloadState, bytes: Int64, of total: Int64?) -> DownloadInfo {
        DownloadInfo(
            id: DownloadID(id),
            request: DownloadRequest(url: "http://127.0.0.1:9/f\(id)", destination: .directory("/tmp")),
            destination: nil, state: state, priority: .normal, bytes: bytes, totalBytes: total, bytesPerSecond: nil,
            secondsRemaining: nil, error: nil, createdAt: Date(), finishedAt: nil, hook: nil)
    }

    @Test func downloadsWithAllTheirBytesAreCountedAsFinishingOnTheTotalLine() {
        let downloads = [
            Self.info(1, .running, bytes: 10, of: 100),
            Self.info(2, .running, bytes: 100, of: 100),
            Self.info(3, .running, bytes: 5, of: nil),
            Self.info(4, .running, bytes: 64, of: 64),
            Self.info(5, .completed, bytes: 64, of: 64),
            Self.info(6, .queued, bytes: 0, of: nil),
        ]
        let lines = QueueRenderer.progressBlock(downloads, total: "total 1/6 done", columns: 200, rows: 24)
        #expect(lines.count == 3)
        #expect(lines[0].hasPrefix("f1 "))
        #expect(lines[1].hasPrefix("f3 "))
        #expect(lines[2] == "total 1/6 done  2 finishing")
    }

    @Test func theBlockNeverOutgrowsTheTerminal() {
        let downloads = (1...40).map { Self.info(Int64($0), .running, bytes: 1, of: 100) }
        let lines = QueueRenderer.progressBlock(downloads, total: "total 0/40 done", columns: 200, rows: 10)
        // Nine of the ten rows (the cursor is left on the next), so the cursor can climb to its top.
        #expect(lines.count == 9)
        #expect(lines[6].hasPrefix("f7 "))
        #expect(lines[7] == "… and 33 more")
        #expect(lines[8] == "total 0/40 done")
        // As many as fit are all shown.
        let few = QueueRenderer.progressBlock(Array(downloads.prefix(8)), total: "t", columns: 200, rows: 10)
        #expect(few.count == 9)
        #expect(few.dropLast().allSatisfy { !$0.hasPrefix("…") })
    }

    @Test func linesAreCutToTheTerminalsWidth() {
        let lines = QueueRenderer.progressBlock(
            [Self.info(1, .running, bytes: 1, of: 100)], total: String(repeating: "t", count: 50), columns: 20,
            rows: 24)
        #expect(lines.map(\.count) == [20, 20])
    }
}
