import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// How the bare client makes files durable.
enum Durability: String, Sendable {
    /// Not at all: each file is written under its name and closed.
    case none
    /// Each file flushed (`fdatasync` on a pool of 16 threads) and renamed as it completes.
    case eachFile = "each"
    /// Files collected as they complete and made durable together: one `syncfs` (Linux) for all that
    /// completed since the last one, then their renames, then one flush of the directory.
    case batch
}

/// Fetches a list over HTTP/1.1 straight on SwiftNIO: `jobs` kept-alive connections to the list's
/// one server, each sending the next URL as its last answer ends, and writing each body to its file
/// as it arrives. No pool, no request objects, no tasks: the least an HTTP/1.1 client on SwiftNIO
/// does, to tell what a client costs apart from what durability costs.
enum BareFetch {
    static func run(
        urls: [String], directory: String, jobs: Int, durability: Durability, authority: String?
    ) throws {
        let targets = try urls.map(Target.init)
        guard let first = targets.first else { return }
        guard targets.allSatisfy({ $0.host == first.host && $0.port == first.port && $0.tls == first.tls }) else {
            throw Failure("the bare client fetches from one server")
        }
        let tls: NIOSSLContext?
        if first.tls {
            var configuration = TLSConfiguration.makeClientConfiguration()
            if let authority { configuration.trustRoots = .file(authority) }
            configuration.applicationProtocols = ["http/1.1"]
            tls = try NIOSSLContext(configuration: configuration)
        } else {
            tls = nil
        }
        let run = BareRun(targets: targets, directory: directory, durability: durability)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: System.coreCount)
        defer { try? group.syncShutdownGracefully() }
        let batcher = durability == .batch ? BatchSyncer(run: run) : nil
        var ends: [EventLoopFuture<Void>] = []
        for _ in 0..<min(jobs, targets.count) {
            let loop = group.next()
            let end = loop.makePromise(of: Void.self)
            ends.append(end.futureResult)
            ClientBootstrap(group: loop)
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        if let tls {
                            try channel.pipeline.syncOperations.addHandler(
                                NIOSSLClientHandler(
                                    context: tls, serverHostname: first.namesItsServer ? first.host : nil))
                        }
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        try channel.pipeline.syncOperations.addHandler(Connection(run: run, end: end, batcher: batcher))
                    }
                }
                .connect(host: first.host, port: first.port)
                .whenFailure { end.fail($0) }
        }
        for end in ends { try end.wait() }
        batcher?.finish()
        if durability == .eachFile { run.flushes.waitForAll() }
        if durability != .none {
            let folder = open(directory, O_RDONLY | O_DIRECTORY)
            defer { close(folder) }
            if folder < 0 || fsync(folder) != 0 { run.fail("\(directory): cannot flush") }
        }
        try? run.flushes.pool.syncShutdownGracefully()
        if let message = run.failure.withLock({ $0 }) { throw Failure(message) }
    }
}

/// One URL of the list.
struct Target: Sendable {
    let tls: Bool
    let host: String
    let port: Int
    let path: String
    let name: String

    /// Whether the host is a name (sent for Server Name Indication) rather than an address.
    var namesItsServer: Bool { !host.allSatisfy { $0.isNumber || $0 == "." || $0 == ":" || $0 == "[" || $0 == "]" } }

    init(_ url: String) throws {
        let scheme = url.split(separator: ":", maxSplits: 1).first.map(String.init) ?? ""
        guard scheme == "http" || scheme == "https" else { throw Failure("\(url): not http or https") }
        tls = scheme == "https"
        let rest = url.dropFirst(scheme.count + 3)
        let slash = rest.firstIndex(of: "/") ?? rest.endIndex
        let authority = rest[..<slash]
        if let colon = authority.lastIndex(of: ":"), let number = Int(authority[authority.index(after: colon)...]) {
            host = String(authority[..<colon])
            port = number
        } else {
            host = String(authority)
            port = tls ? 443 : 80
        }
        path = slash == rest.endIndex ? "/" : String(rest[slash...])
        name = url.split(separator: "/").last.map(String.init) ?? "index"
    }
}

/// What the connections share: the list, the next URL to take, the first failure.
final class BareRun: Sendable {
    let targets: [Target]
    let directory: String
    let durability: Durability
    let next = Atomic<Int>(0)
    let failure = Mutex<String?>(nil)
    let flushes = Flushes()

    init(targets: [Target], directory: String, durability: Durability) {
        self.targets = targets
        self.directory = directory
        self.durability = durability
    }

    /// The next URL's index, or nil when every URL is taken or the run failed.
    func take() -> Int? {
        guard failure.withLock({ $0 == nil }) else { return nil }
        let index = next.add(1, ordering: .relaxed).oldValue
        return index < targets.count ? index : nil
    }

    func fail(_ message: String) {
        failure.withLock { $0 = $0 ?? message }
    }
}

/// The per-file flushes of ``Durability/eachFile``: a pool of 16 threads and a count of those
/// still running.
final class Flushes: Sendable {
    let pool: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: 16)
        pool.start()
        return pool
    }()
    let pending = Mutex<Int>(0)
    let drained = Gate()

    func submit(_ work: @escaping @Sendable () -> Void) {
        pending.withLock { $0 += 1 }
        pool.submit { _ in
            work()
            if self.pending.withLock({ count -> Bool in
                count -= 1
                return count == 0
            }) {
                self.drained.open()
            }
        }
    }

    func waitForAll() {
        while pending.withLock({ $0 }) > 0 { drained.wait() }
    }
}

/// Makes the files of ``Durability/batch`` durable on a thread of its own: whatever completed since
/// its last round, with one `syncfs`, their renames and one directory flush.
final class BatchSyncer: Sendable {
    let run: BareRun
    let completed = Mutex<(paths: [String], ended: Bool)>(([], false))
    let wake = Gate()
    let done = Gate()

    init(run: BareRun) {
        self.run = run
        let thread = Thread { self.loop() }
        thread.start()
    }

    func add(_ path: String) {
        completed.withLock { $0.paths.append(path) }
        wake.open()
    }

    /// Returns once every file added is durable under its name.
    func finish() {
        completed.withLock { $0.ended = true }
        wake.open()
        done.wait()
    }

    private func loop() {
        let folder = open(run.directory, O_RDONLY | O_DIRECTORY)
        defer {
            close(folder)
            done.open()
        }
        while true {
            wake.wait()
            let (batch, ended) = completed.withLock { state in
                defer { state.paths.removeAll(keepingCapacity: true) }
                return (state.paths, state.ended)
            }
            if !batch.isEmpty {
                guard syncWholeFileSystem(folder) else { return run.fail("\(run.directory): cannot sync") }
                for path in batch where rename(path, String(path.dropLast(5))) != 0 {
                    return run.fail("\(path): cannot rename")
                }
                guard fsync(folder) == 0 else { return run.fail("\(run.directory): cannot flush") }
            }
            if ended { return }
        }
    }
}

/// Flushes the file system that holds `folder`: `syncfs` on Linux, `sync` elsewhere.
func syncWholeFileSystem(_ folder: Int32) -> Bool {
    #if os(Linux)
        return linuxSyncfs(folder) == 0
    #else
        sync()
        return true
    #endif
}

#if os(Linux)
    @_silgen_name("syncfs") func linuxSyncfs(_ descriptor: Int32) -> Int32
#endif

/// A thread running one closure.
final class Thread: Sendable {
    let body: @Sendable () -> Void
    init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    func start() {
        let box = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let created = pthread_create(
            &thread, nil,
            { argument in
                let thread = Unmanaged<Thread>.fromOpaque(argument!).takeRetainedValue()
                thread.body()
                return nil
            }, box)
        precondition(created == 0, "cannot start a thread")
        pthread_detach(thread)
    }
}

/// A signal one thread waits for and others give: a wait returns once the gate was opened since the
/// last wait returned.
final class Gate: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var opened = false

    init() {
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&condition, nil)
    }

    func open() {
        pthread_mutex_lock(&mutex)
        opened = true
        pthread_cond_signal(&condition)
        pthread_mutex_unlock(&mutex)
    }

    func wait() {
        pthread_mutex_lock(&mutex)
        while !opened { pthread_cond_wait(&condition, &mutex) }
        opened = false
        pthread_mutex_unlock(&mutex)
    }
}

/// One kept-alive connection: sends a request, writes its answer's body to the file, and sends the
/// next when the answer ends.
final class Connection: ChannelInboundHandler, Sendable {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    let run: BareRun
    let end: EventLoopPromise<Void>
    let batcher: BatchSyncer?
    /// The answer being read: its URL's index, file and path, and whether the connection has ended.
    /// Touched on the channel's loop only.
    private let current = Mutex<(index: Int, file: Int32, path: String, ended: Bool)>((-1, -1, "", false))

    init(run: BareRun, end: EventLoopPromise<Void>, batcher: BatchSyncer?) {
        self.run = run
        self.end = end
        self.batcher = batcher
    }

    func channelActive(context: ChannelHandlerContext) {
        sendNext(context: context)
    }

    private func sendNext(context: ChannelHandlerContext) {
        guard let index = run.take() else { return conclude(context) }
        let target = run.targets[index]
        current.withLock { $0.index = index }
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: "\(target.host):\(target.port)")
        headers.add(name: "User-Agent", value: "haul-ceiling")
        context.write(
            wrapOutboundOut(
                .head(HTTPRequestHead(version: .http1_1, method: .GET, uri: target.path, headers: headers))),
            promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            guard head.status == .ok else { return fail(context, "status \(head.status.code)") }
            let index = current.withLock { $0.index }
            let name = run.directory + "/" + run.targets[index].name
            let path = run.durability == .none ? name : name + ".part"
            let file = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0o644)
            guard file >= 0 else { return fail(context, "cannot create \(path)") }
            current.withLock {
                $0.file = file
                $0.path = path
            }
        case .body(let buffer):
            let file = current.withLock { $0.file }
            let written = buffer.withUnsafeReadableBytes { write(file, $0.baseAddress, $0.count) }
            guard written == buffer.readableBytes else { return fail(context, "cannot write") }
        case .end:
            let (file, path) = current.withLock { state in
                defer { state.file = -1 }
                return (state.file, state.path)
            }
            switch run.durability {
            case .none:
                close(file)
            case .eachFile:
                let run = self.run
                run.flushes.submit {
                    if fdatasync(file) != 0 || rename(path, String(path.dropLast(5))) != 0 {
                        run.fail("\(path): cannot finish")
                    }
                    close(file)
                }
            case .batch:
                close(file)
                batcher?.add(path)
            }
            sendNext(context: context)
        }
    }

    private func fail(_ context: ChannelHandlerContext, _ message: String) {
        run.fail(message)
        conclude(context)
    }

    /// Closes the connection and tells the run it has ended, once.
    private func conclude(_ context: ChannelHandlerContext) {
        let ended = current.withLock { state in
            defer { state.ended = true }
            return state.ended
        }
        guard !ended else { return }
        context.close(promise: nil)
        end.succeed(())
    }

    func channelInactive(context: ChannelHandlerContext) {
        guard current.withLock({ !$0.ended }) else { return }
        fail(context, "the server closed a connection")
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A TLS connection this side closed may report the server's missing close_notify.
        guard current.withLock({ !$0.ended }) else { return }
        fail(context, "\(error)")
    }
}
