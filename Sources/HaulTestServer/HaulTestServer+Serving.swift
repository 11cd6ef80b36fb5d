import NIOCore
import NIOHTTP1
import Synchronization

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

extension HaulTestServer {
    /// What the server decided to send for one request.
    struct Reply {
        var status: HTTPResponseStatus
        var headers: HTTPHeaders
        /// Body parts: generated ranges of the resource or literal bytes (multipart boundaries, error text).
        var parts: [BodyPart]
        var faults: [Fault]
    }

    enum BodyPart {
        case content(seed: UInt64, range: Range<Int64>)
        case literal([UInt8])

        var count: Int64 {
            switch self {
            case .content(_, let range): range.count.int64
            case .literal(let bytes): Int64(bytes.count)
            }
        }
    }

    /// Answers the requests of an HTTP/1.1 connection, or the one request of an HTTP/2 stream.
    func serve(_ connection: HTTPChannel, connection connectionNumber: Int, version: String) async {
        do {
            try await connection.executeThenClose { inbound, _ in
                var head: HTTPRequestHead?
                var body: [UInt8] = []
                for try await part in inbound {
                    switch part {
                    case .head(let requestHead): head = requestHead
                    case .body(let buffer): body += buffer.readableBytesView
                    case .end:
                        guard let requestHead = head else { return }
                        let keepOpen = try await respond(
                            to: requestHead, body: body, connection: connectionNumber, version: version,
                            channel: connection.channel
                        )
                        if !keepOpen || !requestHead.isKeepAlive { return }
                        head = nil
                        body = []
                    }
                }
            }
        } catch {
            // A client that goes away mid-response is normal here.
        }
    }

    /// Answers one request; returns false when the connection must be closed.
    private func respond(
        to head: HTTPRequestHead, body: [UInt8], connection: Int, version: String, channel: any Channel
    ) async throws -> Bool {
        var request = RecordedRequest(
            method: head.method.rawValue, uri: head.uri, headers: head.headers.map { ($0.name, $0.value) },
            connection: connection, version: version
        )
        request.body = body
        let (index, resource, faults) = state.withLock { state -> (Int, TestResource?, [Fault]) in
            state.requestsAnswering += 1
            state.maximumRequestsAnswering = max(state.maximumRequestsAnswering, state.requestsAnswering)
            let answering = state.answeringByPath[request.path, default: 0] + 1
            state.answeringByPath[request.path] = answering
            state.maximumAnsweringByPath[request.path] = max(state.maximumAnsweringByPath[request.path] ?? 0, answering)
            state.requests.append(request)
            state.bodyBytesSent.append(0)
            var faults: [Fault] = []
            if var steps = state.scripts[request.path], !steps.isEmpty {
                faults = steps.removeFirst()
                state.scripts[request.path] = steps
            }
            faults += state.standingFaults[request.path] ?? []
            for case .switchVersion(let version) in faults {
                state.resources[request.path]?.version = version
            }
            return (state.requests.count - 1, state.resources[request.path], faults)
        }
        defer {
            state.withLock { state in
                state.requestsAnswering -= 1
                state.answeringByPath[request.path, default: 1] -= 1
            }
        }
        var reply = makeReply(for: head, resource: resource, faults: faults)
        for case .omitHeader(let name) in faults { reply.headers.remove(name: name) }
        for case .setHeader(let name, let value) in faults { reply.headers.replaceOrAdd(name: name, value: value) }
        for case .headerFlood(let count) in faults {
            for index in 0..<count {
                reply.headers.add(name: "X-Flood-\(index)", value: String(repeating: "x", count: 64))
            }
        }
        try await send(reply, isHead: head.method == .HEAD, request: index, channel: channel)
        return !faults.contains {
            if case .closeAfter = $0 { true } else if case .shortBody = $0 { true } else { false }
        }
    }

    func makeReply(for head: HTTPRequestHead, resource: TestResource?, faults: [Fault]) -> Reply {
        var headers = HTTPHeaders()
        headers.add(name: "Date", value: Self.httpDate(Int64(time(nil))))
        headers.add(name: "Server", value: "HaulTestServer")
        guard let resource else {
            return Self.textReply(.notFound, "not found\n", headers: headers, faults: faults)
        }
        for cookie in resource.setCookies { headers.add(name: "Set-Cookie", value: cookie) }
        if let required = resource.requiredAuthorization, head.headers.first(name: "authorization") != required {
            headers.add(name: "WWW-Authenticate", value: #"Basic realm="haul-test""#)
            return Self.textReply(.unauthorized, "credentials needed\n", headers: headers, faults: faults)
        }
        if let required = resource.requiredCookie {
            let sent = head.headers["cookie"].flatMap { $0.split(separator: ";") }.map { pair in
                String(pair.drop { $0 == " " })
            }
            guard sent.contains(required) else {
                return Self.textReply(.forbidden, "cookie \(required) needed\n", headers: headers, faults: faults)
            }
        }
        if let redirect = resource.redirect {
            headers.add(name: "Location", value: redirect.location)
            headers.add(name: "Content-Length", value: "0")
            return Reply(
                status: HTTPResponseStatus(statusCode: redirect.status), headers: headers, parts: [], faults: faults)
        }
        let range = head.headers.first(name: "range")
        for case .refuseRanges(let code, let retryAfter, let sparingFromStart) in faults
        where range != nil && !(sparingFromStart && range?.hasPrefix("bytes=0-") == true) {
            if let retryAfter { headers.add(name: "Retry-After", value: retryAfter) }
            return Self.textReply(
                HTTPResponseStatus(statusCode: code), "ranges refused: \(code)\n", headers: headers, faults: faults)
        }
        for case .status(let code, let retryAfter) in faults {
            if let retryAfter { headers.add(name: "Retry-After", value: retryAfter) }
            return Self.textReply(
                HTTPResponseStatus(statusCode: code), "scripted status \(code)\n", headers: headers, faults: faults)
        }

        if let tag = resource.entityTagValue { headers.add(name: "ETag", value: tag) }
        if resource.lastModified {
            headers.add(name: "Last-Modified", value: Self.httpDate(resource.lastModifiedSeconds))
        }
        if resource.acceptRanges { headers.add(name: "Accept-Ranges", value: "bytes") }
        if let disposition = resource.contentDisposition {
            headers.add(name: "Content-Disposition", value: disposition)
        }
        if resource.reprDigest {
            headers.add(name: "Repr-Digest", value: "sha-256=:\(Self.base64(resource.sha256(0..<resource.size))):")
        }
        for case .contentEncoding(let coding) in faults { headers.add(name: "Content-Encoding", value: coding) }

        let size = resource.size
        let ranges = requestedRanges(head, resource: resource, faults: faults)
        let whole = BodyPart.content(seed: resource.seed, range: 0..<size)
        guard let ranges else {
            headers.add(name: "Content-Type", value: "application/octet-stream")
            if resource.contentDigest {
                headers.add(name: "Content-Digest", value: "sha-256=:\(Self.base64(resource.sha256(0..<size))):")
            }
            return Reply(status: .ok, headers: headers, parts: [whole], faults: faults)
        }
        guard !ranges.isEmpty else {
            headers.add(name: "Content-Range", value: "bytes */\(size)")
            return Self.textReply(.rangeNotSatisfiable, "range not satisfiable\n", headers: headers, faults: faults)
        }
        if ranges.count == 1 && !faults.contains(.multipart) {
            let range = ranges[0]
            var shift: Int64 = 0
            for case .wrongContentRange(let amount) in faults { shift = amount }
            headers.add(name: "Content-Type", value: "application/octet-stream")
            if resource.contentDigest {
                headers.add(name: "Content-Digest", value: "sha-256=:\(Self.base64(resource.sha256(range))):")
            }
            headers.add(
                name: "Content-Range",
                value: "bytes \(range.lowerBound + shift)-\(range.upperBound - 1 + shift)/\(size)"
            )
            return Reply(
                status: .partialContent, headers: headers, parts: [.content(seed: resource.seed, range: range)],
                faults: faults)
        }
        let boundary = "haul-test-boundary"
        headers.add(name: "Content-Type", value: "multipart/byteranges; boundary=\(boundary)")
        var parts: [BodyPart] = []
        for range in ranges {
            let partHead =
                "\r\n--\(boundary)\r\nContent-Type: application/octet-stream\r\n"
                + "Content-Range: bytes \(range.lowerBound)-\(range.upperBound - 1)/\(size)\r\n\r\n"
            parts.append(.literal(Array(partHead.utf8)))
            parts.append(.content(seed: resource.seed, range: range))
        }
        parts.append(.literal(Array("\r\n--\(boundary)--\r\n".utf8)))
        return Reply(status: .partialContent, headers: headers, parts: parts, faults: faults)
    }

    /// The ranges to serve: `nil` for the whole file (no range, an ignored range, or a failed `If-Range`),
    /// an empty list when nothing requested is satisfiable.
    private func requestedRanges(_ head: HTTPRequestHead, resource: TestResource, faults: [Fault]) -> [Range<Int64>]? {
        guard head.method == .GET, resource.acceptRanges, !faults.contains(.ignoreRange),
            let value = head.headers.first(name: "range"), let set = ByteRangeSet(value)
        else { return nil }
        if let condition = head.headers.first(name: "if-range") {
            let matchesTag = resource.entityTagMatches(condition)
            let matchesDate = resource.lastModified && condition == Self.httpDate(resource.lastModifiedSeconds)
            guard matchesTag || matchesDate else { return nil }
        }
        return set.resolve(length: resource.size)
    }

    private static func textReply(_ status: HTTPResponseStatus, _ text: String, headers: HTTPHeaders, faults: [Fault])
        -> Reply
    {
        var headers = headers
        headers.add(name: "Content-Type", value: "text/plain")
        return Reply(status: status, headers: headers, parts: [.literal(Array(text.utf8))], faults: faults)
    }

    // MARK: Sending

    /// Writes the reply straight to the channel and waits for each part to reach the socket, so a fault
    /// that closes the connection after N bytes really delivers those N bytes first.
    private func send(_ reply: Reply, isHead: Bool, request: Int, channel: any Channel) async throws {
        // A write waits for the client to take the bytes; one that stopped reading while keeping the
        // connection open would hold the stopping server forever, so the connection is closed then.
        func write(_ part: HTTPServerResponsePart) async throws {
            try await withTaskCancellationHandler {
                try await channel.writeAndFlush(part).get()
            } onCancel: {
                channel.close(promise: nil)
            }
        }
        var headers = reply.headers
        let total = reply.parts.reduce(Int64(0)) { $0 + $1.count }
        if !headers.contains(name: "Content-Length") { headers.add(name: "Content-Length", value: String(total)) }
        try await write(.head(HTTPResponseHead(version: .http1_1, status: reply.status, headers: headers)))
        guard !isHead else {
            try await write(.end(nil))
            return
        }

        var limit = total
        var corruptAt: Int64?
        var stall: (after: Int64, seconds: Double)?
        var rate: Int?
        for fault in reply.faults {
            switch fault {
            case .closeAfter(let bytes): limit = min(limit, bytes)
            case .shortBody(let missing): limit = min(limit, max(0, total - missing))
            case .stall(let after, let seconds): stall = (after, seconds)
            case .throttle(let bytesPerSecond): rate = bytesPerSecond
            case .corruptByte(let offset): corruptAt = offset
            default: continue
            }
        }

        let clock = ContinuousClock()
        let start = clock.now
        var sent: Int64 = 0
        let chunkSize = Int64(rate.map { max(1024, min(64 * 1024, $0 / 20)) } ?? 64 * 1024)
        var buffer = ByteBufferAllocator().buffer(capacity: Int(chunkSize))
        outer: for part in reply.parts {
            var position: Int64 = 0
            while position < part.count {
                if let pause = stall, sent >= pause.after {
                    stall = nil
                    try await Task.sleep(for: .seconds(pause.seconds))
                }
                var count = min(chunkSize, part.count - position, limit - sent)
                if let pause = stall, pause.after > sent { count = min(count, pause.after - sent) }
                guard count > 0 else { break outer }
                buffer.clear()
                switch part {
                case .content(let seed, let range):
                    let first = range.lowerBound + position
                    buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: Int(count)) { pointer in
                        TestContent.fill(
                            UnsafeMutableRawBufferPointer(rebasing: pointer[0..<Int(count)]), seed: seed, offset: first
                        )
                        if let corruptAt, corruptAt >= first, corruptAt < first + count {
                            pointer[Int(corruptAt - first)] ^= 0xFF
                        }
                        return Int(count)
                    }
                case .literal(let bytes):
                    buffer.writeBytes(bytes[Int(position)..<Int(position + count)])
                }
                if let due = reserveBandwidth(count) { try await Task.sleep(until: due) }
                try await write(.body(.byteBuffer(buffer)))
                position += count
                sent += count
                state.withLock { $0.bodyBytesSent[request] += count }
                if let rate {
                    let due = Duration.seconds(Double(sent) / Double(rate))
                    let elapsed = clock.now - start
                    if due > elapsed { try await Task.sleep(for: due - elapsed) }
                }
            }
        }
        if sent < total {
            // The fault cuts the body short: close without finishing the message. Linger first, so the
            // client has read everything that was sent before it sees the connection close.
            if let pause = stall, pause.after >= sent { try await Task.sleep(for: .seconds(pause.seconds)) }
            try await Task.sleep(for: .milliseconds(100))
            return
        }
        try await write(.end(nil))
    }

    static func base64(_ bytes: [UInt8]) -> String { Data(bytes).base64EncodedString() }

    static func httpDate(_ seconds: Int64) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return
            "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }
}

extension TestResource {
    /// `If-Range` with an entity tag matches only a strong tag, compared strongly.
    func entityTagMatches(_ condition: String) -> Bool {
        guard entityTag == .strong, let tag = entityTagValue else { return false }
        return condition.trimmingCharacters(in: " \t") == tag
    }
}

extension Int {
    var int64: Int64 { Int64(self) }
}
