import HummingbirdCore
import HummingbirdWebSocket
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypesHTTP1

/// Hummingbird's HTTP/1 channel, with its WebSocket upgrade (aria2's `/jsonrpc`), and the daemon's
/// connection rules around it: every connection is admitted by the ``ConnectionLedger`` and
/// reports what it does there, and each request is read as HTTP/1.1 says before the router sees it.
struct GuardedHTTP1Channel: ServerChildChannel {
    let inner: HTTP1WebSocketUpgradeChannel
    let ledger: ConnectionLedger

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<HTTP1WebSocketUpgradeChannel.Value> {
        let admitted = ledger.admit(channel)
        if !admitted { logger.debug("connection refused: every connection is answering a request") }
        let ledger = self.ledger
        return channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.addHandler(ConnectionWatch(ledger: ledger, admitted: admitted))
        }.flatMap {
            inner.setup(channel: channel, logger: logger)
        }.flatMapThrowing { value in
            // Between the HTTP/1 decoder and what reads the request (the upgrade's handler, then
            // the conversion to HTTP types), where the request's version and target are still as
            // they were sent.
            let operations = channel.pipeline.syncOperations
            let upgrade = try operations.handler(
                type: NIOTypedHTTPServerUpgradeHandler<HTTP1WebSocketUpgradeChannel.UpgradeResult>.self)
            try operations.addHandler(RequestWatch(ledger: ledger), position: .before(upgrade))
            return value
        }
    }

    func handle(value: HTTP1WebSocketUpgradeChannel.Value, logger: Logger) async {
        await inner.handle(value: value, logger: logger)
    }

}

/// First in the pipeline: a connection refused at the door, the first bytes of a request, and the
/// connection's end.
final class ConnectionWatch: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let ledger: ConnectionLedger
    /// Whether the ledger took the connection in; one it refused gets a 503 and is closed.
    private let admitted: Bool
    /// Whether bytes of a request arrived since the last response ended.
    var receiving = false

    init(ledger: ConnectionLedger, admitted: Bool) {
        self.ledger = ledger
        self.admitted = admitted
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { refuseUnlessAdmitted(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        refuseUnlessAdmitted(context)
        context.fireChannelActive()
    }

    private func refuseUnlessAdmitted(_ context: ChannelHandlerContext) {
        guard !admitted else { return }
        let channel = context.channel
        context.writeAndFlush(NIOAny(ByteBuffer(string: Self.refusal))).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    /// All a refused connection gets.
    static let refusal =
        "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // A refused connection's request is never read.
        guard admitted else { return }
        if !receiving {
            receiving = true
            ledger.note(context.channel, .receiving)
        }
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        ledger.remove(context.channel)
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        ledger.remove(context.channel)
    }
}

/// Between the HTTP/1 decoder and the conversion to HTTP types: when a request is whole and its
/// response over, an event stream, a client that asked for the connection to close, and an
/// absolute-form target (RFC 9112 §3.2.2: its authority, not `Host`, names the server).
final class RequestWatch: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let ledger: ConnectionLedger
    /// Whether the client asked to close the connection after this response (HTTP/1.0 without
    /// keep-alive, or `Connection: close`).
    private var closesAfterResponse = false
    /// Whether the current request has arrived whole, and whether its response is over. A response
    /// may end before its request does (a refusal before the body is read): the connection counts
    /// as receiving until the request is whole, so the request's time limit still applies.
    private var requestDone = true
    private var responseDone = true
    /// Whether the connection became a WebSocket.
    private var upgraded = false

    init(ledger: ConnectionLedger) { self.ledger = ledger }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if upgraded { return context.fireChannelRead(data) }
        switch unwrapInboundIn(data) {
        case .head(var head):
            (requestDone, responseDone) = (false, false)
            closesAfterResponse = !head.isKeepAlive
            if let authority = Self.absoluteFormAuthority(head.uri) {
                head.headers.replaceOrAdd(name: "Host", value: authority)
            }
            context.fireChannelRead(wrapInboundOut(.head(head)))
        case .body:
            context.fireChannelRead(data)
        case .end:
            requestDone = true
            noteActivity(context)
            context.fireChannelRead(data)
        }
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if upgraded { return context.write(data, promise: promise) }
        switch unwrapOutboundIn(data) {
        case .head(var head):
            if head.status == .switchingProtocols {
                // A WebSocket from here on: it stays open as long as its client keeps it, and its
                // frames pass this handler unread.
                upgraded = true
                ledger.noteWebSocket(context.channel)
                return context.write(data, promise: promise)
            }
            if head.headers.first(name: "content-type")?.hasPrefix("text/event-stream") == true {
                ledger.noteEventStream(context.channel)
            }
            if closesAfterResponse { head.headers.replaceOrAdd(name: "Connection", value: "close") }
            context.write(wrapOutboundOut(.head(head)), promise: promise)
        case .body:
            context.write(data, promise: promise)
        case .end:
            responseDone = true
            noteActivity(context)
            guard closesAfterResponse else { return context.write(data, promise: promise) }
            let written = promise ?? context.eventLoop.makePromise()
            written.futureResult.whenComplete { [channel = context.channel] _ in channel.close(promise: nil) }
            context.writeAndFlush(data, promise: written)
        }
    }

    /// Tells the ledger what the connection does now the request or the response moved on.
    private func noteActivity(_ context: ChannelHandlerContext) {
        switch (requestDone, responseDone) {
        case (false, _):
            ledger.note(context.channel, .receiving)
        case (true, false):
            ledger.note(context.channel, .responding)
        case (true, true):
            // The next bytes begin the next request.
            if let watch = try? context.pipeline.syncOperations.handler(type: ConnectionWatch.self) {
                watch.receiving = false
            }
            ledger.note(context.channel, .idle)
        }
    }

    /// The authority of an absolute-form request target (`http://host:port/path`), lower case.
    static func absoluteFormAuthority(_ target: String) -> String? {
        guard let schemeEnd = target.range(of: "://"), !target.hasPrefix("/") else { return nil }
        let rest = target[schemeEnd.upperBound...]
        let authority = rest.prefix { !"/?#".contains($0) }
        // User information never names a server.
        let host = authority.split(separator: "@").last.map(String.init) ?? ""
        return host.isEmpty ? nil : host.lowercased()
    }
}
