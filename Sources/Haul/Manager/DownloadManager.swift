import HeapModule
import Logging

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A persistent download queue: a limit on concurrent downloads, priorities, pause, resume, cancel and
/// remove, and progress for every download whether or not it runs, in this process or a later one.
///
/// ```swift
/// let manager = try DownloadManager(stateDirectory: DownloadManager.defaultStateDirectory)
/// let id = try await manager.enqueue(DownloadRequest(url: "https://example.com/a.iso", destination: .directory(".")))
/// try await withThrowingDiscardingTaskGroup { group in
///     group.addTask { await manager.run() }        // starts downloads until cancelled
///     for await event in manager.events(for: id) { print(event.download.state, event.download.bytes) }
///     group.cancelAll()                           // running downloads checkpoint and come back queued
/// }
/// await manager.close()
/// ```
///
/// Downloads start only while ``run()`` (or ``runUntilIdle()``) runs; their tasks are children of
/// that call, so cancelling it pauses every transfer with a durable checkpoint. The state lives in
/// SQLite (`downloads.sqlite` in the state directory, WAL mode), shared safely by several processes;
/// each download is run by at most one manager at a time.
public actor DownloadManager {
    /// How the queue behaves. Every value has a default that suits a command-line queue.
    public struct Configuration: Sendable {
        /// What a newly opened manager does with the downloads left queued (or running) by a manager
        /// that is gone.
        public enum RestoredDownloads: Sendable {
            /// Claim them and run them.
            case resume
            /// Mark them paused; ``DownloadManager/resume(_:url:headers:secretHeaders:credentials:cookies:)`` continues them.
            case pause
            /// Leave them queued for another manager (or a later ``DownloadManager/resume(_:url:headers:secretHeaders:credentials:cookies:)``).
            case leave
        }

        /// At most this many downloads transfer at once; the rest wait. A download whose file is
        /// complete and being made durable (flushed and renamed, see <doc:HowResumingStaysSafe>)
        /// no longer counts: the next one starts beside it, so a queue shows it running a little
        /// longer than its transfer.
        public var maxConcurrentDownloads: Int = 3
        /// What happens to the downloads a manager that is gone left queued or running.
        public var restoredDownloads: RestoredDownloads = .resume
        /// Whether the downloads this manager queues are its own to run (the default). A manager that
        /// only adds to a queue that another one runs (`haul add`) leaves them to nobody: the next
        /// manager to open the queue with ``RestoredDownloads/resume`` takes them, and closing this
        /// one has nothing to let go of (letting go of a million took seconds). Such a manager is for
        /// changing the queue, not for running it: a download it queues again, even one it ran, is
        /// left to nobody too.
        public var claimsQueuedDownloads = true
        /// Room that must stay free on a destination's volume beyond what its download still needs.
        public var freeSpaceMargin: Int64 = 64 << 20
        /// One limit shared by every download of this manager, in bytes per second.
        public var bytesPerSecondLimit: Int64?
        /// Credentials by host for the downloads that have none (no `Authorization` given to this
        /// manager), looked up each time one starts: a fleet's worker takes them from its own netrc
        /// file, whichever worker the download was added through. Never stored.
        public var netrc: Netrc?
        /// How often the progress of running downloads is written to the database.
        public var stateUpdateInterval: Duration = .seconds(1)
        /// How long changes made while downloads run (a start, an end, a file name learned) wait to be
        /// written together in one transaction (a group commit). Other processes see them that much
        /// later; a finished file is durable before its download is reported complete either way.
        public var commitInterval: Duration = .milliseconds(50)
        /// How many files the process may have open at once, as the manager plans for it; `nil`:
        /// the process's own (soft) limit when the manager is made. An app that keeps many files of
        /// its own open, or runs several managers, gives less.
        ///
        /// A download whose file is complete waits for its flush and rename holding three files,
        /// and no longer counts against ``maxConcurrentDownloads``: up to a sixteenth of this many
        /// downloads (at most 256), or twice ``maxConcurrentDownloads`` (at least 8, at most 64)
        /// when that is more, may wait so before no more start. The more wait, the larger the
        /// batches that share one flush of their file system.
        public var openFileLimit: Int?
        /// How often a download paused by a full disk checks whether there is room again.
        public var spaceCheckInterval: Duration = .seconds(5)
        /// The least time between two progress events of one download.
        public var progressInterval: Duration = .milliseconds(500)
        /// Schedules (when downloads start, the total limit by the time of day) and rules (by site,
        /// by kind of file); see ``DownloadManager/setRules(_:)`` to change them while the queue runs.
        public var rules = QueueRules()
        /// The time zone the rules' times are in.
        public var timeZone = TimeZone.current
        /// The date when the manager opens, from which its clock counts for the rules' times (the
        /// system's date when `nil`); a test gives one with a clock of its own.
        public var startDate: Date?

        /// The defaults.
        public init() {}
    }

    /// Where a download queue's state lives unless told otherwise: on Linux `$XDG_STATE_HOME/haul`,
    /// else `~/.local/state/haul`; on Apple platforms `Library/Application Support/haul` in the home
    /// directory (an app's own container on iOS). Apps outside a sandbox on macOS share that folder:
    /// they should pass a location of their own (one named after their bundle identifier).
    public static var defaultStateDirectory: String {
        let environment = ProcessInfo.processInfo.environment
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
        #if canImport(Darwin)
            return home + "/Library/Application Support/haul"
        #else
            if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") { return state + "/haul" }
            return home + "/.local/state/haul"
        #endif
    }

    /// ``defaultStateDirectory`` as a file URL.
    public static var defaultStateLocation: URL { URL(fileURLWithPath: defaultStateDirectory, isDirectory: true) }

    /// The database file's name inside the state directory.
    public static let databaseName = "downloads.sqlite"

    /// The directory of the state database (absolute).
    public nonisolated let stateDirectory: String
    /// The queue's settings (``setMaxConcurrentDownloads(_:)`` changes the limit at run time).
    public private(set) var configuration: Configuration
    /// Where the queue's records are kept (``SQLiteQueueStore`` in the state directory).
    let store: any QueueStore
    /// What runs each download, through the transport its configuration names.
    let downloader: Downloader
    /// Who this manager is among those sharing the queue (see ``QueueOwnership``).
    nonisolated let claim: any QueueOwnership

    /// This manager's name as a worker of a fleet sharing a queue in PostgreSQL (what
    /// ``DownloadInfo/worker`` says of the downloads it runs); `nil` for a queue of its own.
    package nonisolated var workerName: String? { claim.lease == nil ? nil : claim.name }
    /// Where downloads may write (``DownloaderConfiguration/downloadRoots``): their files are
    /// opened, and deleted, beneath those roots only.
    nonisolated let confinement: DownloadConfinement
    nonisolated let subscribers = Subscribers()
    /// The limit every download of this manager shares.
    package nonisolated let rateLimiter: RateLimiter

    /// The downloads this manager holds in memory, by ID: those it runs, those that start next
    /// (``waiting``), those with changes still to write, those it resumes once the disk has room,
    /// and those a caller read lately (let go by ``trim()``). Every other record is only in the
    /// store, which queries read.
    var entries: [DownloadID: Entry] = [:]
    /// Queued downloads of this manager that start next, best first: at most about
    /// ``windowSize``, none of them worse than one left in the store (stale entries are skipped when
    /// popped).
    var waiting = Heap<WaitingDownload>()
    /// Whether queued downloads of this manager wait in the store beyond ``waiting``, to be read
    /// once it is empty.
    var moreWaiting = false
    var jobs: [DownloadID: Job] = [:]
    /// The running downloads whose file is complete and being made durable and renamed: their
    /// transfer is over, and they hold no place of ``Configuration/maxConcurrentDownloads``.
    var finishing: Set<DownloadID> = []
    /// How many running downloads still transfer: those that count against
    /// ``Configuration/maxConcurrentDownloads``.
    var transferring: Int { jobs.count - finishing.count }
    /// How many downloads may be finishing at once before no more start (see
    /// ``finishingLimit(transfers:openFiles:)``), for the current limit on transfers.
    var finishingLimit: Int {
        Self.finishingLimit(transfers: configuration.maxConcurrentDownloads, openFiles: openFileBudget)
    }
    /// How many files the process may have open, as the manager plans for it
    /// (``Configuration/openFileLimit``, else the process's soft limit when the manager was made).
    let openFileBudget: Int

    /// How many downloads may be finishing at once, for `transfers` at once and a process that may
    /// open `openFiles` files: the larger of twice `transfers` (at least 8, at most 64) and a
    /// sixteenth of `openFiles`, and at most 256.
    ///
    /// Each finishing download holds three files open until it is renamed (its lock, its partial
    /// file and its directory): a sixteenth of the limit leaves more than four fifths of it to the
    /// rest. Within that, the more files wait, the larger the batches that share one flush of their
    /// file system, the fewer the flushes, and the sooner a queue of small files is done: with the
    /// shell's usual 1,024 that is 64, and 256 for `haul`, which raises the soft limit to the hard
    /// one (256 from a hard limit of 4,096 up). Measured with
    /// `bench/ab.sh` (2,000 files of 16 KiB, `-j 16`, ext4, 8 alternated pairs, 2026-11-27): 256
    /// against 32 (the earlier rule's) gave median ratios of 0.908 (0.74 → 0.69 s) and, in a faster
    /// hour of the machine, 0.970 (0.66 → 0.65 s).
    static func finishingLimit(transfers: Int, openFiles: Int) -> Int {
        min(256, max(8, min(64, 2 * transfers), openFiles / 16))
    }
    /// The events of running downloads, on their way to ``handle(_:of:)``.
    let mailbox = EventMailbox()
    /// Whether the queue runs, is being stopped or is closed (see ``Lifecycle``).
    var lifecycle = Lifecycle.idle
    var lastSpaceCheck: Moment
    /// Where the manager's ticks read time (and its downloads' rules, through its downloader).
    let clock: TransferClock
    /// Record changes not written yet (see ``writeSoon(_:)``).
    var unwritten = WriteBehind()
    /// Downloads a stop of the queue left queued and unowned, for the next ``start()`` to take back.
    var interrupted: Set<DownloadID> = []
    /// How many workers of a fleet share the total rate (1 for a queue of its own); see
    /// ``setBytesPerSecondLimit(_:)``.
    var fleetShare = 1
    /// A total rate set through this worker of a fleet, to write for every worker at the next tick
    /// (`.some(nil)`: none).
    var fleetRateToWrite: Int64?? = nil
    /// Completed downloads whose record waits to be written: their completion is told (events)
    /// once the store has it (see ``announceWritten()``).
    var announcing: Set<DownloadID> = []
    /// The transfer's `completed` event of each download in ``announcing`` that sent one.
    var heldCompletions: [DownloadID: DownloadEvent] = [:]
    /// Downloads other workers of a fleet run, and the worker, as their last notice showed them
    /// (see ``othersChanged(_:)``): a later change of one still running there is progress.
    var othersRunning: [DownloadID: String] = [:]
    /// A fleet's worker found its lease lost: its next tick stops every download and joins again.
    var leaseLost = false
    /// The clock's reading and the date when the manager opened: the rules' times are counted from them.
    let dateAnchor: (moment: Moment, date: Date)
    /// Where the rules stood at their last look (a scheduled total limit, whether downloads start).
    var rulesNow = QueueRules.Now(bytesPerSecond: nil, startsDownloads: true)
    /// Callers holding starts (see ``holdStarts()``): nothing starts while any does.
    var startsHeld = 0

    /// Opens (creating when needed) the state in `location` and reconciles it with the files on disk.
    ///
    /// - Parameters:
    ///   - location: the state directory, as a file URL.
    ///   - configuration: how the queue behaves.
    ///   - downloaderConfiguration: how each download transfers.
    ///   - logger: Haul logs nothing unless given one.
    public init(
        location: URL, configuration: Configuration = .init(),
        downloaderConfiguration: DownloaderConfiguration = .init(),
        logger: Logger? = nil
    ) throws {
        try self.init(
            stateDirectory: location.path, configuration: configuration,
            downloaderConfiguration: downloaderConfiguration, logger: logger)
    }

    /// Opens (creating when needed) the state in `stateDirectory` and reconciles it with the files on disk.
    ///
    /// - Parameters:
    ///   - stateDirectory: where the database lives; ``defaultStateDirectory`` unless given.
    ///   - configuration: how the queue behaves.
    ///   - downloaderConfiguration: how each download transfers.
    ///   - logger: Haul logs nothing unless given one (see ``Downloader/init(configuration:logger:clock:)``).
    ///   - clock: the clock the manager's ticks (storing progress, checking disk space, waiting
    ///     for another process) and its downloads' rules follow; the continuous clock unless a test gives
    ///     its own.
    public init(
        stateDirectory: String = DownloadManager.defaultStateDirectory, configuration: Configuration = .init(),
        downloaderConfiguration: DownloaderConfiguration = .init(), logger: Logger? = nil,
        clock: any Clock<Duration> = ContinuousClock()
    ) throws {
        let directory = POSIX.absolutePath(stateDirectory)
        // It holds the downloads' headers and URLs: its owner's alone.
        try POSIX.makePrivateDirectory(directory, marker: Self.databaseName)
        try self.init(
            store: try SQLiteQueueStore(path: directory + "/" + Self.databaseName),
            ownership: try ProcessClaim(stateDirectory: directory), stateDirectory: directory,
            configuration: configuration, downloaderConfiguration: downloaderConfiguration, logger: logger, clock: clock
        )
    }

    /// Opens the queue in `store`, as the manager `ownership` names, and reconciles it with the
    /// files on disk. A fleet's worker (an `ownership` with a lease) first takes over from the
    /// workers whose lease ran out, and leaves what was queued to whichever worker claims it.
    ///
    /// - Parameters:
    ///   - stateDirectory: the directory of this manager's own files (absolute).
    package init(
        store: any QueueStore, ownership: any QueueOwnership, stateDirectory: String, configuration: Configuration,
        downloaderConfiguration: DownloaderConfiguration, logger: Logger?, clock: any Clock<Duration>
    ) throws {
        self.stateDirectory = stateDirectory
        self.configuration = configuration
        self.store = store
        self.claim = ownership
        var transfer = downloaderConfiguration
        transfer.storage.freeSpaceMargin = configuration.freeSpaceMargin
        transfer.progressInterval = configuration.progressInterval
        transfer.connectionsPerHost =
            transfer.connectionsPerHost
            ?? max(8, configuration.maxConcurrentDownloads * transfer.segmentation.connections)
        // Always one shared limiter, so that a limit set later reaches running downloads too.
        let limiter =
            transfer.sharedRateLimiter ?? RateLimiter(bytesPerSecond: configuration.bytesPerSecondLimit, clock: clock)
        transfer.sharedRateLimiter = limiter
        if let lease = ownership.lease { transfer.writePermit = { lease.isHeld } }
        self.rateLimiter = limiter
        let downloader = Downloader(configuration: transfer, logger: logger, clock: clock)
        self.downloader = downloader
        self.clock = downloader.clock
        self.lastSpaceCheck = self.clock.now
        self.openFileBudget = configuration.openFileLimit ?? POSIX.openFileLimit()
        self.dateAnchor = (self.clock.now, configuration.startDate ?? Date())
        // A window that holds already holds from the first download on.
        let rulesNow = configuration.rules.now(at: dateAnchor.date, in: configuration.timeZone)
        self.rulesNow = rulesNow
        if let scheduled = rulesNow.bytesPerSecond { limiter.setRate(scheduled) }
        let confinement = DownloadConfinement(roots: transfer.downloadRoots)
        self.confinement = confinement
        if let lease = ownership.lease {
            _ = try lease.takeOverExpired()
            // A worker started with a total rate sets the fleet's; one started without follows it.
            if let limit = configuration.bytesPerSecondLimit { fleetRateToWrite = .some(limit) }
        }
        let (entries, waiting, more) = try Self.reconcile(
            store: store, claim: ownership,
            restoring: ownership.lease == nil ? configuration.restoredDownloads : .leave, confinement: confinement)
        self.entries = entries
        self.waiting = waiting
        // A fleet's worker looks for queued downloads nobody owns as soon as it runs.
        self.moreWaiting = more || ownership.lease != nil
    }

    /// Closes the connections and ends every event stream. Call it after ``run()`` has returned; a
    /// queue ``start()`` runs is stopped first. The downloads this manager had claimed are let go, so
    /// another manager (in this process or another) takes them on; this one runs and adds nothing
    /// more (a ``run()`` still under way starts nothing more and returns once its downloads stopped).
    public func close() async {
        await stop()
        guard lifecycle.close() else { return }
        releaseClaims()
        flushUnwritten()
        subscribers.finishAll()
        try? await downloader.shutdown()
    }

    /// Lets go of every download this manager claimed and is not running, and of its claim.
    private func releaseClaims() {
        // The changes still waiting go first, so that none of them claims a download again.
        writeWaiting()
        for (id, entry) in entries where entry.record.owner == claim.name && jobs[id] == nil {
            entries[id]?.record.owner = nil
        }
        waiting = Heap()
        moreWaiting = false
        _ = try? store.release(ownedBy: claim.name, keeping: Set(jobs.keys), now: Self.now)
        claim.release()
    }

    /// How many downloads this manager holds in memory (see ``entries``).
    package var heldCount: Int { entries.count }

    /// Changes the limit shared by every download at run time (`nil`: no limit); running downloads
    /// follow it from their next bytes on.
    ///
    /// A fleet's worker takes its share of the limit: the limit is the fleet's, shared equally by
    /// the workers that run downloads (counted at each tick).
    ///
    /// A fleet's worker also sets the fleet's limit, which every worker follows from its next tick.
    public func setBytesPerSecondLimit(_ limit: Int64?) {
        applyBytesPerSecondLimit(limit)
        if claim.lease != nil { fleetRateToWrite = .some(configuration.bytesPerSecondLimit) }
    }

    /// Takes `limit` as this manager's limit (its share of it, in a fleet).
    func applyBytesPerSecondLimit(_ limit: Int64?) {
        configuration.bytesPerSecondLimit = limit.map { max(1, $0) }
        applyRate()
    }

    /// Sets the shared limiter to the total limit in force: a speed window's while one holds, else
    /// the one set (this worker's share of it, in a fleet).
    func applyRate() {
        let total = rulesNow.bytesPerSecond ?? configuration.bytesPerSecondLimit
        rateLimiter.setRate(total.map { max(1, $0 / Int64(fleetShare)) })
    }

    /// Starts nothing until ``releaseStarts()``: a caller that adds a download and then pauses it or
    /// moves it in line does so before it can start.
    package func holdStarts() { startsHeld += 1 }

    /// Ends a ``holdStarts()``, and starts what can start.
    package func releaseStarts() {
        startsHeld = max(0, startsHeld - 1)
        schedule()
    }

    /// Replaces the schedules and rules while the queue runs (see ``QueueRules``): a limit or start
    /// window that holds now takes effect at once; site and file rules apply to downloads added
    /// from now on.
    public func setRules(_ rules: QueueRules) async throws {
        try rules.check()
        configuration.rules = rules
        await lookAtRules()
    }

    /// Changes the limit at run time. Lowering it lets running downloads finish; none is stopped.
    public func setMaxConcurrentDownloads(_ limit: Int) {
        configuration.maxConcurrentDownloads = max(1, limit)
        schedule()
    }
}

extension DownloadManager {
    /// A download's record and what is known about it only while it runs.
    struct Entry: Sendable {
        var record: StoredDownload
        var bytesPerSecond: Double?
        var secondsRemaining: Double?
        /// Connections open at the last progress report.
        var openConnections: Int?
        /// Whether the running transfer's bytes can be kept for a later attempt (see
        /// ``DownloadStart/resumable``); `nil` before it started.
        var resumable: Bool?

        var id: DownloadID { record.downloadID }
        var state: DownloadState { record.state }

        /// Moves the download to `state` (see ``StoredDownload/move(to:at:error:)``). The manager only
        /// asks for transitions the lifecycle allows; any other is a bug, which tests catch here.
        mutating func move(to state: DownloadState, error: HaulError? = nil) {
            do {
                try record.move(to: state, at: DownloadManager.now, error: error)
            } catch {
                assertionFailure("\(error)")
            }
        }

        var info: DownloadInfo {
            DownloadInfo(
                id: id, request: record.definition, destination: record.destination, state: state,
                priority: DownloadPriority(record.priority), bytes: record.bytes, totalBytes: record.totalBytes,
                bytesPerSecond: state == .running ? bytesPerSecond ?? record.bytesPerSecond : nil,
                secondsRemaining: state == .running ? secondsRemaining : nil, error: record.storedError,
                createdAt: Date(timeIntervalSince1970: record.createdAt),
                finishedAt: record.finishedAt.map { Date(timeIntervalSince1970: $0) }, hook: record.hook,
                openConnections: state == .running ? openConnections : nil,
                worker: state == .running ? record.owner : nil
            )
        }
    }

    /// A place in the queue: higher priority first, then earlier enqueued.
    struct WaitingDownload: Comparable, Sendable {
        let priority: Int
        let id: DownloadID

        static func < (left: WaitingDownload, right: WaitingDownload) -> Bool {
            left.priority != right.priority ? left.priority < right.priority : left.id > right.id
        }
    }

    /// Why a running download is being stopped.
    enum StopReason: Sendable {
        case pause
        case cancel
        case remove(deletingFiles: Bool)
        /// A fleet's worker lost its lease: the download may run elsewhere now, and this manager
        /// writes nothing more of it.
        case leaseLost
        /// The last start window closed: the download waits, queued, for the next.
        case outsideStartWindow
    }

    /// A download that is transferring now.
    struct Job {
        /// The transfer, once started; cancelling it stops the download with a checkpoint.
        var task: Task<DownloadResult, any Error>?
        /// Keeps the download's own limit, which ``changeRequest(_:_:)`` changes while it runs.
        var rateLimiter: RateLimiter?
        var reason: StopReason?
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    static var now: Double { Date().timeIntervalSince1970 }
}
