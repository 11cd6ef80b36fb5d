import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import Haul

/// The handler of the shortcut's connections gives up on the exchange a stall names, and on no
/// other: the stall of an exchange that ended may come after the connection took the next request.
@Suite("A stall fails only its own exchange")
struct WholeExchangeHandlerTests {
    static func exchange(_ channel: EmbeddedChannel, _ path: String) -> WholeExchange {
        WholeExchange(
            head: HTTPRequestHead(version: .http1_1, method: .GET, uri: path), limit: 1024,
            reply: channel.eventLoop.makePromise())
    }

    /// The server's whole answer with `body`, kept alive.
    static func answer(_ channel: EmbeddedChannel, _ body: String) throws {
        let headers = HTTPHeaders([("Content-Length", "\(body.utf8.count)")])
        try channel.writeInbound(
            HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers)))
        try channel.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: body)))
        try channel.writeInbound(HTTPClientResponsePart.end(nil))
    }

    static func stall(_ channel: EmbeddedChannel, _ exchange: WholeExchange) {
        channel.triggerUserOutboundEvent(
            WholeExchangeHandler.Stalled(answer: exchange.reply.futureResult), promise: nil)
    }

    @Test func aLateStallOfAnEndedExchangeLeavesTheNextAloneAndAStallUnderWayClosesTheConnection() throws {
        let channel = EmbeddedChannel(handler: WholeExchangeHandler(idleTimeout: .seconds(60)))
        defer { _ = try? channel.finish() }
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()

        let first = Self.exchange(channel, "/a")
        try channel.writeOutbound(first)
        try Self.answer(channel, "ab")
        let reply = try first.reply.futureResult.wait()
        #expect(reply.body == ByteBuffer(string: "ab") && reply.reusable)

        let second = Self.exchange(channel, "/b")
        try channel.writeOutbound(second)
        Self.stall(channel, first)
        #expect(channel.isActive)
        try Self.answer(channel, "cd")
        #expect(try second.reply.futureResult.wait().body == ByteBuffer(string: "cd"))
        // Between exchanges a stall finds nothing to fail.
        Self.stall(channel, second)
        #expect(channel.isActive)

        let third = Self.exchange(channel, "/c")
        try channel.writeOutbound(third)
        Self.stall(channel, third)
        #expect(throws: StalledAnswer.self) { try third.reply.futureResult.wait() }
        #expect(!channel.isActive)
    }
}
