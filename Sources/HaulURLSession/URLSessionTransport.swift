import Haul
import NIOCore
import Synchronization

#if canImport(FoundationNetworking)
    import Foundation
    import FoundationNetworking
#else
    import Foundation
#endif

/// A ``Haul/DownloadTransport`` on `URLSession`: each request of a download (the first one and each
/// range) is one `URLSession` task, and Haul checks and stores every answer as it does with its own
/// client.
///
/// ```swift
/// var configuration = DownloaderConfiguration()
/// configuration.transport = URLSessionTransport()
/// let manager = try DownloadManager(downloaderConfiguration: configuration)
/// ```
///
/// Two modes:
/// - ``Mode/streaming`` (the default) runs data tasks: the body streams into the partial file as it
///   arrives, as with Haul's own client.
/// - ``Mode/files(directory:)`` runs download tasks: `URLSession` writes the body to a file, which
///   is moved into `directory` as soon as the task finishes; Haul then checks it (status,
///   `Content-Range`, validator, length, `Content-Digest`) and writes it into the partial file at its
///   offset. This is the mode of a background session.
///
/// The session's own cookies, cache and redirects are turned off: Haul sends the cookies, follows
/// redirects itself (credentials never leave their origin) and never takes a cached answer.
/// `URLSession` picks the HTTP version, the connections and the proxy (the system's, or the
/// configuration's `connectionProxyDictionary`); a downloader whose configuration sets Haul's own
/// proxy, trusted certificates or HTTP/1.1 only is refused (``check(_:)``).
///
/// On Linux this runs on FoundationNetworking's `URLSession` (libcurl), which has no background
/// sessions and cannot hold a data task back: `suspend()` there ends the request and `resume()`
/// sends it again from the first byte. So the body of a streaming task is kept in memory when it
/// arrives faster than Haul writes it (under a rate limit, say); for Apple platforms the transport
/// is written to suspend the task once 8 MiB wait and resume it when they are written.
///
/// An answer's headers come from `HTTPURLResponse.allHeaderFields`: their order is lost, and a
/// header sent several times (`Set-Cookie`) arrives as one, its values joined by commas. A session
/// that followed a redirect by itself (a background session does, whatever its delegate says) has
/// its answer refused (``Haul/HaulError/Code/redirectRefused``): Haul could not check where it led.
public final class URLSessionTransport: DownloadTransport {
    /// How the body of an answer reaches Haul.
    public enum Mode: Sendable, Equatable {
        /// Data tasks: the body as it arrives.
        case streaming
        /// Download tasks: the body as a finished file, moved into `directory` (which must exist).
        case files(directory: String)
    }

    /// How bodies reach Haul.
    public let mode: Mode
    private let session: SessionBox
    /// The session of requests the system may put off (``Haul/NetworkAccess/isDiscretionary``).
    private let discretionarySession: SessionBox?
    private let router: TaskRouter

    /// A transport on a session made from `configuration` (with its cookies, cache and redirects
    /// turned off, as Haul needs).
    ///
    /// - Parameters:
    ///   - configuration: the session's configuration; `.ephemeral` unless given.
    ///   - mode: data tasks (``Mode/streaming``) or download tasks (``Mode/files(directory:)``).
    public init(configuration: URLSessionConfiguration = .ephemeral, mode: Mode = .streaming) {
        self.mode = mode
        let configuration = configuration.copy() as? URLSessionConfiguration ?? configuration
        configuration.httpShouldSetCookies = false
        configuration.httpCookieAcceptPolicy = .never
        configuration.httpCookieStorage = nil
        configuration.urlCache = nil
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        if case .files(let directory) = mode { HeldAnswers(directory: directory).sweep(olderThan: 7 * 24 * 3600) }
        let router = TaskRouter(mode: mode)
        self.router = router
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        queue.name = "haul.urlsession"
        session = SessionBox(URLSession(configuration: configuration, delegate: router, delegateQueue: queue))
        // The system may put off the requests of a download that allows it: they go through a session
        // of their own (discretion is a session's setting), with the same delegate. A background
        // session is one of a kind: its own discretion, set by the app, holds for all.
        if configuration.identifier == nil {
            let discretionary = configuration.copy() as? URLSessionConfiguration ?? configuration
            discretionary.isDiscretionary = true
            discretionarySession = SessionBox(
                URLSession(configuration: discretionary, delegate: router, delegateQueue: queue))
        } else {
            discretionarySession = nil
        }
    }

    /// Refuses the settings `URLSession` takes from elsewhere: Haul's proxies (the session's
    /// `connectionProxyDictionary` or the system's apply), trusted certificate files (the system's
    /// trust applies) and HTTP/1.1 only (the session chooses).
    public func check(_ configuration: DownloaderConfiguration) throws {
        if configuration.proxy.http != nil || configuration.proxy.https != nil {
            throw HaulError(
                .invalidArgument,
                "URLSessionTransport does not take Haul's proxy settings: give the session's "
                    + "connectionProxyDictionary instead")
        }
        if !configuration.tls.trustedCertificateFiles.isEmpty {
            throw HaulError(
                .invalidArgument,
                "URLSessionTransport trusts what the system trusts: it cannot add trusted certificate files")
        }
        if case .files = mode, configuration.segmentation.connections > 1 || configuration.segmentation.adaptive {
            throw HaulError(
                .invalidArgument,
                "URLSessionTransport with download tasks fetches a file over one connection: set connections "
                    + "to 1 and turn the ramp off")
        }
        if !configuration.tls.allowHTTP2 {
            throw HaulError(
                .invalidArgument, "URLSessionTransport cannot be held to HTTP/1.1: URLSession picks the version")
        }
    }

    /// Sends `request` as a task of the session: a data task, or a download task described by its
    /// download, URL and first byte (an answer held for that description, or a running task with
    /// it, is taken instead of a new request). Cancelling the calling task cancels the task.
    public func send<Result>(
        _ request: TransportRequest, receive: (TransportResponse) async -> Result
    ) async throws -> Result {
        if case .files = mode, request.connection > 0 {
            throw HaulError(
                .invalidArgument,
                "URLSessionTransport with download tasks fetches a file over one connection: this download "
                    + "asks for more (its own connections, or its mirrors)")
        }
        let session = request.networkAccess.isDiscretionary ? discretionarySession ?? session : session
        let task: URLSessionTask
        switch mode {
        case .streaming:
            task = session.value.dataTask(with: Self.urlRequest(request))
        case .files:
            let key = HeldAnswers.key(for: request)
            // The answer of a task that finished while nobody waited: the download's next request takes it.
            if let held = router.held?.take(key) { return await Self.deliver(held, to: receive) }
            // A task the session still runs for it (started by an earlier run, or let go): followed, not sent again.
            if let running = await Self.task(described: key, in: session.value) {
                task = running
            } else {
                task = session.value.downloadTask(with: Self.urlRequest(request))
                task.taskDescription = key
            }
        }
        let exchange = Exchange(task: TaskBox(task), request: request, held: router.held)
        router.register(exchange, for: task)
        if task.state == .completed {
            // It ended before it was followed: its answer is held, or it failed. Forgotten first, so
            // that a file the session delivers late is held for the next request; then released, so
            // that one it delivered to this request meanwhile is removed.
            router.forget(task, exchange)
            defer { exchange.release() }
            guard let held = task.taskDescription.flatMap({ router.held?.take($0) }) else {
                throw URLError(.networkConnectionLost)
            }
            return await Self.deliver(held, to: receive)
        }
        if let response = task.response, task.countOfBytesReceived > 0 { exchange.progressed(response: response) }
        defer {
            // The answer was read as far as Haul wanted: the rest is not fetched.
            if !exchange.isComplete && !exchange.isLetGo { task.cancel() }
            // Released before it is ended: whichever of the end and the task's last event comes
            // second sees the other, and forgets the request.
            exchange.release()
            router.end(task, exchange)
        }
        let response = try await withTaskCancellationHandler {
            try await exchange.answer()
        } onCancel: {
            task.cancel()
        }
        return await withTaskCancellationHandler {
            await receive(response)
        } onCancel: {
            task.cancel()
        }
    }

    /// Gives `receive` a held answer; its body file is removed afterwards, read or not.
    private static func deliver<Result>(
        _ held: (head: HeldAnswers.Head, body: String), to receive: (TransportResponse) async -> Result
    ) async -> Result {
        let result = await receive(held.head.response(body: .file(atPath: held.body, removingIt: true)))
        try? FileManager.default.removeItem(atPath: held.body)
        return result
    }

    /// The `URLRequest` of `request`: its headers exactly, no cookies or cache of the session's.
    private static func urlRequest(_ request: TransportRequest) -> URLRequest {
        var outgoing = URLRequest(url: request.url)
        outgoing.httpMethod = "GET"
        outgoing.httpShouldHandleCookies = false
        outgoing.cachePolicy = .reloadIgnoringLocalCacheData
        for (name, value) in request.headers { outgoing.addValue(value, forHTTPHeaderField: name) }
        #if canImport(Darwin)
            outgoing.allowsExpensiveNetworkAccess = request.networkAccess.allowsExpensiveNetworkAccess
            outgoing.allowsConstrainedNetworkAccess = request.networkAccess.allowsConstrainedNetworkAccess
        #endif
        return outgoing
    }

    /// The session's running task described by `key`, if there is one.
    private static func task(described key: String, in session: URLSession) async -> URLSessionTask? {
        let tasks = await withCheckedContinuation { continuation in
            session.getAllTasks { tasks in continuation.resume(returning: TaskList(tasks)) }
        }
        return tasks.value.first { $0.taskDescription == key && $0.state == .running }
    }

    /// Lets every request go without stopping its task, as an app that is killed does while the
    /// system carries its transfers on: each request fails, and what its task brings is held for
    /// the download's next request.
    func letGo() {
        for exchange in router.forgetAll() { exchange.letGo() }
    }

    /// `URLError`s by what they mean: a refused connection, a failed TLS handshake or a URL the
    /// session cannot send are told apart from failures worth another attempt.
    public func failure(of error: any Error, sending request: TransportRequest) -> TransportFailure {
        if let error = error as? HaulError { return TransportFailure(error) }
        let host = request.url.host ?? request.url.absoluteString
        let port = request.url.port ?? (request.url.scheme?.lowercased() == "https" ? 443 : 80)
        guard let urlError = error as? URLError else {
            return .retryable(HaulError(.network, "transfer from \(host) failed: \(error)", underlying: error))
        }
        switch urlError.code {
        case .cancelled:
            return .cancelled
        case .timedOut:
            return .retryable(HaulError(.timedOut, "no answer from \(host) in time", underlying: error))
        case .cannotConnectToHost:
            return .refused(HaulError(.network, "cannot connect to \(host):\(port)", underlying: error))
        case .cannotFindHost, .dnsLookupFailed:
            return .retryable(HaulError(.network, "cannot resolve \(host)", underlying: error))
        case .networkConnectionLost:
            return .retryable(HaulError(.network, "\(host) closed the connection", underlying: error))
        case .secureConnectionFailed, .serverCertificateUntrusted, .serverCertificateHasBadDate,
            .serverCertificateNotYetValid, .serverCertificateHasUnknownRoot, .clientCertificateRejected,
            .clientCertificateRequired:
            return .fatal(HaulError(.tls, "TLS with \(host) failed: \(urlError.code.rawValue)", underlying: error))
        case .appTransportSecurityRequiresSecureConnection, .userAuthenticationRequired, .cannotDecodeContentData,
            .cannotDecodeRawData:
            return .fatal(
                HaulError(
                    .network, "URLSession refused the answer from \(host) (URLError \(urlError.code.rawValue))",
                    underlying: error))
        case .badURL, .unsupportedURL:
            return .fatal(
                HaulError(.invalidURL, "URLSession cannot send \(request.url.absoluteString)", underlying: error))
        default:
            return .retryable(
                HaulError(
                    .network, "transfer from \(host) failed (URLError \(urlError.code.rawValue))", underlying: error))
        }
    }

    /// Cancels the session's tasks and invalidates it; a background session's tasks are let go
    /// instead, for the system to carry on and the next run to take (closing the queue must not end
    /// its transfers).
    public func shutdown() async throws {
        guard session.value.configuration.identifier == nil else {
            letGo()
            return
        }
        session.value.invalidateAndCancel()
        discretionarySession?.value.invalidateAndCancel()
    }
}

/// A value the session's queue and Haul's tasks both use, which Foundation does not mark `Sendable`
/// on every platform. `URLSession` and its tasks are safe to use from any thread.
struct SessionBox: @unchecked Sendable {
    let value: URLSession
    init(_ value: URLSession) { self.value = value }
}

/// The tasks of a session, passed between threads (see ``SessionBox``).
struct TaskList: @unchecked Sendable {
    let value: [URLSessionTask]
    init(_ value: [URLSessionTask]) { self.value = value }
}

/// A task, passed between threads (see ``SessionBox``).
struct TaskBox: @unchecked Sendable {
    let value: URLSessionTask
    init(_ value: URLSessionTask) { self.value = value }
}
