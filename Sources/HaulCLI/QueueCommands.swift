import ArgumentParser
import Haul
import HaulDaemon
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Parses download IDs given on the command line.
private func parseIDs(_ values: [String]) throws -> [DownloadID] {
    try values.map { value in
        guard let number = Int64(value), number > 0 else {
            throw ValidationError("'\(value)' is not a download ID (see `haul ls`)")
        }
        return DownloadID(number)
    }
}

/// Does `action` to each download in `ids`, in order, printing `done ID` after each: through the
/// daemon that runs on the state directory, or else on the database.
private func forEach(
    _ ids: [String], _ state: StateOptions, saying done: String,
    local: @escaping @Sendable (DownloadManager, DownloadID) async throws -> Void,
    daemon: @escaping @Sendable (DaemonClient, DownloadID) async throws -> Void
) async throws {
    let selected = try parseIDs(ids)
    try await withQueueOrDaemon(state) { manager in
        for id in selected {
            try await local(manager, id)
            Output.standardOutput("\(done) \(id)\n")
        }
    } daemon: { client in
        // The daemon also acts on downloads another haul process added or runs, as a manager on the
        // database would.
        for id in selected {
            try await daemon(client, id)
            Output.standardOutput("\(done) \(id)\n")
        }
    }
}

/// Runs `daemon` with a client of the daemon that runs on the state directory, or else `local`
/// with a manager on the database: the daemon's queue is the one that runs downloads while it runs.
func withQueueOrDaemon<Result>(
    _ state: StateOptions, local: (DownloadManager) async throws -> Result,
    daemon: (DaemonClient) async throws -> Result
) async throws -> Result {
    guard let client = try await reportingErrors({ try DaemonClient.running(on: POSIX.absolutePath(state.directory)) })
    else { return try await withQueue(state, TransferOptions.defaults, local) }
    return try await reportingErrors {
        do {
            let result = try await daemon(client)
            try? await client.shutdown()
            return result
        } catch {
            try? await client.shutdown()
            throw error
        }
    }
}

/// The downloads a command has queued in the haul daemon so far, to name them if a later one fails.
final class QueuedInDaemon: Sendable {
    private let queued = Mutex<[DownloadInfo]>([])

    var all: [DownloadInfo] { queued.withLock { $0 } }

    /// Adds what the daemon answered.
    func add(_ infos: [DownloadInfo]) { queued.withLock { $0 += infos } }
}

/// When a haul daemon runs on the state directory (and `--no-daemon` is not given): lets `queue` put
/// downloads in it, follows them to their end and exits as a run in this process would. Returns
/// without doing anything when no daemon runs.
///
/// - Parameters:
///   - perDownload: whether `-x` and `--limit-rate` apply (to downloads being added); otherwise
///     they are refused like the queue's settings.
///   - refusing: why the options given cannot go to the daemon, when they cannot.
func followInDaemon(
    _ state: StateOptions, _ transfer: TransferOptions, _ display: OutputOptions, _ use: DaemonUseOptions,
    perDownload: Bool, refusing: [String] = [], _ queue: @escaping (DaemonClient, QueuedInDaemon) async throws -> Void
) async throws {
    guard !use.noDaemon,
        let client = try await reportingErrors({ try DaemonClient.running(on: POSIX.absolutePath(state.directory)) })
    else { return }
    // Installed before anything is queued: a Ctrl-C from here on leaves what was queued running.
    let signals = SignalWatcher(signals: [SIGINT, SIGTERM])
    let queued = QueuedInDaemon()
    let (stream, target): (DaemonClient.EventStream, String)
    do {
        (stream, target) = try await reportingErrors {
            if let reason = refusing.first { throw HaulError(.invalidArgument, reason) }
            var refused = transfer.queueSettingsGiven
            if !perDownload {
                if transfer.connections != nil { refused.append("--connections") }
                if transfer.limitRate != nil { refused.append("--limit-rate") }
            }
            if let setting = refused.first {
                let whose =
                    perDownload
                    ? "a setting of the haul daemon that runs on \(state.directory), which runs this download: give it to `haul daemon`"
                    : "given when a download is added; the haul daemon that runs on \(state.directory) keeps what it was added with"
                throw HaulError(
                    .invalidArgument, "\(setting) is \(whose), or add --no-daemon to download in this process")
            }
            if display.verbose {
                Output.standardError(
                    "haul: note: the haul daemon runs this download; its log has the details -v would show\n")
            }
            // Opened first: no event of the downloads queued next is missed.
            let stream = try await client.events()
            try await queue(client, queued)
            return (stream, try await client.lastEventID())
        }
    } catch {
        signals.stop()
        try? await client.shutdown()
        let done = queued.all.map(\.id.description)
        if !done.isEmpty {
            Output.standardError(
                "haul: note: \(done.joined(separator: " ")) queued in the haul daemon before that, and running there "
                    + "(`haul ls` shows \(done.count == 1 ? "it" : "them"))\n")
        }
        throw error
    }
    guard !queued.all.isEmpty else {
        signals.stop()
        try? await client.shutdown()
        throw ExitCode.success
    }
    try await QueueRun.follow(client, stream, queued.all, syncedAt: target, signals: signals, output: display)
}

/// Runs `body`, turning a ``HaulError`` into its one-line message and exit code.
func reportingErrors<Result>(_ body: () async throws -> Result) async throws -> Result {
    do {
        return try await body()
    } catch let error as HaulError {
        Output.standardError("haul: error: \(error.messageWithHint)\n")
        throw ExitCode(ExitCodes.code(for: error.code))
    }
}

/// Runs `body` with a manager that leaves other processes' downloads alone, and closes it; with
/// `keepingOpen`, the manager stays open after `body` succeeds (the caller runs and closes it).
private func withQueue<Result>(
    _ state: StateOptions, _ transfer: TransferOptions = TransferOptions.defaults,
    _ body: (DownloadManager) async throws -> Result
) async throws -> Result {
    try await reportingErrors {
        let manager = try QueueRun.openManager(state, transfer, restoring: .leave)
        do {
            let result = try await body(manager)
            await manager.close()
            return result
        } catch {
            await manager.close()
            throw error
        }
    }
}

/// Opens a manager, lets `prepare` choose and queue downloads, then runs them to their end.
private func runQueue(
    _ state: StateOptions, _ transfer: TransferOptions, _ display: OutputOptions,
    _ prepare: (DownloadManager) async throws -> [DownloadID], finishing: () throws -> Void = {}
) async throws {
    let (manager, ids) = try await reportingErrors { () -> (DownloadManager, [DownloadID]) in
        let manager = try QueueRun.openManager(state, transfer, restoring: .leave, verbose: display.verbose)
        do {
            return (manager, try await prepare(manager))
        } catch {
            await manager.close()
            throw error
        }
    }
    guard !ids.isEmpty else {
        await manager.close()
        return
    }
    try await QueueRun.run(manager, ids, output: display, finishing: finishing)
}

extension TransferOptions {
    static var defaults: TransferOptions {
        do {
            return try TransferOptions.parse([])
        } catch {
            fatalError("the default transfer options do not parse: \(error)")
        }
    }
}

struct List: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "List the recorded downloads: state, progress, sizes, speed and name.")

    @Option(help: ArgumentHelp("Only downloads in this state; repeatable.", valueName: "state"))
    var state: [String] = []

    @Flag(help: "Print a JSON array of downloads on standard output.")
    var json = false

    @OptionGroup var stateOptions: StateOptions

    func validate() throws {
        for name in state where DownloadState(rawValue: name) == nil {
            throw ValidationError(
                "unknown state '\(name)'; one of: \(DownloadState.allCases.map(\.rawValue).joined(separator: ", "))")
        }
    }

    func run() async throws {
        let filter = state.isEmpty ? nil : Set(state.compactMap(DownloadState.init(rawValue:)))
        // The database, not a running daemon: it also holds the downloads other haul processes run.
        let downloads = try await withQueue(stateOptions) { manager in await manager.downloads(in: filter) }
        if json {
            Output.standardOutput(QueueRenderer.jsonList(downloads))
        } else if downloads.isEmpty {
            Output.standardOutput("no downloads recorded in \(stateOptions.directory)\n")
        } else {
            Output.standardOutput(QueueRenderer.table(downloads))
        }
    }
}

struct Resume: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Continue unfinished downloads: the given IDs, or every paused or interrupted one.",
        discussion: """
            Credentials (-u, --netrc, Authorization, cookies) are never stored; give them again when the server \
            needs them.
            """)

    @Argument(help: "IDs from `haul ls`; none means every paused or interrupted download.")
    var ids: [String] = []

    @Option(
        help:
            "A new URL for the download (one ID only), for links that expire; the partial data is kept when the file is unchanged."
    )
    var url: String?

    @Option(
        name: [.customShort("H"), .customLong("header")], help: "Request header 'Name: value' to send; repeatable.")
    var headers: [String] = []

    @OptionGroup var secrets: SecretHeaderOptions

    @OptionGroup var access: CredentialOptions
    @OptionGroup var transfer: TransferOptions
    @OptionGroup var state: StateOptions
    @OptionGroup var display: OutputOptions
    @OptionGroup var daemon: DaemonUseOptions

    func validate() throws {
        if url != nil && ids.count != 1 { throw ValidationError("--url applies to exactly one download ID") }
        try access.validate(headers: parseHeaders(headers))
        try secrets.validate(headers: parseHeaders(headers), more: false)
        _ = try parseIDs(ids)
    }

    func run() async throws {
        let headers = try parseHeaders(headers)
        let ids = self.ids
        let url = self.url
        let given = headers.isEmpty ? nil : headers
        let secret = secrets.names
        let access = self.access
        let netrc = try await reportingErrors { try access.netrcEntries() }
        let jar = try await reportingErrors { try access.cookieJar() }
        try await followInDaemon(
            state, transfer, display, daemon, perDownload: false, refusing: access.daemonRefusals
        ) { client, queued in
            var selected = try parseIDs(ids)
            if selected.isEmpty {
                // Chosen from the database, as without a daemon: what is paused or waits, and is not
                // another process's (the daemon's own are).
                let manager = try QueueRun.openManager(state, TransferOptions.defaults, restoring: .leave)
                for info in await manager.downloads(in: [.paused, .queued]) {
                    let owner = await manager.runningProcess(of: info.id)
                    if owner == nil || owner == client.processID.map(String.init) { selected.append(info.id) }
                }
                await manager.close()
                if selected.isEmpty { Output.standardError("haul: nothing to resume\n") }
            }
            for id in selected {
                var site = url
                if site == nil { site = try await client.download(id).url }
                let credentials = access.credentials(for: site ?? "", netrc: netrc)
                queued.add([
                    try await client.resume(
                        id, url: url, headers: given, secretHeaders: secret, credentials: credentials)
                ])
            }
        }
        try await runQueue(state, transfer, display) { manager in
            var selected = try parseIDs(ids)
            if selected.isEmpty {
                for info in await manager.downloads(in: [.paused, .queued])
                where await manager.runningProcess(of: info.id) == nil {
                    selected.append(info.id)
                }
                if selected.isEmpty { Output.standardError("haul: nothing to resume\n") }
            }
            for id in selected {
                var site = url
                if site == nil { site = await manager.download(id)?.url }
                try await manager.resume(
                    id, url: url, headers: given, secretHeaders: secret,
                    credentials: access.credentials(for: site ?? "", netrc: netrc), cookies: jar)
            }
            return selected
        } finishing: {
            try access.save(jar)
        }
    }
}

struct Retry: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Start failed or cancelled downloads again.")

    @Argument(help: "IDs from `haul ls`.")
    var ids: [String]

    @OptionGroup var transfer: TransferOptions
    @OptionGroup var state: StateOptions
    @OptionGroup var display: OutputOptions
    @OptionGroup var daemon: DaemonUseOptions

    func validate() throws { _ = try parseIDs(ids) }

    func run() async throws {
        let selected = try parseIDs(ids)
        try await followInDaemon(state, transfer, display, daemon, perDownload: false) { client, queued in
            for id in selected { queued.add([try await client.retry(id)]) }
        }
        try await runQueue(state, transfer, display) { manager in
            for id in selected { try await manager.retry(id) }
            return selected
        }
    }
}

struct Pause: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract:
            "Pause downloads, queued or running in another haul process, keeping their partial data (`haul resume` continues them)."
    )

    @Argument(help: "IDs from `haul ls`.")
    var ids: [String]

    @OptionGroup var state: StateOptions

    func validate() throws { _ = try parseIDs(ids) }

    func run() async throws {
        try await forEach(ids, state, saying: "paused") { manager, id in
            try await manager.pause(id)
        } daemon: { client, id in
            try await client.pause(id)
        }
    }
}

struct Remove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm",
        abstract: "Forget downloads: delete their partial data and records (and, if asked, the finished files).")

    @Argument(help: "IDs from `haul ls`.")
    var ids: [String]

    @Flag(help: "Also delete the finished files.")
    var deleteFiles = false

    @OptionGroup var state: StateOptions

    func validate() throws { _ = try parseIDs(ids) }

    func run() async throws {
        let deleteFiles = deleteFiles
        try await forEach(ids, state, saying: "removed") { manager, id in
            try await manager.remove(id, deletingFiles: deleteFiles)
        } daemon: { client, id in
            try await client.remove(id, deletingFiles: deleteFiles)
        }
    }
}
