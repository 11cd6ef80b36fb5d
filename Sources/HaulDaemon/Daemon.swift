import Haul
import HaulPostgreSQL
import Hummingbird
import HummingbirdCore
import HummingbirdWebSocket
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// `haul daemon`: one download manager over a state directory, run in the background, with an
/// authenticated HTTP API.
///
/// ```swift
/// let daemon = try Daemon(options: .init(stateDirectory: "/var/lib/haul", downloadRoots: ["/srv/files"]))
/// try await daemon.run()   // until SIGTERM or SIGINT, or shutdown()
/// ```
///
/// The HTTP server and the queue run as services of one service group: on SIGTERM or SIGINT (or
/// ``shutdown()``) the server stops taking requests and every running download checkpoints durably
/// and is queued again, to go on when the daemon next starts.
public final class Daemon: Sendable {
    /// How the daemon runs.
    public struct Options: Sendable {
        /// The address to listen on; loopback unless ``allowRemote`` is set.
        public var host = "127.0.0.1"
        /// The port to listen on; 0 picks a free one.
        public var port = Daemon.defaultPort
        /// Allow a host other than a loopback address (the API is then reachable from the network).
        public var allowRemote = false
        /// The state directory: the database, the token and the daemon's lock.
        public var stateDirectory: String
        /// The directories downloads may be written into; the first one takes relative paths.
        public var downloadRoots: [String]
        /// More host names the daemon answers to (besides its address, `localhost` and loopback).
        public var allowedHosts: [String] = []
        /// Origins besides the daemon's own page whose requests may change something (a browser
        /// extension's `chrome-extension://ID`); they still need the token.
        public var allowedOrigins: [String] = []
        /// The largest request body accepted, in bytes.
        public var maxBodyBytes = 1 << 20
        /// The queue's settings.
        public var manager = DownloadManager.Configuration()
        /// How each download transfers.
        public var downloader = DownloaderConfiguration()
        /// How often an idle event stream sends a comment line to show it is alive.
        public var keepAlive: Duration = .seconds(15)
        /// Programs to run when a download completes or fails.
        public var hooks = Hooks()
        /// URLs a JSON event is POSTed to when a download completes or fails (see `--webhook`).
        public var webhooks: [String] = []
        /// Requests a second the daemon answers (all clients together; twice as many at once);
        /// past it, 429.
        public var requestsPerSecond = 200
        /// How many connections the listener holds and for how long.
        public var connections = ConnectionLimits()
        /// A queue in PostgreSQL (`postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE`) that this
        /// daemon shares with others, as one worker of a fleet; `nil`: the state directory's own
        /// queue. The password is never logged or shown.
        public var queueURL: String?
        /// How long a fleet worker's lease lasts without a renewal: a worker that dies or is cut
        /// off from the database has its downloads taken over this long after its last renewal.
        public var leaseTime: Duration = .seconds(30)

        /// Options for a daemon over `stateDirectory` writing into `downloadRoots`.
        public init(stateDirectory: String, downloadRoots: [String]) {
            self.stateDirectory = stateDirectory
            self.downloadRoots = downloadRoots
        }
    }

    /// The port `haul daemon` listens on unless told otherwise.
    public static let defaultPort = 6842

    /// The daemon's options, as given.
    public let options: Options
    /// The token clients must send (`Authorization: Bearer TOKEN`).
    public let token: String
    private let lock: DaemonLock
    let manager: DownloadManager
    private let roots: DownloadRoots
    private let logger: Logger
    private let clock: any Clock<Duration>
    /// The same clock, as the queue's rules read it.
    private let transferClock: TransferClock
    private let state = Mutex(RunState())

    private struct RunState {
        var group: ServiceGroup?
        var url: String?
        var waiters: [CheckedContinuation<String?, Never>] = []
        var stopped = false
        var routes: [(method: HTTPRequest.Method, path: String)] = []
        var closed = false
    }

    /// The API's routes (method and path under `/api/v1`), once ``run()`` has set them up.
    var routes: [(method: HTTPRequest.Method, path: String)] { state.withLock { $0.routes } }

    /// Takes the state directory's daemon lock (or throws naming the daemon that holds it), reads or
    /// makes the token, and opens the queue; nothing listens before ``run()``.
    ///
    /// - Parameter clock: the clock of the queue's rules and of the hooks' time limit; the continuous
    ///   clock unless a test gives its own.
    public init(
        options: Options, logger: Logger = Logger(label: "haul.daemon"),
        clock: any Clock<Duration> = ContinuousClock()
    ) throws {
        if !options.allowRemote, !Self.isLoopback(options.host) {
            throw HaulError(
                .invalidArgument,
                "\(options.host) is not a loopback address: listening there opens the API to the network (allow it explicitly)"
            )
        }
        try options.hooks.check()
        for url in options.webhooks where !WebhookSender.isWebhookURL(url) {
            throw HaulError(
                .invalidArgument, "--webhook \(WebhookSender.receiver(url)) is not an http or https URL")
        }
        for origin in options.allowedOrigins where !Self.isOrigin(origin) {
            throw HaulError(
                .invalidArgument,
                "\(origin) is not an origin: give SCHEME://HOST[:PORT], e.g. chrome-extension://ID")
        }
        self.options = options
        self.logger = logger
        self.clock = clock
        self.transferClock = TransferClock(clock)
        let directory = POSIX.absolutePath(options.stateDirectory)
        try POSIX.makePrivateDirectory(directory, marker: DownloadManager.databaseName)
        lock = try DaemonLock(stateDirectory: directory)
        token = try DaemonFiles.token(in: directory)
        roots = try DownloadRoots(options.downloadRoots, forbidden: [directory])
        // Progress reaches event streams at most every 200 ms per download.
        var queue = options.manager
        if let rules = try DaemonFiles.readRules(in: directory) {
            // The roots may have changed since the rules were set.
            for folder in rules.sites.compactMap(\.directory) + rules.categories.map(\.directory) {
                do {
                    _ = try roots.confine(folder, isDirectory: true)
                } catch let error as APIError {
                    throw HaulError(
                        .outsideDownloadRoot, "\(directory)/\(DaemonFiles.rulesName): \(error.message)")
                }
            }
            queue.rules = rules
        }
        queue.progressInterval = max(queue.progressInterval, .milliseconds(200))
        // The roots are checked again when each download's files are opened, beneath them.
        var transfer = options.downloader
        transfer.downloadRoots = roots.directories
        if let queueURL = options.queueURL {
            let location = try PostgreSQLLocation(parsing: queueURL)
            let store = try PostgreSQLQueueStore(location: location)
            let parts = options.leaseTime.components
            let lease = try FleetLease(
                store: store, duration: Double(parts.seconds) + Double(parts.attoseconds) / 1e18)
            logger.info("a worker of the queue \(location) as \(lease.name)")
            // The cap on connections to a host counts every worker's.
            if let limit = transfer.maxConnectionsPerHost {
                // A connection of their own: a request waiting for a place never waits for a commit.
                transfer.sharedHostSlots = PostgreSQLHostSlots(
                    store: try PostgreSQLQueueStore(location: location), lease: lease, limit: limit)
            }
            manager = try DownloadManager(
                store: store, ownership: lease, stateDirectory: directory, configuration: queue,
                downloaderConfiguration: transfer, logger: logger, clock: clock)
        } else {
            manager = try DownloadManager(
                stateDirectory: directory, configuration: queue, downloaderConfiguration: transfer,
                logger: logger, clock: clock)
        }
    }

    /// What one run of the daemon shares between its routes and its services.
    struct Runtime: Sendable {
        let hub = EventHub()
        let metrics = DaemonMetrics()
        let connections: ConnectionLedger
        /// The queue's events for the hub and the metrics, subscribed before the queue starts so
        /// no event of the run is missed.
        let events: AsyncStream<DownloadManagerEvent>
        /// Names this run for aria2's clients (`aria2.getSessionInfo`): 40 hexadecimal digits.
        let sessionID = (0..<3).map { _ in String(UInt64.random(in: .min ... .max), radix: 16) }.joined()
            .padding(toLength: 40, withPad: "0", startingAt: 0)
    }

    /// The shared parts of a new run.
    func makeRuntime() -> Runtime {
        Runtime(
            connections: ConnectionLedger(limits: options.connections, clock: transferClock), events: manager.events())
    }

    /// The daemon's routes: the page, `/metrics` and the API under `/api/v1`, behind the security
    /// headers, the access rules and the request rate cap.
    func buildRouter(_ runtime: Runtime) -> Router<DaemonRequestContext> {
        let router = Router(context: DaemonRequestContext.self)
        router.middlewares.add(SecurityHeaders())
        router.middlewares.add(accessRules)
        router.middlewares.add(
            RequestRateCap(
                bucket: RequestBucket(perSecond: options.requestsPerSecond, clock: transferClock),
                exempt: Self.publicPaths))
        Page.register(on: router)
        let manager = self.manager
        router.get("metrics") { _, _ in
            let text = runtime.metrics.text(
                counts: (try? await manager.counts()) ?? [:], running: await manager.downloads(in: [.running]),
                progress: await manager.aggregateProgress(),
                connections: runtime.connections)
            return Response(
                status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                body: .init(byteBuffer: ByteBuffer(string: text)))
        }
        let api = API(
            manager: manager, roots: roots, hub: runtime.hub, keepAlive: options.keepAlive,
            connections: runtime.connections)
        aria2(runtime).register(on: router)
        let recorder = RouteRecorder()
        api.register(on: router.group("api/v1"), recording: recorder)
        state.withLock { $0.routes = recorder.routes }
        return router
    }

    /// Whether `text` is an origin `--allow-origin` takes: `SCHEME://HOST[:PORT]`, nothing after
    /// it (`chrome-extension://ID`, `moz-extension://UUID`, `https://intranet.example`).
    public static func isOrigin(_ text: String) -> Bool {
        guard let separator = text.range(of: "://") else { return false }
        let scheme = text[..<separator.lowerBound]
        let rest = text[separator.upperBound...]
        return !scheme.isEmpty && scheme.allSatisfy { $0.isLetter || $0.isNumber || "+-.".contains($0) }
            && !rest.isEmpty && rest.allSatisfy { $0.isLetter || $0.isNumber || "-.:[]".contains($0) }
    }

    /// Paths served without a token: the page's shell and its files, which hold no data.
    static let publicPaths = Set(Page.files.keys).union(["/api/v1/openapi.json"])

    /// The rules every request passes. aria2's interface takes the token as its secret, in each
    /// call (see ``Aria2RPC``).
    var accessRules: AccessRules {
        AccessRules(
            token: token, listeningHost: options.host, extraHosts: options.allowedHosts,
            extraOrigins: options.allowedOrigins,
            maxBodyBytes: options.maxBodyBytes, publicPaths: Self.publicPaths.union([Aria2RPC.path]))
    }

    /// aria2's interface over the queue.
    func aria2(_ runtime: Runtime) -> Aria2RPC {
        Aria2RPC(manager: manager, roots: roots, token: token, sessionID: runtime.sessionID)
    }

    /// The daemon's HTTP application: ``buildRouter(_:)``'s routes on a listener that keeps the
    /// connection limits, which writes the daemon's address once it listens.
    func buildApplication(_ runtime: Runtime) -> Application<RouterResponder<DaemonRequestContext>> {
        let directory = manager.stateDirectory
        let host = options.host
        let (aria2, rules, maxMessageBytes) = (aria2(runtime), accessRules, options.maxBodyBytes)
        return Application(
            router: buildRouter(runtime),
            server: HTTPServerBuilder { responder in
                GuardedHTTP1Channel(
                    inner: HTTP1WebSocketUpgradeChannel(
                        responder: responder, configuration: .init(ws: .init(maxFrameSize: maxMessageBytes))
                    ) { head, _, _ in
                        aria2.upgrade(head, rules: rules, connections: runtime.connections)
                    },
                    ledger: runtime.connections)
            },
            configuration: ApplicationConfiguration(address: .hostname(host, port: options.port), serverName: "haul"),
            onServerRunning: { [weak self] channel in
                let port = channel.localAddress?.port ?? 0
                let url = "http://\(host.contains(":") ? "[\(host)]" : host):\(port)"
                try? DaemonFiles.writeAddress(.init(url: url, processID: getpid()), in: directory)
                self?.announce(url)
            },
            logger: logger)
    }

    /// What runs beside the listener: the queue, the events into the hub and the metrics, and the
    /// sweep of connections that wait too long.
    func backgroundServices(_ runtime: Runtime) -> [any Service] {
        [
            QueueService(manager: manager),
            EventService(hub: runtime.hub, metrics: runtime.metrics, events: runtime.events),
            SweepService(ledger: runtime.connections),
        ]
    }

    /// Starts the hooks and the webhooks beside the service group, on event streams that end only
    /// when the queue is closed: a download that ends while the daemon stops still gets its hook.
    func startHooks() -> Task<Void, Never>? {
        let programs = options.hooks.onComplete != nil || options.hooks.onError != nil
        guard programs || !options.webhooks.isEmpty else { return nil }
        let runner = HookRunner(hooks: options.hooks, manager: manager, logger: logger, clock: clock)
        let sender = WebhookSender(urls: options.webhooks, logger: logger, clock: clock)
        let hookEvents = programs ? manager.events() : nil
        let webhookEvents = options.webhooks.isEmpty ? nil : manager.events()
        return Task {
            await withDiscardingTaskGroup { group in
                if let hookEvents { group.addTask { await runner.run(hookEvents) } }
                if let webhookEvents { group.addTask { await sender.run(webhookEvents) } }
            }
        }
    }

    /// Serves the API and runs the queue until SIGTERM or SIGINT, or ``shutdown()``; then every
    /// running download checkpoints and is queued again.
    public func run() async throws {
        let directory = manager.stateDirectory
        let runtime = makeRuntime()
        let hooks = startHooks()
        let application = buildApplication(runtime)
        var configuration = ServiceGroupConfiguration(
            // Shut down in reverse: event streams end first, then the queue checkpoints its
            // downloads, then the server stops (a client that stopped reading cannot hold up the
            // checkpoints; the time limit ends the rest).
            services: ([application] + backgroundServices(runtime)).map { .init(service: $0) },
            gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        configuration.maximumGracefulShutdownDuration = .seconds(30)
        let group = ServiceGroup(configuration: configuration)
        let stopEarly = state.withLock { state -> Bool in
            state.group = group
            return state.stopped
        }
        if stopEarly { await group.triggerGracefulShutdown() }
        defer {
            DaemonFiles.removeAddress(in: directory)
            let waiters = state.withLock { state -> [CheckedContinuation<String?, Never>] in
                state.stopped = true
                defer { state.waiters = [] }
                return state.waiters
            }
            for waiter in waiters { waiter.resume(returning: nil) }
        }
        do {
            try await group.run()
        } catch {
            await closeManager()
            await hooks?.value
            throw error
        }
        await closeManager()
        await hooks?.value
    }

    /// Closes the queue (its downloads checkpoint); what `run()` does last.
    func closeManager() async {
        state.withLock { $0.closed = true }
        await manager.close()
    }

    deinit {
        // A daemon made but never run still closes its queue's connections.
        if !state.withLock({ $0.closed }) {
            let manager = self.manager
            Task { await manager.close() }
        }
    }

    /// The URL the daemon listens on, once it does (`nil` when it stopped before).
    public func listeningURL() async -> String? {
        await withCheckedContinuation { continuation in
            let known = state.withLock { state -> String?? in
                if let url = state.url { return .some(url) }
                if state.stopped { return .some(nil) }
                state.waiters.append(continuation)
                return nil
            }
            if let known { continuation.resume(returning: known) }
        }
    }

    /// Stops the daemon as SIGTERM does.
    public func shutdown() async {
        let group = state.withLock { state -> ServiceGroup? in
            state.stopped = true
            return state.group
        }
        await group?.triggerGracefulShutdown()
    }

    private func announce(_ url: String) {
        let waiters = state.withLock { state -> [CheckedContinuation<String?, Never>] in
            state.url = url
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume(returning: url) }
    }

    /// Whether `host` is a loopback address (or `localhost`): 127.0.0.0/8 or ::1, as addresses, not
    /// names that merely look like them.
    public static func isLoopback(_ host: String) -> Bool {
        let name = AccessRules.hostName(host)
        if name == "localhost" { return true }
        var v4 = in_addr()
        if inet_pton(AF_INET, name, &v4) == 1 { return UInt32(bigEndian: v4.s_addr) >> 24 == 127 }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, name, &v6) == 1 else { return false }
        return withUnsafeBytes(of: &v6) { bytes in bytes.dropLast().allSatisfy { $0 == 0 } && bytes.last == 1 }
    }
}

/// The manager's events into the hub and the metrics, until a graceful shutdown ends every event
/// stream.
struct EventService: Service {
    let hub: EventHub
    let metrics: DaemonMetrics
    let events: AsyncStream<DownloadManagerEvent>

    func run() async throws {
        let (hub, metrics, events) = (self.hub, self.metrics, self.events)
        await cancelWhenGracefulShutdown {
            for await event in events {
                metrics.record(event)
                hub.publish(event)
            }
        }
        hub.close()
    }
}

/// Closes the listener's connections that wait too long, until a graceful shutdown.
struct SweepService: Service {
    let ledger: ConnectionLedger

    func run() async throws {
        await cancelWhenGracefulShutdown { await ledger.sweepUntilCancelled() }
    }
}

/// The queue as a service: it runs until a graceful shutdown, when running downloads checkpoint
/// and are queued again.
struct QueueService: Service {
    let manager: DownloadManager

    func run() async throws {
        await cancelWhenGracefulShutdown { await manager.run() }
    }
}
