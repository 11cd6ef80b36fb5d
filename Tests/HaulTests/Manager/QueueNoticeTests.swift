import Testing

@testable import Haul

/// A commit's notice as the text `NOTIFY` carries: it reads back as written, split into payloads
/// that each fit, and a payload that is not one reads as nothing.
struct QueueNoticeTests {
    @Test func aNoticeReadsBackFromItsPayloads() throws {
        let notice = QueueNotice(
            sender: "host.12.1", added: (1...700).map { DownloadID($0) }, changed: [DownloadID(9_000_000_000_000)],
            removed: [DownloadID(3), DownloadID(4)])
        let payloads = notice.payloads
        // 700 added: three payloads of at most 300, then one changed and one removed.
        #expect(payloads.count == 5)
        #expect(payloads.allSatisfy { $0.utf8.count < 8_000 })
        var read = QueueNotice(sender: "host.12.1")
        for payload in payloads {
            let part = try #require(QueueNotice(payload: payload))
            #expect(part.sender == "host.12.1")
            read.added += part.added
            read.changed += part.changed
            read.removed += part.removed
        }
        #expect(read == notice)
        #expect(QueueNotice(sender: "x").payloads.isEmpty)
        // A sender of more than one line is not told.
        #expect(QueueNotice(payload: QueueNotice(sender: "a\nb", removed: [DownloadID(1)]).payloads[0])?.sender == "")
    }

    @Test(arguments: ["", "no lines", "w\nx:1", "w\na:1 two", "w\nc:-4", "w\nr1 2"])
    func aPayloadThatIsNotANoticeReadsAsNothing(_ payload: String) {
        #expect(QueueNotice(payload: payload) == nil)
    }
}
