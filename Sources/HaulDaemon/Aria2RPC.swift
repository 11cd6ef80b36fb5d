import Haul
import Hummingbird
import NIOCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// aria2's JSON-RPC interface over the daemon's queue, so that aria2's front ends, browser
/// extensions and libraries drive Haul unchanged (see `docs/aria2-rpc.md`).
///
/// - A GID is the download's ID written as 16 hexadecimal digits.
/// - The daemon's token is aria2's secret: every `aria2.` method takes `token:TOKEN` first.
/// - Queued is aria2's `waiting`, running `active`, paused `paused`, completed `complete`, failed
///   `error` and cancelled `removed`. `aria2.remove` cancels (the record stays, as aria2 keeps a
///   result); `aria2.removeDownloadResult` removes the record, never a finished file.
/// - Answers are written as aria2 writes them: numbers as decimal strings, errors with code 1 and
///   aria2's messages, and JSON-RPC's own codes for a request that is not one.
struct Aria2RPC: Sendable {
    let manager: DownloadManager
    let roots: DownloadRoots
    let token: String
    /// Names this run of the daemon (`aria2.getSessionInfo`).
    let sessionID: String

    /// An answer's error: aria2's code (1 for every error of a method) and message.
    struct Failure: Error {
        let code: Int
        let message: String

        init(_ message: String, code: Int = 1) {
            self.code = code
            self.message = message
        }

        static let parse = Failure("Parse error.", code: -32700)
        static let invalidRequest = Failure("Invalid Request.", code: -32600)
        static let invalidParams = Failure("Invalid params.", code: -32602)
        static let unauthorized = Failure("Unauthorized")
        static func wrongType(at index: Int) -> Failure { Failure("The parameter at \(index) has wrong type.") }
        static func notFound(_ gid: String) -> Failure { Failure("GID \(gid) is not found") }
        static func option(_ name: String) -> Failure {
            Failure("We encountered a problem while processing the option '--\(name)'.")
        }
    }

    /// The HTTP status and body that answer one HTTP request's body: a call, or a batch of calls.
    func answer(_ body: ByteBuffer) async -> (status: Int, body: JSONValue) {
        guard let request = try? JSONDecoder().decode(JSONValue.self, from: Data(body.readableBytesView)) else {
            return (500, Self.errorAnswer(.parse, id: .null))
        }
        switch request {
        case .array(let calls):
            var answers: [JSONValue] = []
            for call in calls { answers.append(await answer(call: call).body) }
            return (200, .array(answers))
        case .object:
            return await answer(call: request)
        default:
            return (500, Self.errorAnswer(.parse, id: .null))
        }
    }

    /// The answer to one call, as JSON-RPC writes it (`id`, `jsonrpc`, then `result` or `error`).
    func answer(call: JSONValue) async -> (status: Int, body: JSONValue) {
        guard case .object(let members) = call, case .string(let method)? = members["method"],
            let id = members["id"]
        else { return (400, Self.errorAnswer(.invalidRequest, id: call["id"] ?? .null)) }
        let params: [JSONValue]
        switch members["params"] {
        case nil: params = []
        case .array(let values)?: params = values
        default: return (500, Self.errorAnswer(.invalidParams, id: id))
        }
        do {
            let result = try await perform(method, params)
            return (200, .object(["id": id, "jsonrpc": "2.0", "result": result]))
        } catch let failure as Failure {
            return (400, Self.errorAnswer(failure, id: id))
        } catch {
            return (400, Self.errorAnswer(Failure("\(error)"), id: id))
        }
    }

    static func errorAnswer(_ failure: Failure, id: JSONValue) -> JSONValue {
        .object(["id": id, "jsonrpc": "2.0", "error": failure.json])
    }

    /// Every method this interface answers to, as `system.listMethods` lists them.
    static let methods = [
        "aria2.addUri", "aria2.addTorrent", "aria2.getPeers", "aria2.addMetalink", "aria2.remove", "aria2.pause",
        "aria2.forcePause", "aria2.pauseAll", "aria2.forcePauseAll", "aria2.unpause", "aria2.unpauseAll",
        "aria2.forceRemove", "aria2.changePosition", "aria2.tellStatus", "aria2.getUris", "aria2.getFiles",
        "aria2.getServers", "aria2.tellActive", "aria2.tellWaiting", "aria2.tellStopped", "aria2.getOption",
        "aria2.changeUri", "aria2.changeOption", "aria2.getGlobalOption", "aria2.changeGlobalOption",
        "aria2.purgeDownloadResult", "aria2.removeDownloadResult", "aria2.getVersion", "aria2.getSessionInfo",
        "aria2.shutdown", "aria2.forceShutdown", "aria2.getGlobalStat", "aria2.saveSession", "system.multicall",
        "system.listMethods", "system.listNotifications",
    ]

    /// The notifications a WebSocket client receives.
    static let notifications = [
        "aria2.onDownloadStart", "aria2.onDownloadPause", "aria2.onDownloadStop", "aria2.onDownloadComplete",
        "aria2.onDownloadError", "aria2.onBtDownloadComplete",
    ]

    // MARK: Methods

    /// Runs one method: its result, or the ``Failure`` it ends with.
    func perform(_ method: String, _ params: [JSONValue], nested: Bool = false) async throws -> JSONValue {
        switch method {
        case "system.listMethods": return .array(Self.methods.map(JSONValue.string))
        case "system.listNotifications": return .array(Self.notifications.map(JSONValue.string))
        case "system.multicall": return try await multicall(params, nested: nested)
        default: break
        }
        guard Self.methods.contains(method), method.hasPrefix("aria2.") else {
            throw Failure("No such method: \(method)")
        }
        guard case .string(let first)? = params.first, first.hasPrefix("token:"),
            DaemonFiles.tokensMatch(first.dropFirst(6), token)
        else { throw Failure.unauthorized }
        var arguments = Arguments(Array(params.dropFirst()))
        do {
            return try await perform(method, &arguments)
        } catch let error as HaulError {
            throw Failure(error.message)
        } catch let error as APIError {
            throw Failure(error.message)
        }
    }

    private func perform(_ method: String, _ arguments: inout Arguments) async throws -> JSONValue {
        switch method {
        case "aria2.addUri": return try await addURI(&arguments)
        case "aria2.tellStatus":
            let info = try await download(&arguments).info
            return status(info, keys: try arguments.keys())
        case "aria2.tellActive":
            let keys = try arguments.keys()
            return .array(await manager.downloads(in: [.running]).map { status($0, keys: keys) })
        case "aria2.tellWaiting": return try await tell([.queued, .paused], inStartOrder: true, &arguments)
        case "aria2.tellStopped": return try await tell([.completed, .failed, .cancelled], &arguments)
        case "aria2.getUris":
            let (gid, info) = try await download(&arguments)
            guard !info.state.isFinished else { throw Failure("No URI data is available for GID#\(gid)") }
            return uris(info)
        case "aria2.getFiles": return .array([file(try await download(&arguments).info)])
        case "aria2.getServers":
            let (gid, info) = try await download(&arguments)
            guard info.state == .running else { throw Failure("No active download for GID#\(gid)") }
            let server: JSONValue = .object([
                "uri": .string(info.url), "currentUri": .string(info.url),
                "downloadSpeed": Self.number(Int64(info.bytesPerSecond ?? 0)),
            ])
            return .array([.object(["index": "1", "servers": .array([server])])])
        case "aria2.pause", "aria2.forcePause":
            let (gid, info) = try await download(&arguments)
            guard info.state == .queued || info.state == .running else {
                throw Failure("GID#\(gid) cannot be paused now")
            }
            try await manager.pause(info.id)
            return .string(gid)
        case "aria2.unpause":
            let (gid, info) = try await download(&arguments)
            guard info.state == .paused else { throw Failure("GID#\(gid) cannot be unpaused now") }
            try await manager.resume(info.id)
            return .string(gid)
        case "aria2.pauseAll", "aria2.forcePauseAll":
            await manager.pauseAll()
            return "OK"
        case "aria2.unpauseAll":
            await manager.resumeAll()
            return "OK"
        case "aria2.remove", "aria2.forceRemove":
            let (gid, info) = try await download(&arguments)
            switch info.state {
            case .running: try await manager.cancel(info.id)
            // As aria2 does, one that has not started is forgotten at once (its partial data too).
            case .queued, .paused: try await manager.remove(info.id, deletingFiles: false)
            case .completed, .failed, .cancelled: throw Failure("Active Download not found for GID#\(gid)")
            }
            return .string(gid)
        case "aria2.removeDownloadResult":
            let (gid, info) = try await download(&arguments)
            guard info.state.isFinished else { throw Failure("Could not remove download result of GID#\(gid)") }
            try await manager.remove(info.id, deletingFiles: false)
            return "OK"
        case "aria2.purgeDownloadResult":
            try await purgeFinished()
            return "OK"
        case "aria2.changePosition": return try await changePosition(&arguments)
        case "aria2.getOption": return options(of: try await download(&arguments).info)
        case "aria2.changeOption":
            let (_, info) = try await download(&arguments)
            try await changeOptions(of: info, try arguments.object())
            return "OK"
        case "aria2.getGlobalOption": return await globalOptions()
        case "aria2.changeGlobalOption":
            try await changeGlobalOptions(try arguments.object())
            return "OK"
        case "aria2.getGlobalStat": return try await globalStat()
        case "aria2.getVersion":
            return .object([
                "version": .string(HaulVersion.current),
                "enabledFeatures": .array(["HTTPS", "Message Digest"]),
            ])
        case "aria2.getSessionInfo": return .object(["sessionId": .string(sessionID)])
        case "aria2.saveSession":
            // Every change is written to the queue as it happens: there is nothing more to save.
            return "OK"
        case "aria2.getPeers":
            // An HTTP download has no peers; aria2 answers so for a running one, and knows no other.
            let (gid, info) = try await download(&arguments)
            guard info.state == .running else { throw Failure.notFound(gid) }
            return []
        case "aria2.addTorrent":
            throw Failure("Haul downloads over HTTP and HTTPS; it has no BitTorrent")
        case "aria2.addMetalink":
            throw Failure("Haul reads no Metalink documents; give the file's URLs to aria2.addUri as mirrors")
        case "aria2.changeUri":
            throw Failure("Haul cannot change a download's URLs here; pause it and resume it with a new URL")
        case "aria2.shutdown", "aria2.forceShutdown":
            throw Failure("Haul's daemon stops on SIGTERM (or its service manager), not through this interface")
        default:
            throw Failure("No such method: \(method)")
        }
    }

    private func multicall(_ params: [JSONValue], nested: Bool) async throws -> JSONValue {
        if nested { throw Failure("Recursive system.multicall forbidden.") }
        guard params.count == 1, case .array(let calls) = params[0] else { throw Failure.wrongType(at: 0) }
        var results: [JSONValue] = []
        for call in calls {
            guard case .string(let method)? = call["methodName"] else {
                results.append(Failure.invalidRequest.json)
                continue
            }
            var inner: [JSONValue] = []
            switch call["params"] {
            case nil: break
            case .array(let values)?: inner = values
            default:
                results.append(Failure.invalidParams.json)
                continue
            }
            do {
                results.append(.array([try await perform(method, inner, nested: true)]))
            } catch let failure as Failure {
                results.append(failure.json)
            } catch {
                results.append(Failure("\(error)").json)
            }
        }
        return .array(results)
    }

    /// The download a GID names, read from the queue.
    private func download(_ arguments: inout Arguments) async throws -> (gid: String, info: DownloadInfo) {
        let gid = try arguments.string()
        guard !gid.isEmpty, gid.count <= 16, gid.allSatisfy(\.isHexDigit) else { throw Failure("Invalid GID \(gid)") }
        guard gid.count == 16, let number = Int64(gid, radix: 16), number > 0,
            let info = try? await manager.download(id: DownloadID(number))
        else { throw Failure.notFound(gid) }
        return (gid, info)
    }

    /// `tellWaiting` (in the order they start) and `tellStopped` (in the order they were added):
    /// `num` downloads from `offset`, or from the end backwards when `offset` is negative.
    private func tell(_ states: Set<DownloadState>, inStartOrder: Bool = false, _ arguments: inout Arguments)
        async throws -> JSONValue
    {
        let offset = try arguments.integer()
        let count = try arguments.integer()
        let keys = try arguments.keys()
        guard count > 0 else { return [] }
        func page(_ offset: Int, _ limit: Int) async throws -> DownloadPage {
            inStartOrder
                ? try await manager.downloadsInStartOrder(in: states, offset: offset, limit: limit)
                : try await manager.downloads(in: states, offset: offset, limit: limit)
        }
        if offset >= 0 {
            return .array(try await page(offset, min(count, 1000)).downloads.map { status($0, keys: keys) })
        }
        let last = try await page(0, 0).total + offset
        guard last >= 0 else { return [] }
        let first = max(0, last - min(count, 1000) + 1)
        let downloads = try await page(first, min(last - first + 1, 1000)).downloads
        return .array(downloads.reversed().map { status($0, keys: keys) })
    }

    private func purgeFinished() async throws {
        var after: DownloadID?
        while true {
            let page = try await manager.downloads(in: [.completed, .failed, .cancelled], after: after, limit: 500)
            guard let last = page.last else { return }
            after = last.id
            for info in page { try? await manager.remove(info.id, deletingFiles: false) }
        }
    }

    // MARK: Adding

    private func addURI(_ arguments: inout Arguments) async throws -> JSONValue {
        guard case .array(let values) = try arguments.next() else { throw Failure.wrongType(at: arguments.index - 1) }
        var uris: [String] = []
        for value in values {
            guard case .string(let uri) = value else { throw Failure.wrongType(at: 0) }
            uris.append(uri)
        }
        guard let url = uris.first else { throw Failure("URI is not provided.") }
        for uri in uris { try API.checkURL(uri) }
        let options = try arguments.optionalObject() ?? [:]
        let position = try arguments.optionalInteger()

        var directory = roots.directories[0]
        if let dir = try Self.text(options, "dir") {
            directory = try roots.confine(dir, isDirectory: true)
            // aria2 makes the directory it is given, inside a download root here.
            try POSIX.makeDirectories(directory)
        }
        var request = DownloadRequest(url: url, destination: .directory(directory), mirrors: Array(uris.dropFirst()))
        if let out = try Self.text(options, "out") {
            request.destination = .file(try roots.confine(directory + "/" + out, isDirectory: false))
        }
        var paused = false
        for (name, value) in options.sorted(by: { $0.key < $1.key }) where name != "dir" && name != "out" {
            switch name {
            case "pause": paused = try Self.flag(value, name)
            case "checksum":
                do {
                    request.checksum = try Checksum(parsing: try Self.text(value, name))
                } catch { throw Failure.option(name) }
            case "allow-overwrite": request.overwrite = try Self.flag(value, name)
            case "continue":
                // Haul always continues what it has; asking it not to is asking for something else.
                guard try Self.flag(value, name) else {
                    throw Failure("Haul always continues a partial download; use allow-overwrite to start anew")
                }
            default: try Self.apply(name, value, to: &request)
            }
        }
        let split = try Self.text(options, "split").map { try Self.positive($0, "split") }
        let perServer = try Self.text(options, "max-connection-per-server").map {
            try Self.positive($0, "max-connection-per-server")
        }
        if split != nil || perServer != nil {
            // aria2 opens at most `split` connections, and at most `max-connection-per-server` to each URL.
            let servers = (perServer ?? Int.max).multipliedReportingOverflow(by: uris.count)
            request.connections = min(split ?? Int.max, servers.overflow ? Int.max : servers.partialValue)
        }
        _ = try request.check()
        // Paused or moved in line before it can start.
        await manager.holdStarts()
        do {
            let id = try await manager.enqueue(request)
            if paused { try await manager.pause(id) }
            if let position {
                var place = Arguments([.string(Self.gid(id)), .integer(Int64(position)), "POS_SET"])
                _ = try await changePosition(&place)
            }
            await manager.releaseStarts()
            return .string(Self.gid(id))
        } catch {
            await manager.releaseStarts()
            throw error
        }
    }

    /// Applies an option `addUri` and `changeOption` both take.
    private static func apply(_ name: String, _ value: JSONValue, to request: inout DownloadRequest) throws {
        switch name {
        case "split", "max-connection-per-server":
            // Read together by the caller.
            _ = try positive(try text(value, name), name)
        case "max-download-limit":
            let limit = try byteCount(try text(value, name), name)
            request.bytesPerSecondLimit = limit == 0 ? nil : limit
        case "header":
            let lines: [String]
            switch value {
            case .string(let line): lines = [line]
            case .array(let values):
                lines = try values.map { value -> String in
                    guard case .string(let line) = value else { throw Failure.option(name) }
                    return line
                }
            default: throw Failure.option(name)
            }
            for line in lines {
                guard let colon = line.firstIndex(of: ":") else { throw Failure.option(name) }
                let field = String(line[..<colon]).trimmingCharacters(in: .whitespaces)
                let content = String(line[line.index(after: colon)...]).trimmingCharacters(in: .whitespaces)
                setHeader(field, content, in: &request)
            }
        case "referer": setHeader("Referer", try text(value, name), in: &request)
        case "user-agent": setHeader("User-Agent", try text(value, name), in: &request)
        case "http-user", "http-passwd":
            var credentials = request.credentials ?? BasicCredentials(user: "", password: "")
            if name == "http-user" {
                credentials.user = try text(value, name)
            } else {
                credentials.password = try text(value, name)
            }
            request.credentials = credentials
        default:
            throw Failure("Haul does not support the option '--\(name)'")
        }
    }

    /// Sets a header, in place of one of the same name (given twice, the later wins).
    private static func setHeader(_ name: String, _ value: String, in request: inout DownloadRequest) {
        request.headers.removeAll { $0.name.lowercased() == name.lowercased() }
        request.headers.append((name, value))
    }

    // MARK: Changing

    private func changePosition(_ arguments: inout Arguments) async throws -> JSONValue {
        let (gid, info) = try await download(&arguments)
        let position = try arguments.integer()
        let how = try arguments.string()
        guard ["POS_SET", "POS_CUR", "POS_END"].contains(how) else { throw Failure("Illegal argument.") }
        guard info.state == .queued || info.state == .paused else {
            throw Failure("GID#\(gid) not found in the waiting queue.")
        }
        // Haul's line is by priority, then by age: the download takes a priority between those of
        // its new neighbours, and those before it move up when there is none between them.
        let line = try await waitingLine()
        guard let current = line.firstIndex(where: { $0.id == info.id }) else {
            throw Failure("GID#\(gid) not found in the waiting queue.")
        }
        let others = line.filter { $0.id != info.id }
        let asked = how == "POS_SET" ? position : how == "POS_CUR" ? current + position : others.count + position
        let target = min(max(asked, 0), others.count)
        guard target != current else { return .integer(Int64(target)) }
        var priority = info.priority.rawValue
        if others.isEmpty {
            return 0
        } else if target == 0 {
            priority = others[0].priority.rawValue + 1
        } else if target == others.count {
            priority = others[target - 1].priority.rawValue - 1
        } else {
            let before = others[target - 1].priority.rawValue
            let after = others[target].priority.rawValue
            if before - after >= 2 {
                priority = after + 1
            } else {
                for other in others[..<target] {
                    try await manager.setPriority(other.id, DownloadPriority(other.priority.rawValue + 2))
                }
                priority = before + 1
            }
        }
        if priority != info.priority.rawValue { try await manager.setPriority(info.id, DownloadPriority(priority)) }
        return .integer(Int64(target))
    }

    /// The queued and paused downloads in the order they start.
    private func waitingLine() async throws -> [DownloadInfo] {
        var line: [DownloadInfo] = []
        while true {
            let page = try await manager.downloadsInStartOrder(in: [.queued, .paused], offset: line.count, limit: 1000)
            line += page.downloads
            if page.downloads.count < 1000 { return line }
        }
    }

    private func changeOptions(of info: DownloadInfo, _ options: [String: JSONValue]) async throws {
        for name in options.keys where !["max-download-limit", "header", "referer", "user-agent"].contains(name) {
            throw Failure("Haul cannot change the option '--\(name)' of a download")
        }
        try await manager.changeRequest(info.id) { request in
            for (name, value) in options.sorted(by: { $0.key < $1.key }) { try Self.apply(name, value, to: &request) }
        }
    }

    private func changeGlobalOptions(_ options: [String: JSONValue]) async throws {
        var concurrent: Int?
        var limit: Int64??
        for (name, value) in options {
            switch name {
            case "max-concurrent-downloads":
                let number = try Self.positive(try Self.text(value, name), name)
                guard number <= 1000 else { throw Failure.option(name) }
                concurrent = number
            case "max-overall-download-limit":
                let bytes = try Self.byteCount(try Self.text(value, name), name)
                limit = .some(bytes == 0 ? nil : bytes)
            default: throw Failure("Haul cannot change the option '--\(name)'")
            }
        }
        if let concurrent { await manager.setMaxConcurrentDownloads(concurrent) }
        if let limit { await manager.setBytesPerSecondLimit(limit) }
    }

    // MARK: Answers

    private func globalStat() async throws -> JSONValue {
        let counts = try await manager.counts()
        func count(_ states: DownloadState...) -> JSONValue {
            Self.number(Int64(states.reduce(0) { $0 + (counts[$1] ?? 0) }))
        }
        let progress = await manager.aggregateProgress()
        let stopped = count(.completed, .failed, .cancelled)
        return .object([
            "downloadSpeed": Self.number(Int64(progress.bytesPerSecond)), "uploadSpeed": "0",
            "numActive": count(.running), "numWaiting": count(.queued, .paused), "numStopped": stopped,
            "numStoppedTotal": stopped,
        ])
    }

    private func globalOptions() async -> JSONValue {
        let configuration = await manager.configuration
        return .object([
            "dir": .string(roots.directories[0]),
            "max-concurrent-downloads": Self.number(Int64(configuration.maxConcurrentDownloads)),
            "max-overall-download-limit": Self.number(configuration.bytesPerSecondLimit ?? 0),
        ])
    }

    private func options(of info: DownloadInfo) -> JSONValue {
        var options: [String: JSONValue] = [
            "dir": .string(Self.directory(of: info)),
            "max-download-limit": Self.number(info.request.bytesPerSecondLimit ?? 0),
            "allow-overwrite": info.request.overwrite ? "true" : "false",
        ]
        if case .file(let path) = info.request.destination {
            options["out"] = .string(DownloadPaths.split(path).fileName)
        }
        if let connections = info.request.connections { options["split"] = Self.number(Int64(connections)) }
        if let checksum = info.request.checksum { options["checksum"] = .string(checksum.description) }
        return .object(options)
    }

    /// What `tellStatus` tells of a download, only the `keys` asked for when some are.
    func status(_ info: DownloadInfo, keys: Set<String>?) -> JSONValue {
        var fields: [String: JSONValue] = [
            "gid": .string(Self.gid(info.id)),
            "status": .string(Self.status(of: info.state)),
            "totalLength": Self.number(info.totalBytes ?? 0),
            "completedLength": Self.number(info.bytes),
            "uploadLength": "0",
            "downloadSpeed": Self.number(Int64(info.bytesPerSecond ?? 0)),
            "uploadSpeed": "0",
            "connections": Self.number(Int64(info.openConnections ?? 0)),
            "dir": .string(Self.directory(of: info)),
            "files": .array([file(info)]),
        ]
        switch info.state {
        case .completed:
            fields["errorCode"] = "0"
            fields["errorMessage"] = ""
        case .failed:
            fields["errorCode"] = .string(Self.errorCode(of: info.error))
            fields["errorMessage"] = .string(info.error?.message ?? "")
        case .cancelled:
            fields["errorCode"] = "31"
            fields["errorMessage"] = ""
        case .queued, .running, .paused:
            break
        }
        guard let keys else { return .object(fields) }
        return .object(fields.filter { keys.contains($0.key) })
    }

    private func file(_ info: DownloadInfo) -> JSONValue {
        .object([
            "index": "1",
            "path": .string(info.destination ?? ""),
            "length": Self.number(info.totalBytes ?? 0),
            "completedLength": Self.number(info.bytes),
            "selected": "true",
            "uris": uris(info),
        ])
    }

    private func uris(_ info: DownloadInfo) -> JSONValue {
        .array(
            [.object(["uri": .string(info.url), "status": "used"])]
                + info.request.mirrors.map { .object(["uri": .string($0), "status": "waiting"]) })
    }

    // MARK: Helpers

    /// A download's GID: its ID as 16 hexadecimal digits.
    static func gid(_ id: DownloadID) -> String {
        let digits = String(id.rawValue, radix: 16)
        return String(repeating: "0", count: max(0, 16 - digits.count)) + digits
    }

    static func status(of state: DownloadState) -> String {
        switch state {
        case .queued: "waiting"
        case .running: "active"
        case .paused: "paused"
        case .completed: "complete"
        case .failed: "error"
        case .cancelled: "removed"
        }
    }

    /// aria2's exit status for an error (its manual's "EXIT STATUS"), as its front ends show them.
    static func errorCode(of error: HaulError?) -> String {
        guard let error else { return "1" }
        switch error.code {
        case .timedOut: return "2"
        case .httpStatus:
            let status = error.status ?? 0
            if status == 404 || status == 410 { return "3" }
            if status == 401 || status == 403 { return "24" }
            return "22"
        case .network: return "6"
        case .insufficientSpace, .diskFull: return "9"
        case .destinationExists: return "13"
        case .fileSystem: return "16"
        case .checksumMismatch: return "32"
        default: return "1"
        }
    }

    private static func directory(of info: DownloadInfo) -> String {
        switch info.request.destination {
        case .directory(let path): return path
        case .file(let path): return DownloadPaths.split(path).directory
        }
    }

    static func number(_ value: Int64) -> JSONValue { .string(String(value)) }

    private static func text(_ options: [String: JSONValue], _ name: String) throws -> String? {
        guard let value = options[name] else { return nil }
        return try text(value, name)
    }

    /// An option's value: aria2 takes strings, and numbers and booleans as their text.
    private static func text(_ value: JSONValue, _ name: String) throws -> String {
        switch value {
        case .string(let text): return text
        case .integer(let number): return String(number)
        case .bool(let flag): return flag ? "true" : "false"
        default: throw Failure.option(name)
        }
    }

    private static func flag(_ value: JSONValue, _ name: String) throws -> Bool {
        switch try text(value, name) {
        case "true": return true
        case "false": return false
        default: throw Failure.option(name)
        }
    }

    private static func positive(_ text: String, _ name: String) throws -> Int {
        guard let number = Int(text), number > 0 else { throw Failure.option(name) }
        return number
    }

    /// A size as aria2 writes it (bytes, or `K`/`M` for KiB and MiB), as Haul reads sizes.
    static func byteCount(_ text: String, _ name: String) throws -> Int64 {
        do { return try ByteCount.parse(text) } catch { throw Failure.option(name) }
    }
}

extension Aria2RPC.Failure {
    /// The error's JSON: `{"code": …, "message": …}`.
    var json: JSONValue { .object(["code": .integer(Int64(code)), "message": .string(message)]) }
}

/// A method's parameters after the secret, read in order; a value of the wrong type names its
/// place as aria2 does.
struct Arguments {
    private let values: [JSONValue]
    private(set) var index = 0

    init(_ values: [JSONValue]) { self.values = values }

    mutating func next() throws -> JSONValue {
        guard index < values.count else { throw Aria2RPC.Failure.wrongType(at: index) }
        defer { index += 1 }
        return values[index]
    }

    mutating func string() throws -> String {
        guard case .string(let text) = try next() else { throw Aria2RPC.Failure.wrongType(at: index - 1) }
        return text
    }

    mutating func integer() throws -> Int {
        guard case .integer(let number) = try next(), let value = Int(exactly: number) else {
            throw Aria2RPC.Failure.wrongType(at: index - 1)
        }
        return value
    }

    mutating func optionalInteger() throws -> Int? {
        guard index < values.count else { return nil }
        return try integer()
    }

    mutating func object() throws -> [String: JSONValue] {
        guard case .object(let members) = try next() else { throw Aria2RPC.Failure.wrongType(at: index - 1) }
        return members
    }

    mutating func optionalObject() throws -> [String: JSONValue]? {
        guard index < values.count else { return nil }
        return try object()
    }

    /// The keys a `tell` method is limited to, when given.
    mutating func keys() throws -> Set<String>? {
        guard index < values.count else { return nil }
        guard case .array(let names) = try next() else { throw Aria2RPC.Failure.wrongType(at: index - 1) }
        var keys = Set<String>()
        for name in names {
            guard case .string(let key) = name else { throw Aria2RPC.Failure.wrongType(at: index - 1) }
            keys.insert(key)
        }
        return keys
    }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByArrayLiteral, ExpressibleByIntegerLiteral {
    init(integerLiteral value: Int64) { self = .integer(value) }
    init(stringLiteral value: String) { self = .string(value) }
    init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
}

extension Aria2RPC {
    /// Where aria2 serves its interface, over HTTP and WebSocket alike.
    static let path = "/jsonrpc"

    /// `POST /jsonrpc`: a call or a batch in the body. A `GET` that does not open a WebSocket is
    /// answered as aria2 does, as a request that is not one.
    func register(on router: Router<DaemonRequestContext>) {
        router.post(RouterPath(Self.path)) { request, context in
            let body = try await JSONBody.collect(request, limit: context.maxUploadSize)
            let (status, answer) = await answer(body)
            return try Self.response(status: status, answer)
        }
        router.get(RouterPath(Self.path)) { _, _ in
            try Self.response(status: 400, Self.errorAnswer(.invalidRequest, id: .null))
        }
    }

    static func response(status: Int, _ answer: JSONValue) throws -> Response {
        Response(
            status: .init(code: status),
            headers: [.contentType: "application/json-rpc; charset=utf-8", .cacheControl: "no-store"],
            body: .init(byteBuffer: try JSONBody.encode(answer)))
    }
}
