import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Sends the requests of the small-answer shortcut (``WholeAnswer``) over kept-alive HTTP/1.1
/// connections of its own, and hands each answer over whole: its head with a body read to its end
/// on the connection's event loop, in one piece. A list of small files from one server then costs
/// one request and one hand-over per file, where Haul's general client streams every body through
/// a request object, a pool and an asynchronous sequence.
///
/// It takes only what the shortcut can use:
/// - a request through a proxy, over https when the TLS trust cannot be loaded, or to an origin
///   that already has ``connectionsPerOrigin`` connections of this transport open and none of them
///   idle, is not sent: ``send(_:receive:)`` throws ``NotTaken``, and the shortcut sends it through
///   Haul's general client (``fallback``);
/// - a body longer than ``bodyLimit`` is not read: its connection is closed, and the body the
///   answer carries fails when read (the shortcut declines such an answer before it reads it);
/// - an answer that has not come whole ``stalls``' timeout after its request was sent is given up
///   on: its connection is closed and the exchange fails with ``StalledAnswer``, which is not sent
///   again;
/// - a connection is used again only after an answer read to its end that lets it stay open; when
///   one that served an earlier request fails before any byte of its answer came (a server may
///   close an idle connection as a request goes out), the request goes once more, over a new
///   connection;
/// - idle connections close after ``idleTimeout``, and all of them on ``shutdown()``.
///
/// The checks of every answer stay the shortcut's: status, lengths, validators, coding, digests.
final class WholeAnswerTransport: DownloadTransport {
    /// One origin's connections: those waiting for a request, and how many are open in all.
    private struct Pool {
        var idle: [Channel] = []
        var open = 0
    }

    private struct State {
        var pools: [Origin: Pool] = [:]
        var shutDown = false
    }

    /// Where a connection goes: scheme, host and port.
    private struct Origin: Hashable, Sendable {
        let secure: Bool
        let host: String
        let port: Int
    }

    /// A request this transport does not take: the caller sends it another way.
    struct NotTaken: Error, CustomStringConvertible {
        var description: String { "the request is not one the shortcut's connections take" }
    }

    /// The transport that judges the failures this one does not know, and that the shortcut sends
    /// through what this one does not take.
    let fallback: any DownloadTransport
    /// Gives up on answers that do not come whole in time.
    let stalls: StallWatch
    /// The longest body read whole; a longer one is not read.
    let bodyLimit: Int
    /// The most connections of this transport open to one origin at once: the general client's
    /// share of ``DownloaderConfiguration/connectionsPerHost`` for one connection of a download.
    let connectionsPerOrigin: Int
    /// How long a connection waits for its next request before it closes.
    let idleTimeout: TimeAmount
    private let configuration: DownloaderConfiguration
    /// The TLS context of https connections, made with the first (`nil` inside: the trust the
    /// configuration names cannot be loaded, and https requests are not taken: the general client
    /// says why).
    private let tls = Mutex<NIOSSLContext??>(nil)
    private let group: any EventLoopGroup
    private let state = Mutex(State())

    /// A transport for requests of downloaders with `configuration`, whose answers are read whole up
    /// to `bodyLimit` bytes within the stall timeout (``DownloaderConfiguration/Timeouts/stall``) on
    /// `clock`.
    init(
        configuration: DownloaderConfiguration, fallback: any DownloadTransport, bodyLimit: Int,
        clock: TransferClock, idleTimeout: TimeAmount = .seconds(60)
    ) {
        self.configuration = configuration
        self.fallback = fallback
        stalls = StallWatch(timeout: configuration.timeouts.stall, clock: clock)
        self.bodyLimit = bodyLimit
        self.idleTimeout = idleTimeout
        let connections = max(1, configuration.segmentation.connections)
        connectionsPerOrigin =
            configuration.connectionsPerHost.map { max(1, ($0 + connections - 1) / connections) } ?? 8
        group = MultiThreadedEventLoopGroup.singleton
    }

    /// The context of https connections, made the first time: the system's trust and the
    /// configuration's files, and HTTP/1.1 by ALPN.
    private var tlsContext: NIOSSLContext? {
        tls.withLock { made in
            if let made { return made }
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.additionalTrustRoots = configuration.tls.trustedCertificateFiles.map { .file($0) }
            tls.applicationProtocols = ["http/1.1"]
            // As the general client's: Haul checks lengths itself, and a closed connection is not reused.
            tls.shutdownTimeout = .zero
            let context = try? NIOSSLContext(configuration: tls)
            made = .some(context)
            return context
        }
    }

    /// How many connections this transport holds open to `url`'s origin, busy or idle.
    func openConnections(to url: URL) -> Int {
        guard let origin = Self.origin(of: url) else { return 0 }
        return state.withLock { $0.pools[origin]?.open ?? 0 }
    }

    func send<Result>(
        _ request: TransportRequest, receive: (TransportResponse) async -> Result
    ) async throws -> Result {
        guard configuration.proxy.proxy(for: request.url) == nil, let origin = Self.origin(of: request.url),
            !origin.secure || tlsContext != nil
        else { throw NotTaken() }
        let head = Self.head(of: request, origin: origin)
        guard let (channel, reused) = try await connection(to: origin, fresh: false) else { throw NotTaken() }
        let reply: WholeReply
        do {
            reply = try await exchange(head, over: channel, of: origin)
        } catch {
            if Task.isCancelled { throw CancellationError() }
            // A connection that served a request before may have been closed by its server
            // meanwhile: when nothing of the answer came, the request goes once more, over a new one.
            // A stalled answer is not asked for again.
            guard reused, !(error is StalledAnswer), !((error as? LostConnection)?.answered ?? false) else {
                throw error
            }
            guard let (fresh, _) = try await connection(to: origin, fresh: true) else { throw NotTaken() }
            reply = try await exchange(head, over: fresh, of: origin)
        }
        return await receive(
            TransportResponse(
                status: Int(reply.head.status.code), fields: reply.head.headers, httpVersion: 1,
                body: TransportBody(whole: reply.body, cut: reply.cut)))
    }

    func failure(of error: any Error, sending request: TransportRequest) -> TransportFailure {
        if error is CancellationError { return .cancelled }
        let host = request.url.host ?? request.url.absoluteString
        if case ChannelError.connectTimeout = error {
            return .retryable(HaulError(.timedOut, "connecting to \(host) timed out", underlying: error))
        }
        if error is StalledAnswer {
            return .retryable(HaulError(.timedOut, "the answer from \(host) stalled", underlying: error))
        }
        if error is LostConnection || error is ChannelError || error is HTTPParserError
            || error is WholeReply.TooLong
        {
            return .retryable(HaulError(.network, "transfer from \(host) failed: \(error)", underlying: error))
        }
        return fallback.failure(of: error, sending: request)
    }

    /// Closes every idle connection; busy ones close as their answers end.
    func shutdown() async throws {
        stalls.stop()
        let idle = state.withLock { state -> [Channel] in
            state.shutDown = true
            defer { for origin in state.pools.keys { state.pools[origin]?.idle = [] } }
            return state.pools.values.flatMap(\.idle)
        }
        for channel in idle { try? await channel.close() }
    }

    // MARK: Connections

    /// An idle connection to `origin` (`reused`) unless `fresh`, else a new one; `nil` when
    /// `origin` has ``connectionsPerOrigin`` open already, or the transport is shut down.
    private func connection(to origin: Origin, fresh: Bool) async throws -> (Channel, reused: Bool)? {
        enum Pick {
            case idle(Channel)
            case connect
            case none
        }
        let pick = state.withLock { state -> Pick in
            guard !state.shutDown else { return .none }
            var pool = state.pools[origin, default: Pool()]
            defer { state.pools[origin] = pool }
            while !fresh, let channel = pool.idle.popLast() {
                if channel.isActive { return .idle(channel) }
            }
            guard pool.open < connectionsPerOrigin else { return .none }
            pool.open += 1
            return .connect
        }
        switch pick {
        case .idle(let channel): return (channel, true)
        case .none: return nil
        case .connect: break
        }
        do {
            return (try await connect(to: origin), false)
        } catch {
            release(origin)
            throw error
        }
    }

    /// Opens a connection to `origin`: TCP, TLS for https (the certificate checked against the host,
    /// or its address when the URL names one), and HTTP/1.1. A cancelled task stops waiting at once;
    /// a connection made after that is closed.
    private func connect(to origin: Origin) async throws -> Channel {
        let tls = origin.secure ? tlsContext : nil
        let serverName = IPAddress(origin.host) == nil ? origin.host : nil
        let idleTimeout = self.idleTimeout
        let connecting = ClientBootstrap(group: group)
            .connectTimeout(TimeAmount(configuration.timeouts.connect))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    if let tls {
                        try pipeline.addHandler(NIOSSLClientHandler(context: tls, serverHostname: serverName))
                    }
                    try pipeline.addHTTPClientHandlers()
                    try pipeline.addHandler(WholeExchangeHandler(idleTimeout: idleTimeout))
                }
            }
            .connect(host: origin.host, port: origin.port)
        let made = connecting.eventLoop.makePromise(of: Channel.self)
        connecting.cascade(to: made)
        // Given up on: closed as it comes.
        connecting.whenSuccess { channel in made.futureResult.whenFailure { _ in channel.close(promise: nil) } }
        let channel = try await withTaskCancellationHandler {
            try await made.futureResult.get()
        } onCancel: {
            made.fail(CancellationError())
        }
        // However the connection ends, its place is given back and it leaves the idle ones.
        channel.closeFuture.whenComplete { [weak self] _ in self?.closed(channel, of: origin) }
        return channel
    }

    /// Sends `head` over `channel` and waits for its whole answer; the channel goes back to the
    /// idle ones when the answer let it stay open. A cancelled task closes the channel, as does an
    /// answer not whole within the stall timeout.
    private func exchange(_ head: HTTPRequestHead, over channel: Channel, of origin: Origin) async throws -> WholeReply
    {
        let promise = channel.eventLoop.makePromise(of: WholeReply.self)
        let exchange = WholeExchange(head: head, limit: bodyLimit, reply: promise)
        let answer = promise.futureResult
        // The request goes to the event loop before the watch can: a stall, however soon, finds its
        // exchange under way.
        channel.writeAndFlush(exchange).cascadeFailure(to: promise)
        let ticket = stalls.begin {
            channel.triggerUserOutboundEvent(WholeExchangeHandler.Stalled(answer: answer), promise: nil)
        }
        defer { stalls.end(ticket) }
        let reply: WholeReply
        do {
            reply = try await withTaskCancellationHandler {
                try await promise.futureResult.get()
            } onCancel: {
                channel.close(promise: nil)
            }
        } catch {
            channel.close(promise: nil)
            throw Task.isCancelled ? CancellationError() : error
        }
        if Task.isCancelled {
            channel.close(promise: nil)
            throw CancellationError()
        }
        if reply.reusable { idle(channel, of: origin) } else { channel.close(promise: nil) }
        return reply
    }

    /// Puts `channel` back among `origin`'s idle connections (closing it once the transport is
    /// shut down).
    private func idle(_ channel: Channel, of origin: Origin) {
        let kept = state.withLock { state -> Bool in
            guard !state.shutDown, channel.isActive else { return false }
            state.pools[origin, default: Pool()].idle.append(channel)
            return true
        }
        if !kept { channel.close(promise: nil) }
    }

    /// Forgets a closed connection.
    private func closed(_ channel: Channel, of origin: Origin) {
        state.withLock { state in
            guard var pool = state.pools[origin] else { return }
            pool.idle.removeAll { $0 === channel }
            pool.open = max(0, pool.open - 1)
            state.pools[origin] = pool.open == 0 ? nil : pool
        }
    }

    /// Gives back the place of a connection that could not be opened.
    private func release(_ origin: Origin) {
        state.withLock { state in
            guard var pool = state.pools[origin] else { return }
            pool.open = max(0, pool.open - 1)
            state.pools[origin] = pool.open == 0 && pool.idle.isEmpty ? nil : pool
        }
    }

    // MARK: Requests

    /// The origin of an http or https URL with a host.
    private static func origin(of url: URL) -> Origin? {
        guard let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https", var host = url.host,
            !host.isEmpty
        else { return nil }
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        let secure = scheme == "https"
        return Origin(secure: secure, host: host, port: url.port ?? (secure ? 443 : 80))
    }

    /// The `GET` of `request`: its path and query as the URL has them, its headers, and a `Host`
    /// naming the origin (with its port unless it is the scheme's own) unless it has one.
    private static func head(of request: TransportRequest, origin: Origin) -> HTTPRequestHead {
        var headers = request.fields
        if !headers.contains(name: "host") {
            let host = origin.host.contains(":") ? "[\(origin.host)]" : origin.host
            let defaultPort = origin.secure ? 443 : 80
            headers.add(name: "Host", value: origin.port == defaultPort ? host : "\(host):\(origin.port)")
        }
        return HTTPRequestHead(version: .http1_1, method: .GET, uri: request.url.uri, headers: headers)
    }
}

/// An answer did not come whole within the stall timeout.
struct StalledAnswer: Error, CustomStringConvertible {
    var description: String { "the answer did not come whole within the stall timeout" }
}

/// A connection ended before its answer did; `answered`: some of the answer had come.
struct LostConnection: Error, CustomStringConvertible {
    let answered: Bool
    var description: String { "the connection closed before the answer ended" }
}

/// An answer read whole: its head, its body, and whether the connection may serve another request.
struct WholeReply: Sendable {
    /// A body longer than the limit: not read.
    struct TooLong: Error, CustomStringConvertible {
        var description: String { "the answer's body is longer than what is read whole" }
    }

    let head: HTTPResponseHead
    let body: ByteBuffer
    /// The body was longer than the limit: `body` is not all of it, and the connection is closed.
    let cut: Bool
    let reusable: Bool
}

/// A request for ``WholeExchangeHandler``: its head, how much of a body it reads, and where the
/// answer goes.
struct WholeExchange: Sendable {
    let head: HTTPRequestHead
    let limit: Int
    let reply: EventLoopPromise<WholeReply>
}

/// Sends one request at a time over its connection and reads the answer whole, on the connection's
/// event loop. Anything the server sends outside an exchange, or an error, closes the connection.
final class WholeExchangeHandler: ChannelDuplexHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = WholeExchange
    typealias OutboundOut = HTTPClientRequestPart

    private enum State {
        case idle
        case waiting(WholeExchange)
        /// The answer's head came; `body` holds what came of its body, of which `length` bytes (the
        /// answer's `Content-Length`) are to come in all, when told.
        case reading(WholeExchange, HTTPResponseHead, body: ByteBuffer, length: Int?)
        /// The connection is closing: the body passed the limit (the answer was handed over), or
        /// the exchange failed.
        case closing
    }

    /// The exchange whose answer is `answer` stalled: it fails, and the connection closes, unless
    /// it has ended.
    struct Stalled {
        let answer: EventLoopFuture<WholeReply>
    }

    private var state = State.idle
    private let idleTimeout: TimeAmount
    private var idleClose: Scheduled<Void>?

    init(idleTimeout: TimeAmount) {
        self.idleTimeout = idleTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { closeWhenIdle(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        closeWhenIdle(context)
        context.fireChannelActive()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let exchange = unwrapOutboundIn(data)
        guard case .idle = state else {
            exchange.reply.fail(LostConnection(answered: false))
            promise?.fail(LostConnection(answered: false))
            return
        }
        idleClose?.cancel()
        idleClose = nil
        state = .waiting(exchange)
        context.write(wrapOutboundOut(.head(exchange.head)), promise: nil)
        context.write(wrapOutboundOut(.end(nil)), promise: promise)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch (state, unwrapInboundIn(data)) {
        case (.waiting(let exchange), .head(let head)):
            let length = head.headers.first(name: "content-length").flatMap { Int($0) }
            if let length, length > exchange.limit { return cut(context, exchange, head, ByteBuffer()) }
            state = .reading(exchange, head, body: ByteBuffer(), length: length.map { max(0, $0) })
        case (.reading(let exchange, let head, var body, let length), .body(var chunk)):
            guard body.readableBytes + chunk.readableBytes <= exchange.limit else {
                return cut(context, exchange, head, body)
            }
            state = .idle
            if body.readableBytes == 0 && chunk.readableBytes == length {
                // The whole body in one piece: kept as it came, not copied.
                body = chunk
            } else {
                if body.capacity == 0 { body = context.channel.allocator.buffer(capacity: length ?? 0) }
                body.writeBuffer(&chunk)
            }
            state = .reading(exchange, head, body: body, length: length)
        case (.reading(let exchange, let head, let body, _), .end):
            state = .idle
            // A switch of protocols leaves the connection to another protocol.
            let reusable = head.isKeepAlive && head.status != .switchingProtocols && context.channel.isActive
            exchange.reply.succeed(WholeReply(head: head, body: body, cut: false, reusable: reusable))
            if reusable { closeWhenIdle(context) } else { context.close(promise: nil) }
        case (.closing, _):
            break
        default:
            // An answer nobody asked for, or parts out of order.
            fail(context, LostConnection(answered: true))
        }
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let stalled = event as? Stalled else {
            return context.triggerUserOutboundEvent(event, promise: promise)
        }
        promise?.succeed()
        switch state {
        case .waiting(let exchange), .reading(let exchange, _, _, _):
            if exchange.reply.futureResult === stalled.answer { fail(context, StalledAnswer()) }
        case .idle, .closing:
            break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        fail(context, LostConnection(answered: isAnswering))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        fail(context, isAnswering ? LostConnection(answered: true) : error)
    }

    /// Whether part of the answer came.
    private var isAnswering: Bool {
        if case .reading = state { return true }
        return false
    }

    /// Hands the answer over with the body read so far, marked cut, and closes the connection.
    private func cut(
        _ context: ChannelHandlerContext, _ exchange: WholeExchange, _ head: HTTPResponseHead, _ body: ByteBuffer
    ) {
        state = .closing
        exchange.reply.succeed(WholeReply(head: head, body: body, cut: true, reusable: false))
        context.close(promise: nil)
    }

    /// Fails the exchange under way, if any, with `error`, and closes the connection.
    private func fail(_ context: ChannelHandlerContext, _ error: any Error) {
        let previous = state
        state = .closing
        idleClose?.cancel()
        idleClose = nil
        switch previous {
        case .waiting(let exchange), .reading(let exchange, _, _, _): exchange.reply.fail(error)
        case .idle, .closing: break
        }
        context.close(promise: nil)
    }

    /// Closes the connection unless a request comes within the idle timeout.
    private func closeWhenIdle(_ context: ChannelHandlerContext) {
        idleClose?.cancel()
        let channel = context.channel
        idleClose = context.eventLoop.scheduleTask(in: idleTimeout) { channel.close(promise: nil) }
    }
}

extension URL {
    /// The request target of the URL: its path as written (`/` when empty) and its query.
    var uri: String {
        let path = URLComponents(url: self, resolvingAgainstBaseURL: true)?.percentEncodedPath ?? path
        var target = path.isEmpty ? "/" : path
        if let query { target += "?" + query }
        return target
    }
}
