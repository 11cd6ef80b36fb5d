import AsyncHTTPClient
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A plain-http request through an HTTP proxy, forwarded as curl and wget forward it: sent to the
/// proxy with the target's absolute URL as its request target (`GET http://host/file HTTP/1.1`),
/// the proxy's credentials in `Proxy-Authorization`, over a TCP connection of its own that closes
/// with the answer. The HTTP client Haul uses for everything else would open a `CONNECT` tunnel to
/// port 80, which many proxies refuse (they allow `CONNECT` to port 443 only).
enum ProxyForwarding {
    /// Sends `request` for `url` through `proxy` and gives `consume` the answer; the connection
    /// closes when `consume` returns. A proxy that asks for credentials (407) throws
    /// `HTTPClientError.proxyAuthenticationRequired`, as for a tunnel.
    static func execute<Result>(
        _ request: HTTPClientRequest, url: DownloadURL, through proxy: Proxy, connectTimeout: Duration,
        _ consume: (HTTPClientResponse) async -> Result
    ) async throws -> Result {
        let parts = ForwardedParts()
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(TimeAmount(connectTimeout))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            // The answer is read as fast as its reader takes it, not faster.
            .channelOption(.autoRead, value: false)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(ForwardedPartsHandler(parts: parts))
                }
            }
            .connect(host: proxy.host, port: proxy.port).get()
        parts.attach(channel)
        do {
            var head = HTTPRequestHead(
                version: .http1_1, method: .GET, uri: absoluteForm(url), headers: request.headers)
            if !head.headers.contains(name: "host") {
                let host = url.url.host ?? ""
                let shown = host.contains(":") ? "[\(host)]" : host
                head.headers.add(name: "Host", value: url.url.port.map { "\(shown):\($0)" } ?? shown)
            }
            if let credentials = proxy.credentials {
                head.headers.replaceOrAdd(name: "Proxy-Authorization", value: credentials.authorization)
            }
            head.headers.replaceOrAdd(name: "Connection", value: "close")
            // A proxy may answer (a 407, say) and close before the request is all written: a failed
            // write is not the outcome, the answer read next is (or the closed connection).
            channel.write(HTTPClientRequestPart.head(head), promise: nil)
            try? await channel.writeAndFlush(HTTPClientRequestPart.end(nil))
            guard case .head(let responseHead) = try await parts.next() else {
                throw HTTPClientError.remoteConnectionClosed
            }
            if responseHead.status == .proxyAuthenticationRequired {
                throw HTTPClientError.proxyAuthenticationRequired
            }
            let response = HTTPClientResponse(
                version: responseHead.version, status: responseHead.status, headers: responseHead.headers,
                body: .stream(ForwardedBody(parts: parts)))
            let result = await consume(response)
            try? await channel.close()
            return result
        } catch {
            try? await channel.close()
            throw error
        }
    }
}

extension ProxyForwarding {
    /// The request target a proxy is sent: the URL without user information or fragment.
    static func absoluteForm(_ url: DownloadURL) -> String {
        guard var components = URLComponents(url: url.url, resolvingAgainstBaseURL: false) else { return url.string }
        components.user = nil
        components.password = nil
        components.fragment = nil
        return components.string ?? url.string
    }
}

/// The parts of one forwarded answer, handed from the channel to the task reading them. The channel
/// reads only while that task waits, so a slow disk slows the transfer instead of filling memory.
final class ForwardedParts: Sendable {
    private struct State {
        var parts: [HTTPClientResponsePart] = []
        var ended = false
        var failure: (any Error)?
        var waiter: CheckedContinuation<HTTPClientResponsePart?, any Error>?
        var channel: (any Channel)?
    }

    private let state = Mutex(State())

    func attach(_ channel: any Channel) { state.withLock { $0.channel = channel } }

    /// The next part; `nil` once the connection has closed. Cancelling the waiting task closes it.
    func next() async throws -> HTTPClientResponsePart? {
        let channel = state.withLock { $0.channel }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                let ready = state.withLock { state -> Result<HTTPClientResponsePart?, any Error>? in
                    if !state.parts.isEmpty { return .success(state.parts.removeFirst()) }
                    if let failure = state.failure { return .failure(failure) }
                    if state.ended { return .success(nil) }
                    state.waiter = continuation
                    return nil
                }
                if let ready { continuation.resume(with: ready) } else { channel?.read() }
            }
        } onCancel: {
            channel?.close(promise: nil)
        }
    }

    /// Whether the reader waits and nothing is there for it: a read that decoded no whole part (a
    /// head or a chunk split across packets) must be followed by another.
    var isStarving: Bool { state.withLock { $0.waiter != nil && $0.parts.isEmpty && !$0.ended } }

    /// A part arrived (on the channel's event loop).
    func received(_ part: HTTPClientResponsePart) {
        let waiter = state.withLock { state -> CheckedContinuation<HTTPClientResponsePart?, any Error>? in
            guard let waiter = state.waiter else {
                state.parts.append(part)
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.resume(returning: part)
    }

    /// The connection failed, or closed (`error` is `nil`).
    func ended(_ error: (any Error)?) {
        let waiter = state.withLock { state -> CheckedContinuation<HTTPClientResponsePart?, any Error>? in
            state.ended = true
            if state.failure == nil { state.failure = error }
            defer { state.waiter = nil }
            return state.waiter
        }
        if let error { waiter?.resume(throwing: error) } else { waiter?.resume(returning: nil) }
    }
}

/// Feeds the parts the channel decodes to ``ForwardedParts``.
final class ForwardedPartsHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart

    private let parts: ForwardedParts

    init(parts: ForwardedParts) { self.parts = parts }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        parts.received(unwrapInboundIn(data))
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if parts.isStarving { context.read() }
        context.fireChannelReadComplete()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        parts.ended(error)
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        parts.ended(nil)
        context.fireChannelInactive()
    }
}

/// The body of a forwarded answer: its bytes up to the end of the message. A connection that closes
/// before the end is an error, never a short body taken for the whole.
struct ForwardedBody: AsyncSequence, Sendable {
    typealias Element = ByteBuffer

    let parts: ForwardedParts

    struct AsyncIterator: AsyncIteratorProtocol {
        let parts: ForwardedParts
        var done = false

        mutating func next() async throws -> ByteBuffer? {
            while !done {
                switch try await parts.next() {
                case .body(let bytes): return bytes
                case .end: done = true
                case .head: continue
                case nil: throw HTTPClientError.remoteConnectionClosed
                }
            }
            return nil
        }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(parts: parts) }
}
