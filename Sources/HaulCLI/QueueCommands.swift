import ArgumentParser
import Haul
import HaulDaemon
import HaulPostgreSQL
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

/// Does `action` to each download in `ids`, in order, printing `done ID` after each, on the queue
/// of the state directory (see ``withQueue(_:_:)``).
private func forEach(
    _ ids: [String], _ state: StateOptions, saying done: String,
    _ action: @escaping @Sendable (any DownloadQueue, DownloadID) async throws -> Void
) async throws {
    let selected = try parseIDs(ids)
    try await withQueue(state) { queue in
        for id in selected {
            try await action(queue, id)
            Output.standardOutput("\(done) \(id)\n")
        }
    }
}

/// Runs `body` with the queue of the state directory: the daemon that runs on it, through its client
/// (it also acts on downloads another haul process added or runs, as a manager on the database
/// would), or else a manager on the database, which leaves other processes' downloads alone.
func withQueue<Result>(_ state: StateOptions, _ body: (any DownloadQueue) async throws -> Result) async throws
    -> Result
{
    guard let client = try await reportingErrors({ try DaemonClient.running(on: POSIX.absolutePath(state.directory)) })
    else { return try await withLocalManager(state, body) }
    return try await reportingErrors {
        do {
            let result = try await body(client)
            try? await client.shutdown()
            return result
        } catch {
            try? await client.shutdown()
            throw error
        }
    }
}

/// The downloads a command has queued so far, to follow them and to name them if a later one fails.
final class QueuedDownloads: Sendable {
    private let queued = Mutex<[DownloadInfo]>([])

    var all: [DownloadInfo] { queued.withLock { $0 } }

    /// Adds what the queue answered.
    func add(_ infos: [DownloadInfo]) { queued.withLock { $0 += infos } }
}

/// Where a command's downloads run: the queue it puts them in, and the haul daemon's process when
/// that queue is a daemon's.
struct QueueSession: Sendable {
    /// The queue.
    let queue: any DownloadQueue
    /// The process ID of the daemon whose queue it is; `nil` for a queue in this process.
    let daemonProcessID: Int32?
    /// What the command queued so far.
    let queued = QueuedDownloads()

    /// The connection count a download added now carries: a queue in this process has the
    /// command's `-x` as its own setting already (and a later run may give another); a daemon's
    /// download keeps the one it was added with.
    func connections(_ transfer: TransferOptions) -> Int? { daemonProcessID == nil ? nil : transfer.connections }
}

/// Lets `prepare` put downloads in the queue of the state directory, then runs them to their end
/// and exits as a run does: in the haul daemon that runs on the state directory (unless
/// `--no-daemon`), which this command follows, or else in this process.
///
/// - Parameters:
///   - perDownload: whether `-x` and `--limit-rate` apply (to downloads being added); otherwise
///     a daemon refuses them like the queue's settings.
///   - refusing: why the options given cannot go to a daemon, when they cannot.
///   - finishing: what is done once the downloads ended in this process (saving cookies).
func runInQueue(
    _ state: StateOptions, _ transfer: TransferOptions, _ display: OutputOptions, _ use: DaemonUseOptions,
    perDownload: Bool, refusing: [String] = [], _ prepare: @escaping (QueueSession) async throws -> Void,
    finishing: @escaping () throws -> Void = {}
) async throws {
    if !use.noDaemon,
        let client = try await reportingErrors({ try DaemonClient.running(on: POSIX.absolutePath(state.directory)) })
    {
        try await followInDaemon(
            client, state, transfer, display, perDownload: perDownload, refusing: refusing, prepare)
        return
    }
    // Each download holds files while it transfers and while it is finished (-j, and up to 256 more
    // waiting to be finished, as the limit allows): the shell's usual soft limit of 1,024 is not
    // what the system can give.
    POSIX.raiseOpenFileLimit()
    let (manager, session) = try await reportingErrors { () -> (DownloadManager, QueueSession) in
        let manager = try QueueRun.openManager(state, transfer, restoring: .leave, verbose: display.verbose)
        let session = QueueSession(queue: manager, daemonProcessID: nil)
        do {
            try await prepare(session)
            return (manager, session)
        } catch {
            await manager.close()
            throw error
        }
    }
    let queued = session.queued.all
    guard !queued.isEmpty else {
        await manager.close()
        return
    }
    try await QueueRun.run(manager, queued, output: display, finishing: finishing)
}

/// ``runInQueue(_:_:_:_:perDownload:refusing:_:finishing:)`` with a daemon: `prepare` puts the
/// downloads in it, and this command follows them to their end and exits as a run in this process
/// would.
private func followInDaemon(
    _ client: DaemonClient, _ state: StateOptions, _ transfer: TransferOptions, _ display: OutputOptions,
    perDownload: Bool, refusing: [String], _ prepare: (QueueSession) async throws -> Void
) async throws {
    // Installed before anything is queued: a Ctrl-C from here on leaves what was queued running.
    let signals = SignalWatcher(signals: [SIGINT, SIGTERM])
    let session = QueueSession(queue: client, daemonProcessID: client.processID)
    let (stream, target): (DaemonClient.EventStream, String) = try await reportingErrors {
        do {
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
            try await prepare(session)
            do {
                return (stream, try await client.lastEventID())
            } catch {
                // What was queued runs there: the daemon went as its downloads were being followed.
                throw DaemonFollower.lost(client, (error as? HaulError)?.message ?? "\(error)")
            }
        } catch {
            signals.stop()
            try? await client.shutdown()
            // Told before the error, which stays the last line.
            let done = session.queued.all.map(\.id.description)
            if !done.isEmpty {
                Output.standardError(
                    "haul: note: \(done.joined(separator: " ")) queued in the haul daemon before that, and running "
                        + "there (`haul ls` shows \(done.count == 1 ? "it" : "them"))\n")
            }
            throw error
        }
    }
    guard !session.queued.all.isEmpty else {
        signals.stop()
        try? await client.shutdown()
        throw ExitCode.success
    }
    try await QueueRun.follow(client, stream, session.queued.all, syncedAt: target, signals: signals, output: display)
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

/// Runs `body` with a manager on the database that leaves other processes' downloads alone, and
/// closes it.
private func withLocalManager<Result>(_ state: StateOptions, _ body: (DownloadManager) async throws -> Result)
    async throws -> Result
{
    try await reportingErrors {
        // This manager never runs the queue: what it queues is left to the one that does.
        let manager = try QueueRun.openManager(state, TransferOptions.defaults, restoring: .leave, claiming: false)
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

extension TransferOptions {
    /// The options as they are when none is given, parsed once: each parse costs the process
    /// about a millisecond of reflection.
    static let defaults: TransferOptions = {
        do {
            return try TransferOptions.parse([])
        } catch {
            fatalError("the default transfer options do not parse: \(error)")
        }
    }()
}

struct List: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "List the recorded downloads: state, progress, sizes, speed and name.",
        discussion: "Rows are read from the database a page at a time, so a queue of any size lists in little memory.")

    @Option(
        help: ArgumentHelp(
            "Only downloads in this state (queued, running, paused, completed, failed, cancelled); repeatable, or several separated by commas.",
            valueName: "state"))
    var state: [String] = []

    @Option(help: ArgumentHelp("List at most this many downloads, the first ones added.", valueName: "n"))
    var limit: String?

    @Flag(help: "Print a JSON array of downloads on standard output.")
    var json = false

    @Option(
        help: ArgumentHelp(
            "List a fleet's queue in PostgreSQL (postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE) instead of the state directory's; a running download shows its worker.",
            valueName: "url"))
    var queue: String?

    @OptionGroup var stateOptions: StateOptions

    /// How many rows are read from the database at a time.
    static let pageSize = 500

    /// The states `--state` names (`nil`: every state), or the one-line reason it names none.
    static func states(_ values: [String]) -> Result<Set<DownloadState>?, ListError> {
        guard !values.isEmpty else { return .success(nil) }
        var states = Set<DownloadState>()
        for name in values.flatMap({ $0.split(separator: ",", omittingEmptySubsequences: false) }) {
            let trimmed = name.trimmingCharacters(in: .whitespaces)
            guard let state = DownloadState(rawValue: trimmed) else {
                return .failure(
                    ListError(
                        "unknown state '\(trimmed)' for --state; one of: "
                            + DownloadState.allCases.map(\.rawValue).joined(separator: ", ")))
            }
            states.insert(state)
        }
        return .success(states)
    }

    /// The number `--limit` gives, or the one-line reason it gives none.
    static func limit(_ value: String?) -> Result<Int?, ListError> {
        guard let value else { return .success(nil) }
        guard let number = Int(value), number > 0 else {
            return .failure(ListError("--limit takes a positive whole number of downloads, not '\(value)'"))
        }
        return .success(number)
    }

    /// Why `haul ls` was given a value it cannot use.
    struct ListError: Error {
        let message: String
        init(_ message: String) { self.message = message }
    }

    func run() async throws {
        let filter: Set<DownloadState>?
        let most: Int?
        do {
            filter = try Self.states(state).get()
            most = try Self.limit(limit).get()
        } catch {
            Output.standardError("haul: error: \(error.message)\n")
            throw ExitCode.validationFailure
        }
        if let queue {
            try await reportingErrors {
                let store = try PostgreSQLQueueStore(
                    location: try PostgreSQLLocation(parsing: queue), migrating: false)
                let reader = QueueReader(store: store)
                try await list(
                    Rows(states: filter, limit: most) { try reader.downloads(in: $0, after: $1, limit: $2) },
                    newestID: { try reader.newestID() }, empty: "no downloads in the queue \(store.location)",
                    workers: true)
            }
            return
        }
        // The database, not a running daemon: it also holds the downloads other haul processes run.
        try await withLocalManager(stateOptions) { manager in
            try await list(
                Rows(states: filter, limit: most) { try await manager.downloads(in: $0, after: $1, limit: $2) },
                newestID: { try await manager.newestID() },
                empty: "no downloads recorded in \(stateOptions.directory)", workers: false)
        }
    }

    /// Prints `rows`: a JSON array, or a table (with each running download's worker when
    /// `workers`), or `empty` when there are none.
    private func list(
        _ rows: Rows, newestID: () async throws -> DownloadID, empty: String, workers: Bool
    ) async throws {
        if json {
            var first = true
            try await rows.forEach { info in
                Output.standardOutput(
                    (first ? "[" : ",\n")
                        + JSONValue.object([("id", .integer(info.id.rawValue))] + QueueRenderer.jsonFields(info)))
                first = false
            }
            Output.standardOutput(first ? "[]\n" : "]\n")
            return
        }
        // The columns line up over every row. A listing of one page is measured whole; a longer
        // one is printed as it is read, each column as wide as its first page's cells or as any
        // value of its kind can be (labels: as the first page's).
        var layout = QueueRenderer.TableLayout(workers: workers)
        var printed = false
        try await rows.forEachPage { page, more in
            if !printed {
                for info in page { layout.measure(info) }
                if more { layout.allowForAnyValue(largestID: try await newestID()) }
                Output.standardOutput(layout.line(layout.header))
                printed = true
            }
            Output.standardOutput(page.map { layout.line(layout.cells($0)) }.joined())
        }
        if !printed { Output.standardOutput(empty + "\n") }
    }

    /// The downloads to list, read from a store page by page.
    struct Rows {
        let states: Set<DownloadState>?
        let limit: Int?
        /// Reads a page: the downloads in these states after this ID, at most this many.
        let read: (Set<DownloadState>?, DownloadID?, Int) async throws -> [DownloadInfo]

        /// Calls `body` with each download in ID order, holding one page at a time.
        func forEach(_ body: (DownloadInfo) throws -> Void) async throws {
            try await forEachPage { page, _ in
                for info in page { try body(info) }
            }
        }

        /// Calls `body` with each page of downloads in ID order, and whether more may follow.
        func forEachPage(_ body: ([DownloadInfo], _ more: Bool) async throws -> Void) async throws {
            var after: DownloadID?
            var left = limit ?? Int.max
            while left > 0 {
                let size = min(left, List.pageSize)
                let page = try await read(states, after, size)
                guard let last = page.last else { return }
                left -= page.count
                try await body(page, page.count == size && left > 0)
                after = last.id
            }
        }
    }
}

struct Resume: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "resume",
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
        try await runInQueue(state, transfer, display, daemon, perDownload: false, refusing: access.daemonRefusals) {
            session in
            var selected = try parseIDs(ids)
            if selected.isEmpty {
                selected = try await resumable(in: state, besides: session.daemonProcessID)
                if selected.isEmpty { Output.standardError("haul: nothing to resume\n") }
            }
            for id in selected {
                var site = url
                if site == nil { site = try await session.queue.download(id: id).url }
                // As for a new download: -u wins over credentials written into --url, which win over
                // a netrc file's.
                let written = url.flatMap { DownloadRequest.splittingCredentials($0).credentials }
                let credentials =
                    access.user == nil && written != nil ? nil : access.credentials(for: site ?? "", netrc: netrc)
                let change = ResumeChange(
                    url: url, headers: given, secretHeaders: secret, credentials: credentials, cookies: jar)
                session.queued.add([try await session.queue.resume(id, with: change)])
            }
        } finishing: {
            try access.save(jar)
        }
    }

    /// What `haul resume` without IDs continues, read from the database: what is paused or waits and
    /// is not another live process's (those of the daemon `daemonProcessID`, which runs them, are).
    private func resumable(in state: StateOptions, besides daemonProcessID: Int32?) async throws -> [DownloadID] {
        let manager = try QueueRun.openManager(state, TransferOptions.defaults, restoring: .leave)
        var selected: [DownloadID] = []
        for info in await manager.downloads(in: [.paused, .queued]) {
            let owner = await manager.runningProcess(of: info.id)
            if owner == nil || owner == daemonProcessID.map(String.init) { selected.append(info.id) }
        }
        await manager.close()
        return selected
    }
}

struct Retry: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "retry", abstract: "Start failed or cancelled downloads again.")

    @Argument(help: "IDs from `haul ls`.")
    var ids: [String]

    @OptionGroup var transfer: TransferOptions
    @OptionGroup var state: StateOptions
    @OptionGroup var display: OutputOptions
    @OptionGroup var daemon: DaemonUseOptions

    func validate() throws { _ = try parseIDs(ids) }

    func run() async throws {
        let selected = try parseIDs(ids)
        try await runInQueue(state, transfer, display, daemon, perDownload: false) { session in
            for id in selected { session.queued.add([try await session.queue.retry(id)]) }
        }
    }
}

struct Pause: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pause",
        abstract:
            "Pause downloads, queued or running in another haul process, keeping their partial data (`haul resume` continues them)."
    )

    @Argument(help: "IDs from `haul ls`.")
    var ids: [String]

    @OptionGroup var state: StateOptions

    func validate() throws { _ = try parseIDs(ids) }

    func run() async throws {
        try await forEach(ids, state, saying: "paused") { queue, id in try await queue.pause(id) }
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
        try await forEach(ids, state, saying: "removed") { queue, id in
            try await queue.remove(id, deletingFiles: deleteFiles)
        }
    }
}
