import NIOCore
import NIOPosix
import Synchronization

/// An in-process proxy on 127.0.0.1 for tests: an HTTP proxy (`CONNECT` tunnels, and requests for
/// `http://` URLs forwarded with a `Via` header) or a SOCKS5 proxy. It records what each client asked
/// for, so a test can check that requests went through it, with which credentials, and whether names
/// were resolved by the client or by the proxy.
public final class TestProxy: Sendable {
    /// What the proxy speaks.
    public enum Kind: Sendable {
        case http, socks5
    }

    /// One request a client made of the proxy.
    public struct Seen: Sendable {
        /// `CONNECT`, `GET` (a request forwarded to its absolute URL), or `SOCKS`.
        public let method: String
        /// `host:port` the client asked for, or the absolute URL of a forwarded request.
        public let target: String
        /// For SOCKS: `domain` when the client sent a name (the proxy resolves it), `ipv4` or `ipv6`.
        public let addressType: String?
        /// The request's header lines (HTTP proxy only), as sent to the proxy.
        public let headers: [(name: String, value: String)]

        /// The first value of header `name`, case-insensitively.
        public func header(_ name: String) -> String? {
            headers.first { $0.name.lowercased() == name.lowercased() }?.value
        }
    }

    /// The port it listens on.
    public let port: Int
    /// What it speaks.
    public let kind: Kind
    /// `Proxy-Authorization` value an HTTP proxy requires (407 otherwise).
    private let requiredAuthorization: String?
    private let seenRequests = Mutex<[Seen]>([])

    private init(port: Int, kind: Kind, requiredAuthorization: String?) {
        self.port = port
        self.kind = kind
        self.requiredAuthorization = requiredAuthorization
    }

    /// What clients asked for, in order.
    public var seen: [Seen] { seenRequests.withLock { $0 } }

    /// The proxy's URL: `http://127.0.0.1:PORT` or `socks5h://127.0.0.1:PORT`.
    public var url: String { (kind == .http ? "http" : "socks5h") + "://127.0.0.1:\(port)" }

    /// Starts a proxy, runs `body` with it, and stops it when `body` returns or throws.
    /// - Parameter requiredAuthorization: for an HTTP proxy, the `Proxy-Authorization` value
    ///   requests must carry.
    public static func withRunning<Result: Sendable>(
        _ kind: Kind, requiredAuthorization: String? = nil, _ body: @Sendable (TestProxy) async throws -> Result
    ) async throws -> Result {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .bind(host: "127.0.0.1", port: 0) { child in
                child.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: child)
                }
            }
        let proxy = TestProxy(
            port: channel.channel.localAddress?.port ?? 0, kind: kind, requiredAuthorization: requiredAuthorization)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await withThrowingDiscardingTaskGroup { connections in
                    try await channel.executeThenClose { inbound in
                        for try await client in inbound {
                            connections.addTask { await proxy.serve(client) }
                        }
                    }
                }
            }
            do {
                let result = try await body(proxy)
                group.cancelAll()
                return result
            } catch {
                group.cancelAll()
                throw error
            }
        }
    }

    private func serve(_ client: NIOAsyncChannel<ByteBuffer, ByteBuffer>) async {
        try? await client.executeThenClose { inbound, outbound in
            var reader = ByteReader(inbound.makeAsyncIterator())
            switch kind {
            case .http: try await serveHTTP(&reader, outbound)
            case .socks5: try await serveSOCKS(&reader, outbound)
            }
        }
    }

    // MARK: HTTP

    private func serveHTTP(
        _ reader: inout ByteReader, _ outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>
    ) async throws {
        guard let head = try await reader.readHead() else { return }
        let lines = head.split(separator: "\r\n", omittingEmptySubsequences: false).map(String.init)
        let parts = lines[0].split(separator: " ").map(String.init)
        guard parts.count == 3 else { return }
        var headers: [(name: String, value: String)] = []
        for line in lines.dropFirst() where !line.isEmpty {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let value = line[line.index(after: colon)...].drop { $0 == " " || $0 == "\t" }
            headers.append((String(line[..<colon]), String(value)))
        }
        let method = parts[0]
        let target = parts[1]
        seenRequests.withLock {
            $0.append(Seen(method: method, target: target, addressType: nil, headers: headers))
        }
        let forwarded = method == "GET" && target.hasPrefix("http://")
        guard method == "CONNECT" || forwarded else {
            try await outbound.write(ByteBuffer(string: "HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n"))
            return
        }
        if let required = requiredAuthorization,
            headers.first(where: { $0.name.lowercased() == "proxy-authorization" })?.value != required
        {
            try await outbound.write(
                ByteBuffer(
                    string:
                        "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"proxy\"\r\n"
                        + "Content-Length: 0\r\nConnection: close\r\n\r\n"))
            return
        }
        if forwarded {
            try await forward(target, headers, &reader, outbound)
            return
        }
        guard let origin = try? await Self.connect(target) else {
            try await outbound.write(ByteBuffer(string: "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"))
            return
        }
        try await origin.executeThenClose { originInbound, originOutbound in
            try await outbound.write(ByteBuffer(string: "HTTP/1.1 200 Connection established\r\n\r\n"))
            try await Self.relay(&reader, outbound, originInbound, originOutbound)
        }
    }

    /// Sends a request for an absolute `http://` URL on to its origin, in origin form, without the
    /// proxy's own headers and with `Via: 1.1 haul-test-proxy`, then relays the answer.
    private func forward(
        _ target: String, _ headers: [(name: String, value: String)], _ reader: inout ByteReader,
        _ outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>
    ) async throws {
        let rest = target.dropFirst("http://".count)
        let authority = rest.prefix { $0 != "/" && $0 != "?" }
        var path = String(rest.dropFirst(authority.count))
        if path.isEmpty || path.hasPrefix("?") { path = "/" + path }
        let hostPort = authority.contains(":") ? String(authority) : authority + ":80"
        guard let origin = try? await Self.connect(hostPort) else {
            try await outbound.write(ByteBuffer(string: "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"))
            return
        }
        var head = "GET \(path) HTTP/1.1\r\n"
        for header in headers where !header.name.lowercased().hasPrefix("proxy-") {
            head += "\(header.name): \(header.value)\r\n"
        }
        head += "Via: 1.1 haul-test-proxy\r\n\r\n"
        try await origin.executeThenClose { originInbound, originOutbound in
            try await originOutbound.write(ByteBuffer(string: head))
            try await Self.relay(&reader, outbound, originInbound, originOutbound)
        }
    }

    // MARK: SOCKS5 (RFC 1928), no authentication

    private func serveSOCKS(
        _ reader: inout ByteReader, _ outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>
    ) async throws {
        guard let greeting = try await reader.read(2), greeting[0] == 5,
            let methods = try await reader.read(Int(greeting[1])), methods.contains(0)
        else {
            try await outbound.write(ByteBuffer(bytes: [5, 0xFF]))
            return
        }
        try await outbound.write(ByteBuffer(bytes: [5, 0]))
        guard let request = try await reader.read(4), request[0] == 5, request[1] == 1 else { return }
        let host: String
        let type: String
        switch request[3] {
        case 1:
            guard let address = try await reader.read(4) else { return }
            host = address.map(String.init).joined(separator: ".")
            type = "ipv4"
        case 3:
            guard let length = try await reader.read(1), let name = try await reader.read(Int(length[0])) else {
                return
            }
            host = String(decoding: name, as: UTF8.self)
            type = "domain"
        case 4:
            guard let address = try await reader.read(16) else { return }
            host = stride(from: 0, to: 16, by: 2).map {
                String(Int(address[$0]) << 8 | Int(address[$0 + 1]), radix: 16)
            }
            .joined(separator: ":")
            type = "ipv6"
        default:
            return
        }
        guard let portBytes = try await reader.read(2) else { return }
        let target = "\(host):\(Int(portBytes[0]) << 8 | Int(portBytes[1]))"
        seenRequests.withLock { $0.append(Seen(method: "SOCKS", target: target, addressType: type, headers: [])) }
        guard let origin = try? await Self.connect(target) else {
            try await outbound.write(ByteBuffer(bytes: [5, 5, 0, 1, 0, 0, 0, 0, 0, 0]))
            return
        }
        try await origin.executeThenClose { originInbound, originOutbound in
            try await outbound.write(ByteBuffer(bytes: [5, 0, 0, 1, 0, 0, 0, 0, 0, 0]))
            try await Self.relay(&reader, outbound, originInbound, originOutbound)
        }
    }

    // MARK: Plumbing

    private static func connect(_ target: String) async throws -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
        guard let colon = target.lastIndex(of: ":"), let port = Int(target[target.index(after: colon)...]) else {
            throw ProxyFailure()
        }
        var host = String(target[..<colon])
        if host.hasPrefix("[") { host = String(host.dropFirst().dropLast()) }
        return try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: host, port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
    }

    /// Copies bytes both ways until either side closes: what the client sent beyond what was read
    /// first, then everything.
    private static func relay(
        _ reader: inout ByteReader, _ clientOutbound: NIOAsyncChannelOutboundWriter<ByteBuffer>,
        _ originInbound: NIOAsyncChannelInboundStream<ByteBuffer>,
        _ originOutbound: NIOAsyncChannelOutboundWriter<ByteBuffer>
    ) async throws {
        if !reader.pending.isEmpty { try await originOutbound.write(ByteBuffer(bytes: reader.pending)) }
        let clientSide = reader
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                var rest = clientSide
                while let chunk = try? await rest.next() { try? await originOutbound.write(chunk) }
                originOutbound.finish()
            }
            group.addTask {
                do {
                    for try await chunk in originInbound { try await clientOutbound.write(chunk) }
                } catch {}
                clientOutbound.finish()
            }
            // Either side closing ends the tunnel.
            await group.next()
            group.cancelAll()
        }
    }
}

struct ProxyFailure: Error {}

/// Reads a connection's bytes as the proxies need them: a head up to a blank line, or exact counts.
struct ByteReader: @unchecked Sendable {
    // One task reads it at a time: the proxy, then the relay that takes it over.
    private var iterator: NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator
    private(set) var pending: [UInt8] = []

    init(_ iterator: NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator) {
        self.iterator = iterator
    }

    /// The next chunk: what is pending first.
    mutating func next() async throws -> ByteBuffer? {
        if !pending.isEmpty {
            defer { pending = [] }
            return ByteBuffer(bytes: pending)
        }
        return try await iterator.next()
    }

    /// Exactly `count` bytes; `nil` when the connection ends first.
    mutating func read(_ count: Int) async throws -> [UInt8]? {
        while pending.count < count {
            guard let chunk = try await iterator.next() else { return nil }
            pending += chunk.readableBytesView
        }
        defer { pending.removeFirst(count) }
        return Array(pending.prefix(count))
    }

    /// An HTTP head up to (not including) its blank line; `nil` when the connection ends first.
    mutating func readHead() async throws -> String? {
        let end: [UInt8] = Array("\r\n\r\n".utf8)
        while true {
            if let range = pending.firstRange(of: end) {
                let head = String(decoding: pending[..<range.lowerBound], as: UTF8.self)
                pending.removeFirst(range.upperBound)
                return head
            }
            guard pending.count < 64 * 1024, let chunk = try await iterator.next() else { return nil }
            pending += chunk.readableBytesView
        }
    }
}
