import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import Haul

@Suite("HTTP/2 body parts joined per read burst")
struct HTTP2BodyCoalescerTests {
    /// A channel with the coalescer and what it passes on, in order.
    final class Harness {
        let channel = EmbeddedChannel(handler: HTTP2BodyCoalescer())

        /// Delivers a part without ending the read burst, as a stream channel delivers each queued frame.
        func send(_ part: HTTPClientResponsePart) { channel.pipeline.fireChannelRead(part) }
        func sendBody(_ bytes: some Sequence<UInt8>) { send(.body(ByteBuffer(bytes: Array(bytes)))) }

        /// The parts passed on so far: bodies as byte arrays, heads and ends by name.
        func passedOn() throws -> [Passed] {
            var parts: [Passed] = []
            while let part = try channel.readInbound(as: HTTPClientResponsePart.self) {
                switch part {
                case .head: parts.append(.head)
                case .body(let buffer): parts.append(.body(Array(buffer.readableBytesView)))
                case .end: parts.append(.end)
                }
            }
            return parts
        }
    }

    enum Passed: Equatable {
        case head, body([UInt8]), end
    }

    static func pattern(_ count: Int, from start: Int) -> [UInt8] {
        (start..<start + count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) }
    }

    @Test("a burst of small parts is passed on as blocks of the block size, in order, with nothing lost")
    func burstBecomesBlocks() throws {
        let harness = Harness()
        let frame = 8 * 1024
        let frames = 100
        harness.send(.head(HTTPResponseHead(version: .http2, status: .partialContent)))
        for index in 0..<frames { harness.sendBody(Self.pattern(frame, from: index * frame)) }
        // Only whole blocks have gone on before the burst ends.
        let duringBurst = try harness.passedOn()
        #expect(duringBurst.count == 1 + (frames * frame) / HTTP2BodyCoalescer.blockSize)
        harness.channel.pipeline.fireChannelReadComplete()
        let parts = duringBurst + (try harness.passedOn())
        #expect(parts.first == .head)
        let bodies = parts.dropFirst().compactMap { part -> [UInt8]? in
            if case .body(let bytes) = part { bytes } else { nil }
        }
        #expect(bodies.map(\.count) == [262_144, 262_144, 262_144, 32_768])
        #expect(bodies.flatMap { $0 } == Self.pattern(frames * frame, from: 0))
    }

    @Test("a burst of one part goes on as it came")
    func singlePartPassesThrough() throws {
        let harness = Harness()
        harness.sendBody(Self.pattern(5000, from: 7))
        #expect(try harness.passedOn().isEmpty)
        harness.channel.pipeline.fireChannelReadComplete()
        #expect(try harness.passedOn() == [.body(Self.pattern(5000, from: 7))])
    }

    @Test("the end of the body, an error and the stream's close each pass what is pending on first")
    func pendingGoesOnBeforeEndErrorAndClose() throws {
        let harness = Harness()
        harness.sendBody([1, 2, 3])
        harness.sendBody([4])
        harness.send(.end(nil))
        #expect(try harness.passedOn() == [.body([1, 2, 3, 4]), .end])

        struct Reset: Error {}
        harness.sendBody([5, 6])
        harness.channel.pipeline.fireErrorCaught(Reset())
        #expect(try harness.passedOn() == [.body([5, 6])])
        #expect(throws: Reset.self) { try harness.channel.throwIfErrorCaught() }

        harness.sendBody([7])
        harness.sendBody([8])
        harness.channel.pipeline.fireChannelInactive()
        #expect(try harness.passedOn() == [.body([7, 8])])
    }
}
