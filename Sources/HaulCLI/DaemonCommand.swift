import ArgumentParser
import Haul
import HaulDaemon
import Logging

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

/// `haul daemon`: runs the queue in the background with an HTTP API.
struct DaemonCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "daemon",
        abstract: "Run every queued download in the background, controlled through an HTTP API.",
        discussion: """
            Listens on 127.0.0.1:\(Daemon.defaultPort) unless told otherwise. Every API request needs the token \
            the daemon keeps in DAEMON.TOKEN in the state directory (mode 0600; --print-token shows it). \
            SIGTERM or Ctrl-C stops it: running downloads checkpoint and continue when it next starts.
            """)

    @Option(
        help: ArgumentHelp(
            "Address and port to listen on, e.g. 127.0.0.1:\(Daemon.defaultPort) (port 0 picks a free one).",
            valueName: "host:port"))
    var listen = "127.0.0.1:\(Daemon.defaultPort)"

    @Flag(help: "Allow --listen on an address that is not loopback: the API is then reachable from the network.")
    var allowRemote = false

    @Option(
        help: ArgumentHelp(
            "A directory downloads may be written into; repeatable; the first takes relative paths "
                + "(default: the working directory).", valueName: "dir"))
    var downloadRoot: [String] = []

    @Option(
        help: ArgumentHelp(
            "Another host name the API answers to (DNS names of this machine); repeatable.", valueName: "name"))
    var allowHost: [String] = []

    @Option(
        help: ArgumentHelp(
            "A URL to POST a JSON event to when a download completes or fails (ntfy, Gotify, your own); "
                + "repeatable.", valueName: "url"))
    var webhook: [String] = []

    @Option(
        help: ArgumentHelp(
            "An origin besides the daemon's page that may change the queue, with the token (a browser "
                + "extension: chrome-extension://ID); repeatable.", valueName: "origin"))
    var allowOrigin: [String] = []

    @Option(help: ArgumentHelp("Log level: trace, debug, info, notice, warning, error.", valueName: "level"))
    var logLevel = "info"

    @Flag(help: "Print the API token (made if there is none) and exit.")
    var printToken = false

    @Flag(help: "Print the link that opens the running daemon's page with its token, and exit.")
    var printLink = false

    @Option(
        help: ArgumentHelp(
            "A program to run when a download completes, with its ID, file path and URL as arguments (no shell).",
            valueName: "program"))
    var onComplete: String?

    @Option(
        help: ArgumentHelp(
            "A program to run when a download fails, with its ID, file path and URL as arguments (no shell).",
            valueName: "program"))
    var onError: String?

    @Option(help: "API requests a second the daemon answers (twice as many at once); past it, 429.")
    var requestsPerSecond = 200

    @Option(help: ArgumentHelp("Seconds a --on-complete or --on-error program may run before it is killed."))
    var hookTimeLimit: Double = 60

    @Option(
        help: ArgumentHelp(
            "Share a queue in PostgreSQL with other daemons, as one worker of a fleet (default: $HAUL_QUEUE_URL; "
                + "none: the state directory's own queue).",
            valueName: "postgresql://user[:password]@host[:port]/database"))
    var queue: String?

    @Option(
        help: ArgumentHelp(
            "Seconds a worker's lease on a --queue lasts without a renewal: a worker that dies has its downloads "
                + "taken over this long after.", valueName: "seconds"))
    var leaseTime: Double = 30

    @Flag(
        help: ArgumentHelp(
            "Take the credentials of downloads that have none from ~/.netrc, by host, each time one starts (a fleet's "
                + "workers each read their own; never stored)."))
    var netrc = false

    @Option(help: ArgumentHelp("Like --netrc, from this netrc file.", valueName: "file"))
    var netrcFile: String?

    @OptionGroup var transfer: TransferOptions
    @OptionGroup var state: StateOptions

    /// The PostgreSQL queue: `--queue`, else `$HAUL_QUEUE_URL`, else none.
    var queueURL: String? {
        queue ?? ProcessInfo.processInfo.environment["HAUL_QUEUE_URL"].flatMap { $0.isEmpty ? nil : $0 }
    }

    func validate() throws {
        guard Self.splitListen(listen) != nil else {
            throw ValidationError(
                "--listen must look like 127.0.0.1:\(Daemon.defaultPort) or [::1]:\(Daemon.defaultPort)")
        }
        guard hookTimeLimit > 0, hookTimeLimit <= 86_400 else {
            throw ValidationError("--hook-time-limit must be a number of seconds from 0 to 86400")
        }
        guard requestsPerSecond >= 1 else { throw ValidationError("--requests-per-second must be at least 1") }
        guard leaseTime >= 3, leaseTime <= 3_600 else {
            throw ValidationError("--lease-time must be a number of seconds from 3 to 3600")
        }
        if netrc && netrcFile != nil { throw ValidationError("give --netrc or --netrc-file, not both") }
        for origin in allowOrigin where !Daemon.isOrigin(origin) {
            throw ValidationError(
                "--allow-origin \(origin) is not an origin: give SCHEME://HOST[:PORT], e.g. chrome-extension://ID")
        }
        // A limit of each download is given when it is added (haul add/get --limit-rate, the API's
        // limitRate); the daemon's own is the limit of all of them together.
        if transfer.limitRate != nil {
            throw ValidationError(
                "--limit-rate limits one download and is given when it is added; the daemon's limit of all its "
                    + "downloads together is --total-limit-rate")
        }
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
    }

    func run() async throws {
        do {
            try await serve()
        } catch let error as HaulError {
            Output.standardError("haul: error: \(error.messageWithHint)\n")
            throw ExitCode(ExitCodes.code(for: error.code))
        }
    }

    private func serve() async throws {
        if printToken {
            Output.standardOutput(try DaemonFiles.token(in: state.directory) + "\n")
            return
        }
        if printLink {
            guard let running = DaemonFiles.runningDaemon(in: state.directory),
                let token = try DaemonFiles.existingToken(in: state.directory)
            else { throw HaulError(.invalidState, "no haul daemon runs on \(state.directory)") }
            // The token travels in the fragment, which the browser never sends to the server.
            Output.standardOutput("\(running.url)/#token=\(token)\n")
            return
        }
        let (host, port) = Self.splitListen(listen)!
        var options = Daemon.Options(
            stateDirectory: state.directory, downloadRoots: downloadRoot.isEmpty ? ["."] : downloadRoot)
        options.host = host
        options.port = port
        options.allowRemote = allowRemote
        options.allowedHosts = allowHost
        options.allowedOrigins = allowOrigin
        options.webhooks = webhook
        options.manager = transfer.managerConfiguration(restoring: .resume)
        options.manager.netrc = try CredentialOptions.readNetrc(home: netrc, file: netrcFile)
        options.downloader = try transfer.downloaderConfiguration()
        // A queue that runs for hours retries a host that refuses: it may be restarting.
        options.downloader.retry.retriesRefusedConnections = true
        options.requestsPerSecond = requestsPerSecond
        options.hooks.onComplete = onComplete.map(POSIX.absolutePath)
        options.hooks.onError = onError.map(POSIX.absolutePath)
        options.hooks.timeLimit = .milliseconds(Int64(hookTimeLimit * 1000))
        options.queueURL = queueURL
        options.leaseTime = .milliseconds(Int64(leaseTime * 1000))
        var logger = Logger(label: "haul.daemon") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        // The daemon's downloads and its API's connections (1,024 at most, see ``ConnectionLimits``)
        // each hold files, and the usual soft limit of 1,024 is a setting of the shell, not of what
        // the system can give.
        POSIX.raiseOpenFileLimit()
        let daemon = try Daemon(options: options, logger: logger)
        if !Daemon.isLoopback(host) {
            Output.standardError(
                "haul: listening on \(host): the API is reachable from the network (a token is still required)\n")
        }
        let announcer = Task {
            guard let url = await daemon.listeningURL() else { return }
            Output.standardError(
                "haul: daemon listening on \(url); haul daemon --print-link prints the page's link with its token\n")
        }
        defer { announcer.cancel() }
        try await daemon.run()
    }

    /// `host:port` or `[v6]:port`.
    static func splitListen(_ text: String) -> (String, Int)? {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
            (0...65535).contains(port)
        else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { return nil }
        return (host, port)
    }
}
