import Haul
import NIOCore
import Synchronization

#if canImport(FoundationNetworking)
    import Foundation
    import FoundationNetworking
#else
    import Foundation
#endif

/// The session's delegate: hands each task's events to the ``Exchange`` of the request it sends.
/// The session calls it on one serial queue.
final class TaskRouter: NSObject, URLSessionDataDelegate, URLSessionDownloadDelegate, @unchecked Sendable {
    private let mode: URLSessionTransport.Mode
    /// Where answers nobody waits for are kept (download tasks).
    let held: HeldAnswers?
    /// By task: two sessions (see ``URLSessionTransport``) number their tasks alike.
    private let exchanges = Mutex<[ObjectIdentifier: Exchange]>([:])

    init(mode: URLSessionTransport.Mode) {
        self.mode = mode
        if case .files(let directory) = mode { held = HeldAnswers(directory: directory) } else { held = nil }
    }

    /// Forgets every request; returns them.
    func forgetAll() -> [Exchange] {
        exchanges.withLock { exchanges in
            defer { exchanges = [:] }
            return Array(exchanges.values)
        }
    }

    func register(_ exchange: Exchange, for task: URLSessionTask) {
        exchanges.withLock { $0[ObjectIdentifier(task)] = exchange }
    }

    /// Haul is done with `task`'s request (`exchange`, released). Unless the task has ended, the
    /// request stays known until its last event: a body the task still finishes (it may, between
    /// the request's end and the task's cancel) is removed, not held for a later request.
    func end(_ task: URLSessionTask, _ exchange: Exchange) {
        if exchange.isComplete { forget(task, exchange) }
    }

    /// Forgets `task`'s request, if it is still `exchange` (a later request may follow the same task).
    func forget(_ task: URLSessionTask, _ exchange: Exchange) {
        exchanges.withLock { exchanges in
            if exchanges[ObjectIdentifier(task)] === exchange { exchanges[ObjectIdentifier(task)] = nil }
        }
    }

    private func exchange(_ task: URLSessionTask) -> Exchange? {
        exchanges.withLock { $0[ObjectIdentifier(task)] }
    }

    // Haul follows redirects itself: the redirect is the answer.
    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
        newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void
    ) {
        completionHandler(nil)
    }

    func urlSession(
        _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void
    ) {
        exchange(dataTask)?.answered(response)
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        exchange(dataTask)?.received(data)
    }

    func urlSession(_ session: URLSession, downloadTask: URLSessionDownloadTask, didFinishDownloadingTo location: URL) {
        // The file is the session's until this returns: it is moved at once.
        guard case .files(let directory) = mode else { return }
        guard let exchange = exchange(downloadTask) else {
            // Nobody waits for it (the app was not running, or let the request go): held for the
            // download's next request, by the task's description.
            if let key = downloadTask.taskDescription {
                try? held?.hold(location, response: downloadTask.response, key: key)
            }
            return
        }
        let path = directory + "/haul-body-" + UUID().uuidString
        do {
            try FileManager.default.moveItem(atPath: location.path, toPath: path)
            exchange.stored(at: path, response: downloadTask.response)
        } catch {
            exchange.completed(with: error)
        }
    }

    func urlSession(
        _ session: URLSession, downloadTask: URLSessionDownloadTask, didWriteData bytesWritten: Int64,
        totalBytesWritten: Int64, totalBytesExpectedToWrite: Int64
    ) {
        exchange(downloadTask)?.progressed(response: downloadTask.response)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let exchange = exchange(task) else { return }
        exchange.completed(with: error)
        // The task's last event: a request Haul is done with is forgotten now (see ``end(_:_:)``).
        if exchange.isReleased { forget(task, exchange) }
    }
}

/// One request on its way: its answer, once the session has one, and its body.
final class Exchange: Sendable {
    private struct State {
        var waiter: CheckedContinuation<TransportResponse, any Error>?
        var answer: Result<TransportResponse, any Error>?
        var complete = false
        /// Bytes received and not yet read by Haul.
        var buffered = 0
        var suspended = false
        /// The body as a file, with the answer it belongs to (download tasks).
        var stored: (path: String, response: URLResponse?)?
        /// Who waits for a download task's file, once its answer was given before the body was stored.
        var fileWaiter: CheckedContinuation<String, any Error>?
        var fileResult: Result<String, any Error>?
        /// When the download was last told that the server is heard from.
        var lastActivity: ContinuousClock.Instant?
        /// The request was let go while its task goes on (``URLSessionTransport/letGo()``).
        var letGo = false
        /// The request is over: a body file stored from now on is nobody's.
        var released = false
    }

    /// Bytes waiting for Haul past which a task is suspended (where suspending holds it back).
    static let highWater = 8 << 20
    /// Bytes waiting below which a suspended task goes on.
    static let lowWater = 2 << 20

    let task: TaskBox
    /// The request the task sends.
    let request: TransportRequest
    private let state = Mutex(State())
    private let feed: AsyncThrowingStream<ByteBuffer, any Error>.Continuation
    private let chunks: AsyncThrowingStream<ByteBuffer, any Error>

    /// Where answers of finished tasks are held (download tasks).
    private let held: HeldAnswers?

    init(task: TaskBox, request: TransportRequest, held: HeldAnswers?) {
        self.task = task
        self.request = request
        self.held = held
        (chunks, feed) = AsyncThrowingStream.makeStream(of: ByteBuffer.self, throwing: (any Error).self)
    }

    /// Whether the session has finished the task (its body is all received, or it failed).
    var isComplete: Bool { state.withLock { $0.complete } }

    /// Whether the request is over (``release()``).
    var isReleased: Bool { state.withLock { $0.released } }

    /// Whether the request was let go while its task goes on.
    var isLetGo: Bool { state.withLock { $0.letGo } }

    /// Fails the request without stopping its task (see ``URLSessionTransport/letGo()``).
    func letGo() {
        state.withLock { $0.letGo = true }
        // A data task's body has nowhere to go once nobody reads it.
        if task.value is URLSessionDataTask { task.value.cancel() }
        let error = URLError(.networkConnectionLost)
        feed.finish(throwing: error)
        fileSettled(.failure(error))
        settle(.failure(error))
    }

    /// Starts the task and waits for its answer.
    func answer() async throws -> TransportResponse {
        try Task.checkCancellation()
        return try await withCheckedThrowingContinuation { continuation in
            let ready = state.withLock { state -> Result<TransportResponse, any Error>? in
                if let answer = state.answer { return answer }
                state.waiter = continuation
                return nil
            }
            if let ready {
                continuation.resume(with: ready)
            } else {
                task.value.resume()
            }
        }
    }

    /// A data task's answer arrived: its body follows.
    func answered(_ response: URLResponse) {
        guard !refusedRedirect(response) else { return }
        // What Haul reads is counted only where a task can be held back by it.
        guard Self.canSuspend else { return settle(.success(Self.response(response, body: TransportBody(chunks)))) }
        let pump = BodyPump(chunks, exchange: self)
        let body = TransportBody(AsyncThrowingStream { try await pump.next() })
        settle(.success(Self.response(response, body: body)))
    }

    /// A data task received more of its body.
    func received(_ data: Data) {
        guard Self.canSuspend else {
            feed.yield(ByteBuffer(bytes: data))
            return
        }
        let suspend = state.withLock { state -> Bool in
            state.buffered += data.count
            guard !state.suspended, state.buffered >= Self.highWater else { return false }
            state.suspended = true
            return true
        }
        feed.yield(ByteBuffer(bytes: data))
        if suspend { task.value.suspend() }
    }

    /// Haul read `count` bytes of the body.
    func consumed(_ count: Int) {
        let resume = state.withLock { state -> Bool in
            state.buffered -= count
            guard state.suspended, state.buffered <= Self.lowWater else { return false }
            state.suspended = false
            return true
        }
        if resume { task.value.resume() }
    }

    /// A download task received more of its body: its answer is given as soon as its head is known,
    /// with a body that is read once the file is complete, and the download hears that the server is
    /// sending (at most four times a second).
    func progressed(response: URLResponse?) {
        let now = ContinuousClock.now
        let tell = state.withLock { state -> Bool in
            if let last = state.lastActivity, now - last < .milliseconds(250) { return false }
            state.lastActivity = now
            return true
        }
        if tell { request.noteActivity() }
        guard let response, !refusedRedirect(response) else { return }
        settle(.success(Self.response(response, body: .file(removingIt: true) { try await self.file() })))
    }

    /// Waits for the download task's file.
    private func file() async throws -> String {
        try await withCheckedThrowingContinuation { continuation in
            let ready = state.withLock { state -> Result<String, any Error>? in
                if let result = state.fileResult { return result }
                state.fileWaiter = continuation
                return nil
            }
            if let ready { continuation.resume(with: ready) }
        }
    }

    /// The file of the body is `result`: given to whoever waits for it, once.
    private func fileSettled(_ result: Result<String, any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<String, any Error>? in
            guard state.fileResult == nil else { return nil }
            state.fileResult = result
            defer { state.fileWaiter = nil }
            return state.fileWaiter
        }
        waiter?.resume(with: result)
    }

    /// Refuses an answer the session reached by following a redirect itself (a background session
    /// does, whatever its delegate says): Haul follows redirects so that credentials stay with their
    /// origin, and could not check this one. Returns whether it refused.
    private func refusedRedirect(_ response: URLResponse) -> Bool {
        guard let reached = response.url?.absoluteString, reached != request.url.absoluteString else { return false }
        settle(
            .failure(
                HaulError(
                    .redirectRefused,
                    "URLSession followed a redirect from \(request.url.absoluteString) to \(reached) by itself; "
                        + "give the final URL")))
        task.value.cancel()
        return true
    }

    /// A download task's body is in the file at `path`; removed at once when the request is over.
    func stored(at path: String, response: URLResponse?) {
        let over = state.withLock { state in
            state.stored = (path, response)
            return state.released
        }
        if over { release() }
    }

    /// The request is over: a download task's file nobody read (the answer was given up before its
    /// body was) is removed, now or when it is stored.
    func release() {
        let path = state.withLock { state -> String? in
            state.released = true
            guard let stored = state.stored else { return nil }
            state.stored = nil
            return stored.path
        }
        if let path { try? FileManager.default.removeItem(atPath: path) }
    }

    /// The session finished the task, with `error` if it failed.
    func completed(with error: (any Error)?) {
        let (stored, released) = state.withLock { state in
            state.complete = true
            return (state.stored, state.released)
        }
        if let error {
            if let stored { try? FileManager.default.removeItem(atPath: stored.path) }
            feed.finish(throwing: error)
            fileSettled(.failure(error))
            settle(.failure(error))
            return
        }
        feed.finish()
        // A request that is over takes nothing: a held answer stays for the download's next request.
        if stored == nil, !released, let key = task.value.taskDescription, let taken = held?.take(key) {
            // The task finished before this request followed it: its answer was held meanwhile.
            state.withLock { $0.stored = (taken.body, nil) }
            fileSettled(.success(taken.body))
            settle(.success(taken.head.response(body: .file(atPath: taken.body, removingIt: true))))
            return
        }
        if let stored { fileSettled(.success(stored.path)) }
        if let stored, let response = stored.response {
            settle(.success(Self.response(response, body: .file(atPath: stored.path, removingIt: true))))
        } else if let response = task.value.response {
            // A data task always has its answer by now; a body-less one ends here.
            settle(.success(Self.response(response, body: TransportBody(chunks))))
        } else {
            settle(.failure(URLError(.badServerResponse)))
        }
        if stored == nil { fileSettled(.failure(URLError(.cannotWriteToFile))) }
    }

    /// Gives the answer to whoever waits for it, once.
    private func settle(_ answer: Result<TransportResponse, any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<TransportResponse, any Error>? in
            guard case .none = state.answer else { return nil }
            state.answer = answer
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(with: answer)
    }

    /// Whether suspending a task holds its data back. FoundationNetworking's `suspend()` ends a
    /// running request and its `resume()` sends it again from the first byte, so there it is never
    /// used.
    private static var canSuspend: Bool {
        #if canImport(FoundationNetworking)
            false
        #else
            true
        #endif
    }

    private static func response(_ response: URLResponse, body: TransportBody) -> TransportResponse {
        guard let http = response as? HTTPURLResponse else {
            return TransportResponse(status: 0, headers: [], body: body)
        }
        return TransportResponse(status: http.statusCode, headers: headerPairs(http), body: body)
    }
}

/// The headers of `response`, as `URLSession` gives them (see ``URLSessionTransport``).
func headerPairs(_ response: HTTPURLResponse) -> [(name: String, value: String)] {
    response.allHeaderFields.compactMap { name, value in (name as? String).map { ($0, "\(value)") } }
}

/// Reads the chunks a data task received, telling its ``Exchange`` how many bytes were taken.
final class BodyPump: @unchecked Sendable {
    // Read by one task at a time: the body's one reader.
    private var iterator: AsyncThrowingStream<ByteBuffer, any Error>.AsyncIterator
    private let exchange: Exchange

    init(_ chunks: AsyncThrowingStream<ByteBuffer, any Error>, exchange: Exchange) {
        iterator = chunks.makeAsyncIterator()
        self.exchange = exchange
    }

    func next() async throws -> ByteBuffer? {
        let chunk = try await iterator.next()
        if let chunk { exchange.consumed(chunk.readableBytes) }
        return chunk
    }
}
