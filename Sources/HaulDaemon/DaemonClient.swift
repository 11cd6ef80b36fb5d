import AsyncHTTPClient
import Haul
import NIOCore
import NIOHTTP1

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A client of the `haul daemon` that runs on a state directory: what the CLI uses instead of the
/// database when a daemon runs, so that the daemon's queue is the one that downloads.
///
/// Every failure is a ``HaulError`` with the daemon's code (`unknownDownload`, `invalidState`, …), or
/// `network` when the daemon cannot be reached.
public final class DaemonClient: Sendable {
    /// The daemon's base URL.
    public let url: String
    /// The daemon's process ID, when known from its address file.
    public let processID: Int32?
    private let token: String
    let client: HTTPClient

    /// The daemon that runs on `stateDirectory`, if one does (its address file exists and its lock is
    /// held); `nil` otherwise. Call ``shutdown()`` when done.
    public static func running(on stateDirectory: String) throws -> DaemonClient? {
        guard let address = DaemonFiles.runningDaemon(in: stateDirectory),
            let token = try DaemonFiles.existingToken(in: stateDirectory)
        else { return nil }
        return DaemonClient(url: address.url, token: token, processID: address.processID)
    }

    /// A client of the daemon at `url`, with its token.
    public init(url: String, token: String, processID: Int32? = nil) {
        self.url = url
        self.token = token
        self.processID = processID
        // The event stream sends a comment at least every 15 s: a minute of silence is a daemon
        // that hangs, not one that has nothing to say.
        var configuration = HTTPClient.Configuration(timeout: .init(connect: .seconds(5), read: .seconds(60)))
        // A daemon that is gone refuses at once: that is the answer, not a reason to try for seconds.
        configuration.connectionPool.retryConnectionEstablishment = false
        // The daemon closes a connection idle for 30 s: let go of it first, so no request goes out
        // on one the daemon is closing.
        configuration.connectionPool.idleTimeout = .seconds(20)
        self.client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
    }

    /// Closes the client's connections.
    public func shutdown() async throws { try await client.shutdown() }

    /// Queues downloads in the daemon: all of them, or none when one is refused.
    /// - Throws: ``HaulError/Code/credentialsForRemoteDaemon`` when a request carries credentials
    ///   and the daemon is not on this machine.
    public func add(_ requests: [DownloadRequest], priority: DownloadPriority = .normal) async throws -> [DownloadInfo]
    {
        try refuseCredentials(requests.contains { request in request.headers.contains { request.isSecret($0.name) } })
        let items = requests.map { NewDownload($0, priority: priority.rawValue) }
        let added: AddedDownloads = try await call(.POST, "/downloads", body: AddDownloads(downloads: items))
        return added.downloads.map(\.info)
    }

    /// Every download of the daemon (in `states`, when given), oldest first.
    public func downloads(in states: Set<DownloadState>? = nil) async throws -> [DownloadInfo] {
        let filter = states.map { "&state=" + $0.map(\.rawValue).sorted().joined(separator: ",") } ?? ""
        var all: [DownloadInfo] = []
        while true {
            let page: DownloadList = try await call(.GET, "/downloads?offset=\(all.count)&limit=1000\(filter)")
            all += page.downloads.map(\.info)
            if page.downloads.isEmpty || all.count >= page.total { return all }
        }
    }

    /// Credentials cross the network in the clear to a daemon elsewhere: they go only to one on this machine.
    private func refuseCredentials(_ carried: Bool) throws {
        guard carried, !isLocal else { return }
        throw HaulError(
            .credentialsForRemoteDaemon,
            "the haul daemon at \(url) is not on this machine: credentials are not sent to it")
    }

    /// The ID of the daemon's last event: every change up to now comes in an event stream up to it.
    public func lastEventID() async throws -> String {
        let page: DownloadList = try await call(.GET, "/downloads?limit=1")
        return page.lastEventId
    }

    /// Whether the daemon listens on a loopback address, so that what is sent to it stays on this machine.
    public var isLocal: Bool {
        guard let host = URL(string: url)?.host else { return false }
        return Daemon.isLoopback(host.hasPrefix("[") ? String(host.dropFirst().dropLast()) : host)
    }

    /// One download.
    public func download(_ id: DownloadID) async throws -> DownloadInfo {
        let body: DownloadBody = try await call(.GET, "/downloads/\(id)")
        return body.info
    }

    /// Pauses a download; returns it as it stands then.
    @discardableResult
    public func pause(_ id: DownloadID) async throws -> DownloadInfo {
        let body: DownloadBody = try await call(.POST, "/downloads/\(id)/pause")
        return body.info
    }

    /// Queues a paused download again, from `url` when given, with `headers` in place of the stored
    /// ones (those named in `secretHeaders` held as secret) and `credentials` beside them when given
    /// (secrets are held in the daemon's memory only).
    @discardableResult
    public func resume(
        _ id: DownloadID, url: String? = nil, headers: [(name: String, value: String)]? = nil,
        secretHeaders: Set<String> = [], credentials: BasicCredentials? = nil
    ) async throws -> DownloadInfo {
        let (plain, written) = url.map(DownloadRequest.splittingCredentials) ?? (nil, nil)
        let credentials = credentials ?? written
        try refuseCredentials(
            credentials != nil
                || headers?.contains { DownloadRequest.isSecret($0.name, marked: secretHeaders) } == true)
        let resume = ResumeBody(
            url: plain, headers: headers.map { Self.headers($0, marked: secretHeaders) },
            credentials: credentials.map { .init(user: $0.user, password: $0.password) })
        let body: DownloadBody = try await call(.POST, "/downloads/\(id)/resume", body: resume)
        return body.info
    }

    /// Queues a failed or cancelled download again.
    @discardableResult
    public func retry(_ id: DownloadID) async throws -> DownloadInfo {
        let body: DownloadBody = try await call(.POST, "/downloads/\(id)/retry")
        return body.info
    }

    /// Removes a download, and its files when `deletingFiles`.
    public func remove(_ id: DownloadID, deletingFiles: Bool = false) async throws {
        let _: Empty = try await call(.DELETE, "/downloads/\(id)?deleteFiles=\(deletingFiles)")
    }

    private struct Empty: Codable {}

    /// Headers as the API takes them, those named in `marked` flagged secret.
    private static func headers(_ headers: [(name: String, value: String)], marked: Set<String>)
        -> [DownloadRequest.Header]
    {
        headers.map { header in
            let secret = DownloadRequest.isSecret(header.name, marked: marked)
            return DownloadRequest.Header(name: header.name, value: header.value, secret: secret ? true : nil)
        }
    }

    /// The daemon's error answer as a ``HaulError`` with its code.
    static func failure(_ status: HTTPResponseStatus, _ body: ByteBuffer) -> HaulError {
        let failure = try? JSONDecoder().decode(ErrorResponse.self, from: Data(body.readableBytesView))
        return HaulError(
            HaulError.Code(failure?.error.code ?? "httpStatus"),
            failure?.error.message ?? "the haul daemon answered \(status.code)",
            downloadID: failure?.error.downloadId.map(DownloadID.init))
    }

    func call<Answer: Decodable>(_ method: HTTPMethod, _ path: String) async throws -> Answer {
        try await send(method, path, body: nil)
    }

    func call<Answer: Decodable>(_ method: HTTPMethod, _ path: String, body: some Encodable) async throws
        -> Answer
    {
        // Secrets go only to a daemon on this machine: the verbs that send them check that first.
        try await send(method, path, body: try JSONBody.encode(body, includingSecrets: true))
    }

    /// A request to the API with the token.
    func request(_ method: HTTPMethod, _ path: String) -> HTTPClientRequest {
        var request = HTTPClientRequest(url: url + "/api/v1" + path)
        request.method = method
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        return request
    }

    private func send<Answer: Decodable>(_ method: HTTPMethod, _ path: String, body: ByteBuffer?) async throws
        -> Answer
    {
        var request = request(method, path)
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(body)
        }
        let response: HTTPClientResponse
        let bytes: ByteBuffer
        do {
            response = try await client.execute(request, timeout: .seconds(30))
            bytes = try await response.body.collect(upTo: 64 << 20)
        } catch {
            throw HaulError(.network, "cannot reach the haul daemon at \(url): \(error)")
        }
        let decoder = JSONDecoder()
        decoder.userInfo[DownloadRequest.describesDownload] = true
        decoder.dateDecodingStrategy = .iso8601
        guard (200..<300).contains(response.status.code) else { throw Self.failure(response.status, bytes) }
        if response.status == .noContent, let empty = Empty() as? Answer { return empty }
        do {
            return try decoder.decode(Answer.self, from: Data(bytes.readableBytesView))
        } catch {
            throw HaulError(.protocolViolation, "the haul daemon at \(url) answered something unexpected: \(error)")
        }
    }
}
