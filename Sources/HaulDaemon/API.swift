import HTTPTypes
import Haul
import Hummingbird
import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The routes of `/api/v1` over one download manager.
struct API: Sendable {
    let manager: DownloadManager
    /// Directories downloads may be written into (absolute, symbolic links resolved); the first one
    /// takes relative destinations.
    let roots: DownloadRoots
    let hub: EventHub
    /// How often an idle event stream sends a comment, so proxies and clients see it is alive.
    let keepAlive: Duration
    /// The listener's connections: event streams are counted there.
    let connections: ConnectionLedger

    /// The OpenAPI document of the API, as served at `/api/v1/openapi.json`.
    /// Assembled once; a document that does not assemble is a bug of the build, which the API
    /// tests catch.
    static let document: ByteBuffer = {
        do { return try APIDocument.assembled() } catch {
            preconditionFailure("the API document does not assemble: \(error)")
        }
    }()

    func register(on router: some RouterMethods<DaemonRequestContext>, recording recorder: RouteRecorder? = nil) {
        var methods: [(path: String, methods: [HTTPRequest.Method])] = []
        func route(
            _ method: HTTPRequest.Method, _ path: String,
            _ handler: @escaping @Sendable (Request, DaemonRequestContext) async throws -> Response
        ) {
            recorder?.routes.append((method, path))
            if let index = methods.firstIndex(where: { $0.path == path }) {
                methods[index].methods.append(method)
            } else {
                methods.append((path, [method]))
            }
            router.on(RouterPath(path), method: method, use: handler)
        }
        defer {
            // Any other method on a known path: 405, with the methods it has.
            for (path, allowed) in methods {
                let allow = allowed.map(\.rawValue).joined(separator: ", ")
                for method in Self.otherMethods where !allowed.contains(method) {
                    router.on(RouterPath(path), method: method) { _, _ -> Response in
                        throw APIError(
                            .methodNotAllowed, "methodNotAllowed", "\(method) is not allowed here; \(allow) are",
                            headers: [.allow: allow])
                    }
                }
            }
        }
        route(.get, "openapi.json") { _, _ in
            Response(
                status: .ok, headers: [.contentType: "application/json; charset=utf-8"],
                body: .init(byteBuffer: Self.document))
        }
        route(.get, "events") { request, _ in
            let limit = connections.limits.maximumEventStreams
            guard connections.openEventStreams < limit else {
                throw APIError(
                    .serviceUnavailable, "tooManyEventStreams",
                    "\(limit) event streams are open already: close one, or try again shortly",
                    headers: [.retryAfter: "5"])
            }
            return events(request)
        }
        route(.post, "downloads") { request, context in try await add(request, context: context) }
        route(.get, "downloads") { request, _ in try await list(request) }
        route(.get, "downloads/{id}") { _, context in try await current(try Self.id(context)) }
        route(.delete, "downloads/{id}") { request, context in
            let id = try Self.id(context)
            let deletingFiles = try Self.flag(request, "deleteFiles")
            try await perform { try await manager.remove(id, deletingFiles: deletingFiles) }
            return Response(status: .noContent)
        }
        route(.post, "downloads/{id}/pause") { _, context in
            let id = try Self.id(context)
            _ = try await perform { try await manager.pause(id) }
            return try await current(id)
        }
        route(.post, "downloads/{id}/resume") { request, context in
            let id = try Self.id(context)
            let body = try await request.decodeIfPresent(as: ResumeBody.self, context: context)
            if let url = body?.url { try Self.checkURL(url) }
            let headers = body?.headers?.map { (name: $0.name, value: $0.value) }
            if let headers { try await perform { try DownloadRequest.check(headers: headers) } }
            let credentials = body?.credentials.map { BasicCredentials(user: $0.user, password: $0.password) }
            let secretHeaders = Set(body?.headers?.filter { $0.secret == true }.map(\.name) ?? [])
            try await perform {
                try await manager.resume(
                    id, url: body?.url, headers: headers, secretHeaders: secretHeaders, credentials: credentials)
            }
            return try await current(id)
        }
        route(.post, "downloads/{id}/retry") { _, context in
            let id = try Self.id(context)
            _ = try await perform { try await manager.retry(id) }
            return try await current(id)
        }
        route(.post, "pause-all") { _, _ in
            await manager.pauseAll()
            return Response(status: .noContent)
        }
        route(.post, "resume-all") { _, _ in
            await manager.resumeAll()
            return Response(status: .noContent)
        }
        route(.get, "options") { request, context in try await options().response(from: request, context: context) }
        route(.patch, "options") { request, context in
            let change = try await request.decode(as: OptionsChange.self, context: context)
            // Both checked before either changes.
            if let limit = change.maxConcurrentDownloads, !(1...1000).contains(limit) {
                throw APIError.badRequest("maxConcurrentDownloads must be between 1 and 1000, got \(limit)")
            }
            if case .some(.some(let rate)) = change.totalLimitRate, rate < 1 {
                throw APIError.badRequest("totalLimitRate must be a positive number of bytes per second, or null")
            }
            if let limit = change.maxConcurrentDownloads { await manager.setMaxConcurrentDownloads(limit) }
            if let rate = change.totalLimitRate { await manager.setBytesPerSecondLimit(rate) }
            return try await options().response(from: request, context: context)
        }
        route(.get, "stats") { request, context in try await stats().response(from: request, context: context) }
        route(.get, "rules") { request, context in try await rules().response(from: request, context: context) }
        route(.put, "rules") { request, context in
            let rules = try await request.decode(as: QueueRules.self, context: context)
            try await perform { try rules.check() }
            // Folders stay beneath the download roots: relative ones are checked against the first.
            for folder in rules.sites.compactMap(\.directory) + rules.categories.map(\.directory) {
                _ = try roots.confine(folder, isDirectory: true)
            }
            // Kept first: rules in force are rules the next start has too.
            try await perform {
                try DaemonFiles.writeRules(rules, in: manager.stateDirectory)
                try await manager.setRules(rules)
            }
            return try await self.rules().response(from: request, context: context)
        }
    }

    /// The methods a route answers 405 to when it does not have them. (HEAD stays with the server,
    /// which answers it for GET routes.)
    static let otherMethods: [HTTPRequest.Method] = [
        .get, .post, .put, .patch, .delete, .options, .trace, HTTPRequest.Method("QUERY")!,
    ]

    // MARK: Operations

    private func add(_ request: Request, context: DaemonRequestContext) async throws -> Response {
        let body = try await request.decode(as: AddDownloads.self, context: context)
        guard !body.downloads.isEmpty else { throw APIError.badRequest("\"downloads\" is empty") }
        // Every item is checked before any is added: a bad one adds nothing.
        var requests: [(DownloadRequest, DownloadPriority)] = []
        for (index, item) in body.downloads.enumerated() {
            do {
                requests.append(try await makeRequest(item))
            } catch let error as APIError {
                throw error.prefixed("downloads.\(index)")
            }
        }
        // The queue's own refusals too, before anything changes: an overwrite removes the download
        // it replaces, which a later refusal could not give back.
        if let refusal = try await perform({ try await manager.refusal(of: requests.map(\.0)) }) {
            throw APIError(refusal.error).prefixed("downloads.\(refusal.index)")
        }
        var files = Set<String>()
        for (index, (downloadRequest, _)) in requests.enumerated() {
            guard case .file(let path) = downloadRequest.destination else { continue }
            guard files.insert(path).inserted else {
                throw APIError(.conflict, "destinationExists", "downloads.\(index): \(path) is given twice")
            }
        }
        // IDs grow: one above the newest now is a download this request added.
        let newest = try await perform { try await manager.newestID() }
        // Items of one priority in a row are added together, a transaction's worth per call, so
        // that a call that fails added nothing.
        var added: [DownloadBody] = []
        var start = 0
        while start < requests.count {
            let priority = requests[start].1
            let run = requests[start...].prefix(DownloadManager.enqueueBatch)
            let end = run.firstIndex { $0.1 != priority } ?? run.endIndex
            do {
                let infos = try await perform {
                    try await manager.add(requests[start..<end].map(\.0), priority: priority)
                }
                added += infos.map(DownloadBody.init)
            } catch let error as APIError {
                // The ones this request added before it are taken back: it adds all or nothing.
                for body in added where body.info.id > newest {
                    try? await manager.remove(body.info.id, deletingFiles: false)
                }
                throw start == end - 1 ? error.prefixed("downloads.\(start)") : error
            }
            start = end
        }
        return try EditedResponse(status: .created, response: AddedDownloads(downloads: added))
            .response(from: request, context: context)
    }

    private func makeRequest(_ item: NewDownload) async throws -> (DownloadRequest, DownloadPriority) {
        var request = item.request
        try Self.checkURL(request.url)
        switch request.destination {
        case .file(let path): request.destination = .file(try roots.confine(path, isDirectory: false))
        case .directory(let path): request.destination = .directory(try roots.confine(path, isDirectory: true))
        }
        // The library's own rules (limits, connections, headers), before anything is queued.
        _ = try await perform { try request.check() }
        return (request, DownloadPriority(item.priority ?? 0))
    }

    private func list(_ request: Request) async throws -> Response {
        let query = request.uri.queryParameters
        var states: Set<DownloadState>?
        if let names = query.get("state") {
            guard !names.isEmpty else {
                throw APIError.badRequest("state is empty: give one or more, separated by commas")
            }
            states = []
            for name in names.split(separator: ",") {
                guard let state = DownloadState(rawValue: String(name)) else {
                    let known = DownloadState.allCases.map(\.rawValue).joined(separator: ", ")
                    throw APIError.badRequest("unknown state \"\(name)\" (known: \(known))")
                }
                states?.insert(state)
            }
        }
        let offset = try Self.number(query.get("offset"), "offset", default: 0, in: 0...Int.max)
        let limit = try Self.number(query.get("limit"), "limit", default: 100, in: 1...1000)
        // Taken before the list: an event stream opened from it replays whatever changed since.
        let lastEventID = hub.lastEventID
        // One page from the store, and the total from its counts: a queue of any size.
        let page = try await perform { try await manager.downloads(in: states, offset: offset, limit: limit) }
        return try JSONBody.response(
            DownloadList(
                downloads: page.downloads.map(DownloadBody.init), total: page.total, offset: offset, limit: limit,
                lastEventId: lastEventID))
    }

    /// `text/event-stream`: what the client missed since its `Last-Event-ID` (or a reset), then every
    /// event as it happens, with a comment line when nothing happened for ``keepAlive``.
    private func events(_ request: Request) -> Response {
        let last = request.headers[HTTPField.Name("Last-Event-ID")!] ?? request.uri.queryParameters.get("lastEventId")
        let hub = self.hub
        let (start, position, events) = hub.listen(
            after: last.flatMap(hub.number(ofLastEventID:)), fresh: last == nil)
        let keepAlive = self.keepAlive
        let body = ResponseBody { writer in
            var opening = "retry: 2000\n\n"
            switch start {
            case .reset: opening += "event: reset\ndata: {}\n\n"
            case .replay(let missed): opening += missed.map(hub.text).joined()
            }
            // Where the stream stands: every event up to this one is accounted for above (a message
            // with only an ID moves a client's Last-Event-ID without an event).
            opening += "id: \(hub.run)-\(position)\n\n"
            try await writer.write(ByteBuffer(string: opening))
            // Bounded: a client that stops reading is cut off once this fills (it reconnects with
            // Last-Event-ID and gets what it missed), instead of holding the daemon's memory.
            let (lines, output) = AsyncStream<String>.makeStream(
                bufferingPolicy: .bufferingOldest(EventHub.listenerBuffer))
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await event in events {
                        if case .dropped = output.yield(hub.text(event)) { break }
                    }
                    output.finish()
                }
                group.addTask {
                    while true {
                        try await Task.sleep(for: keepAlive)
                        if case .dropped = output.yield(": keep-alive\n\n") { output.finish() }
                    }
                }
                defer { group.cancelAll() }
                for await line in lines { try await writer.write(ByteBuffer(string: line)) }
                group.cancelAll()
            }
            try await writer.finish(nil)
        }
        return Response(
            status: .ok,
            headers: [
                .contentType: "text/event-stream; charset=utf-8", .cacheControl: "no-store",
                HTTPField.Name("X-Accel-Buffering")!: "no",
            ], body: body)
    }

    private func options() async -> OptionsBody {
        let configuration = await manager.configuration
        return OptionsBody(
            maxConcurrentDownloads: configuration.maxConcurrentDownloads,
            totalLimitRate: configuration.bytesPerSecondLimit)
    }

    private func rules() async -> RulesBody {
        let now = await manager.rulesInForce
        return RulesBody(
            rules: await manager.configuration.rules,
            now: .init(limitRate: now.bytesPerSecond, startsDownloads: now.startsDownloads))
    }

    private func stats() async throws -> StatsBody {
        let stored = try await perform { try await manager.counts() }
        var counts = Dictionary(uniqueKeysWithValues: DownloadState.allCases.map { ($0.rawValue, 0) })
        for (state, count) in stored { counts[state.rawValue] = count }
        let progress = await manager.aggregateProgress()
        return StatsBody(
            bytesPerSecond: progress.bytesPerSecond, bytes: progress.bytes, totalBytes: progress.totalBytes,
            counts: counts, worker: manager.workerName)
    }

    private func current(_ id: DownloadID) async throws -> Response {
        guard let info = await manager.download(id) else { throw Self.unknown(id) }
        return try JSONBody.response(DownloadBody(info))
    }

    // MARK: Helpers

    /// Runs a manager operation; its ``HaulError`` becomes the API's error.
    private func perform<Value>(_ operation: () async throws -> Value) async throws -> Value {
        do {
            return try await operation()
        } catch let error as HaulError {
            throw APIError(error)
        }
    }

    private static func id(_ context: some RequestContext) throws -> DownloadID {
        guard let text = context.parameters.get("id"), let number = Int64(text), number > 0 else {
            throw APIError.badRequest("a download ID is a positive number")
        }
        return DownloadID(number)
    }

    private static func unknown(_ id: DownloadID) -> APIError {
        APIError(.notFound, HaulError.Code.unknownDownload.name, "no download with ID \(id)")
    }

    private static func flag(_ request: Request, _ name: String) throws -> Bool {
        switch request.uri.queryParameters.get(name) {
        case nil, "false", "0": return false
        case "true", "1", "": return true
        case let other?: throw APIError.badRequest("\(name) is true or false, got \"\(other)\"")
        }
    }

    private static func number(_ text: String?, _ name: String, default value: Int, in range: ClosedRange<Int>) throws
        -> Int
    {
        guard let text else { return value }
        guard let number = Int(text), range.contains(number) else {
            let bounds = range.upperBound == Int.max ? "" : " to \(range.upperBound)"
            throw APIError.badRequest(
                "\(name) must be a whole number from \(range.lowerBound)\(bounds), got \"\(text)\"")
        }
        return min(number, range.upperBound)
    }

    /// An http or https URL with a host (the pattern the OpenAPI document gives); the queue checks
    /// the rest.
    static func checkURL(_ text: String) throws {
        let lower = text.lowercased()
        let rest =
            lower.hasPrefix("http://") ? lower.dropFirst(7) : lower.hasPrefix("https://") ? lower.dropFirst(8) : nil
        // Printable ASCII only, as in a request line: other characters are percent-encoded.
        guard let rest, let first = rest.first, !"/?#".contains(first),
            text.unicodeScalars.allSatisfy({ (0x21...0x7E).contains($0.value) })
        else { throw APIError(HaulError(.invalidURL, "\"\(text)\" is not an http or https URL")) }
    }

}

/// Collects the routes ``API/register(on:recording:)`` adds.
final class RouteRecorder: @unchecked Sendable {
    // Filled by one call on one task, then read.
    var routes: [(method: HTTPRequest.Method, path: String)] = []
}

/// The directories the daemon may write downloads into. A destination is accepted only when the
/// deepest directory of it that exists lies, symbolic links resolved, inside one of them, and the
/// rest of the path has no `..`: the API cannot be used to write `~/.ssh/authorized_keys`.
struct DownloadRoots: Sendable {
    let directories: [String]
    /// Directories never written into, even inside a root: the daemon's state directory.
    let forbidden: [String]

    /// The roots, made absolute with links resolved; throws for one that is not a directory.
    init(_ paths: [String], forbidden: [String] = []) throws {
        self.forbidden = forbidden.compactMap { Self.resolve(POSIX.absolutePath($0)) }
        directories = try paths.map { path in
            let absolute = POSIX.absolutePath(path)
            guard POSIX.isDirectory(absolute), let resolved = Self.resolve(absolute) else {
                throw HaulError(.invalidArgument, "the download root \(absolute) is not a directory")
            }
            return resolved
        }
        if directories.isEmpty { throw HaulError(.invalidArgument, "at least one download root is needed") }
    }

    /// `path` (relative ones from the first root) made absolute, when it lies inside a root.
    func confine(_ path: String, isDirectory: Bool) throws -> String {
        guard !path.isEmpty, !path.contains("\0") else { throw APIError.badRequest("a path is empty or holds a NUL") }
        if POSIX.pathComponents(path).contains("..") {
            throw APIError(
                .forbidden, HaulError.Code.outsideDownloadRoot.name, "a path with \"..\" is refused: \(path)")
        }
        let absolute = POSIX.absolutePath(path.utf8.first == UInt8(ascii: "/") ? path : directories[0] + "/" + path)
        // The deepest part that exists decides where the path really leads.
        var existing = absolute
        var rest: [String] = []
        while !POSIX.exists(existing), existing != "/", let (parent, name) = POSIX.splitAtLastSlash(existing) {
            rest.insert(name, at: 0)
            existing = parent.isEmpty ? "/" : parent
        }
        guard let resolved = Self.resolve(existing) else {
            throw APIError.badRequest("cannot resolve \(existing)")
        }
        var real = ([resolved == "/" ? "" : resolved] + rest).joined(separator: "/")
        if real.isEmpty { real = "/" }
        guard let root = directories.first(where: { Self.contains($0, real) }) else {
            throw APIError(
                .forbidden, HaulError.Code.outsideDownloadRoot.name,
                "\(path) is outside the download roots (\(directories.joined(separator: ", ")))")
        }
        if forbidden.contains(where: { Self.contains($0, real) }) {
            throw APIError(
                .forbidden, HaulError.Code.outsideDownloadRoot.name, "\(path) is in the daemon's state directory")
        }
        // Dot files and dot directories hold settings and keys (.ssh, .bashrc, .config): never written.
        let inside = String(decoding: real.utf8.dropFirst(root.utf8.count), as: UTF8.self)
        if POSIX.pathComponents(inside).contains(where: { $0.utf8.first == UInt8(ascii: ".") }) {
            throw APIError(
                .forbidden, HaulError.Code.outsideDownloadRoot.name, "\(path) is or lies in a hidden file or directory")
        }
        if !isDirectory && real == resolved && POSIX.isDirectory(real) {
            throw APIError(.conflict, "destinationExists", "\(path) is a directory: give it as \"directory\"")
        }
        return real
    }

    /// Whether `path` is `directory` or lies in it, byte for byte: Swift's `==` takes two spellings
    /// of one accented letter for one, which Linux takes for two directories.
    private static func contains(_ directory: String, _ path: String) -> Bool {
        let prefix = directory == "/" ? "/" : directory + "/"
        return path.utf8.elementsEqual(directory.utf8) || path.utf8.starts(with: prefix.utf8)
    }

    private static func resolve(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }
}
