import AsyncHTTPClient
import HTTPTypes
import Haul
import HummingbirdTesting
import Logging
import NIOCore
import NIOHTTP1
import Synchronization
import Testing

@testable import HaulDaemon

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A daemon running in this process over a temporary state directory, reached through its router
/// (no port: most API tests), or listening on a free loopback port with a real HTTP client to talk
/// to it (tests of the listener, event streams and clients of the daemon's address).
struct DaemonHarness: Sendable {
    let daemon: Daemon
    /// `http://127.0.0.1:PORT` when live.
    let url: String
    let port: Int
    let stateDirectory: String
    /// The download root.
    let root: String
    let client: HTTPClient
    let logs: LogRecorder
    /// The router's test client, when the daemon is reached without a port.
    let router: (any TestClientProtocol)?

    var token: String { daemon.token }

    /// An answer: status, headers, body as text.
    struct Answer: Sendable {
        let status: Int
        let headers: HTTPHeaders
        let body: String

        /// The body decoded as JSON.
        func json<Value: Decodable>(_ type: Value.Type) throws -> Value {
            try JSONDecoder.api.decode(type, from: Data(body.utf8))
        }

        /// The error code of an error answer.
        var errorCode: String? {
            (try? json(ErrorAnswer.self))?.error.code
        }
    }

    struct ErrorAnswer: Decodable {
        struct Detail: Decodable {
            let code: String
            let message: String
        }
        let error: Detail
    }

    /// Opens the event stream with the right token, from `lastEventID` when given.
    func openEvents(lastEventID: String? = nil) async throws -> HTTPClientResponse {
        var request = HTTPClientRequest(url: url + "/api/v1/events")
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        if let lastEventID { request.headers.add(name: "Last-Event-ID", value: lastEventID) }
        return try await client.execute(request, timeout: .seconds(30))
    }

    /// Sends a request; the right token unless `token` says otherwise (`.some(nil)`: none at all).
    func send(
        _ method: HTTPMethod, _ path: String, json body: String? = nil, token: String?? = .none,
        headers extra: [(String, String)] = []
    ) async throws -> Answer {
        var request = HTTPClientRequest(url: url + path)
        request.method = method
        let bearer: String? =
            switch token {
            case .none: self.token
            case .some(let given): given
            }
        if let bearer { request.headers.add(name: "Authorization", value: "Bearer \(bearer)") }
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: body))
        }
        for (name, value) in extra { request.headers.replaceOrAdd(name: name, value: value) }
        if let router {
            return try await Self.send(
                method, path, headers: request.headers, body: body.map { ByteBuffer(string: $0) }, through: router)
        }
        let response: HTTPClientResponse
        do {
            response = try await client.execute(request, timeout: .seconds(10))
        } catch let error as ChannelError where method == .GET && error == .ioOnClosedChannel {
            // A kept-alive connection the daemon closed (idle on its clock, which a test may move on
            // by minutes at once) as the request went out: sent again, as browsers do for a GET.
            response = try await client.execute(request, timeout: .seconds(10))
        } catch let error as HTTPClientError where method == .GET && error == .remoteConnectionClosed {
            response = try await client.execute(request, timeout: .seconds(10))
        }
        let bytes = try await response.body.collect(upTo: 16 << 20)
        return Answer(status: Int(response.status.code), headers: response.headers, body: String(buffer: bytes))
    }

    /// Sends a request through the router: no connection, the answer as the routes give it.
    private static func send(
        _ method: HTTPMethod, _ path: String, headers: HTTPHeaders, body: ByteBuffer?,
        through router: any TestClientProtocol
    ) async throws -> Answer {
        var fields = HTTPFields()
        for (name, value) in headers { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        let answer = try await router.executeRequest(
            uri: path, method: HTTPRequest.Method(method.rawValue)!, headers: fields, body: body)
        var answerHeaders = HTTPHeaders()
        for field in answer.headers { answerHeaders.add(name: field.name.rawName, value: field.value) }
        return Answer(status: answer.status.code, headers: answerHeaders, body: String(buffer: answer.body))
    }

    /// One download as the API shows it.
    func download(_ id: Int64) async throws -> DownloadAnswer {
        let answer = try await send(.GET, "/api/v1/downloads/\(id)")
        guard answer.status == 200 else { throw TestFailure("GET download \(id): \(answer.status) \(answer.body)") }
        return try answer.json(DownloadAnswer.self)
    }

    /// Polls the API until download `id` is in `state`.
    func waitFor(_ id: Int64, _ state: String, timeout: Duration = .seconds(20)) async throws -> DownloadAnswer {
        let deadline = ContinuousClock.now + timeout
        while true {
            let current = try await download(id)
            if current.state == state { return current }
            guard ContinuousClock.now < deadline else {
                throw TestFailure("download \(id) is \(current.state), not \(state): \(current.error?.message ?? "")")
            }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    /// Adds downloads; returns their IDs.
    func add(_ items: String) async throws -> [Int64] {
        let answer = try await send(.POST, "/api/v1/downloads", json: #"{"downloads": [\#(items)]}"#)
        guard answer.status == 201 else { throw TestFailure("add: \(answer.status) \(answer.body)") }
        return try answer.json(DownloadListAnswer.self).downloads.map(\.id)
    }
}

struct DownloadAnswer: Decodable, Sendable {
    struct Failure: Decodable, Sendable {
        let code: String
        let message: String
    }
    let id: Int64
    let url: String
    let name: String
    let destination: String?
    let state: String
    let priority: Int
    let bytes: Int64
    let totalBytes: Int64?
    let error: Failure?
    let hook: String?
    let connections: Int?
    let mirrors: [String]?
    let openConnections: Int?
}

struct DownloadListAnswer: Decodable, Sendable {
    let downloads: [DownloadAnswer]
    let total: Int?
}

extension JSONDecoder {
    static var api: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

/// Runs a daemon over a new temporary directory while `body` runs, then stops it: reached through
/// its router unless `live`, then on a free loopback port.
func withDaemon<Result: Sendable>(
    _ configure: (inout Daemon.Options) -> Void = { _ in },
    stateDirectory: String? = nil,
    clock: any Clock<Duration> = ContinuousClock(),
    live: Bool = false,
    _ body: @Sendable (DaemonHarness) async throws -> Result
) async throws -> Result {
    try await withTemporaryDirectory { directory in
        let state = stateDirectory ?? directory + "/state"
        let root = directory + "/files"
        mkdir(root, 0o755)
        var options = Daemon.Options(stateDirectory: state, downloadRoots: [root])
        options.port = 0
        options.manager = managerConfiguration(limit: 3)
        options.downloader = testConfiguration()
        configure(&options)
        let logs = LogRecorder(level: .trace)
        let daemon = try Daemon(options: options, logger: logs.logger, clock: clock)
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        if !live {
            let runtime = daemon.makeRuntime()
            let hooks = daemon.startHooks()
            var application = daemon.buildApplication(runtime)
            application.addServices(daemon.backgroundServices(runtime))
            do {
                let result = try await application.test(.router) { router in
                    try await body(
                        DaemonHarness(
                            daemon: daemon, url: "http://router", port: 0, stateDirectory: state, root: root,
                            client: client, logs: logs, router: router))
                }
                await daemon.closeManager()
                await hooks?.value
                try await client.shutdown()
                return result
            } catch {
                await daemon.closeManager()
                await hooks?.value
                try? await client.shutdown()
                throw error
            }
        }
        return try await withThrowingTaskGroup(of: Result?.self) { group in
            group.addTask {
                try await daemon.run()
                return nil
            }
            do {
                guard let url = await daemon.listeningURL(), let port = Int(url.split(separator: ":").last ?? "")
                else { throw TestFailure("the daemon did not start") }
                let harness = DaemonHarness(
                    daemon: daemon, url: url, port: port, stateDirectory: state, root: root, client: client, logs: logs,
                    router: nil)
                let result = try await body(harness)
                try await client.shutdown()
                await daemon.shutdown()
                while try await group.next() != nil {}
                return result
            } catch {
                try? await client.shutdown()
                await daemon.shutdown()
                while (try? await group.next()) != nil {}
                throw error
            }
        }
    }
}
