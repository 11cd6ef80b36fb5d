import GRDB

/// One row of the `download` table: what a download manager must remember across processes.
/// Secrets never reach it: request headers are stored without `Authorization`, `Proxy-Authorization`
/// and `Cookie`.
struct StoredDownload: Codable, Sendable, Equatable, FetchableRecord, MutablePersistableRecord {
    static let databaseTableName = "download"

    var id: Int64?
    /// What identifies the download: its destination file, or its URL and directory until the server names the file.
    var key: String
    var url: String
    var directory: String?
    var destination: String?
    var overwrite: Bool
    var checksum: String?
    var rateLimit: Int64?
    /// The connections the request asked for; NULL: the manager's default.
    var connections: Int?
    /// The request's mirrors, one URL per line; NULL: none.
    var mirrors: String?
    var priority: Int
    /// Changed only by ``move(to:at:error:)``, which allows only the transitions of
    /// ``DownloadState/successors``.
    private(set) var state: DownloadState
    var errorCode: String?
    var errorMessage: String?
    var errorStatus: Int?
    var bytes: Int64
    var totalBytes: Int64?
    var bytesPerSecond: Double?
    /// The manager running or about to run the download (`pid.n`); NULL when no manager has claimed it.
    var owner: String?
    /// What another process asks the owner to do with the download; the owner clears it once done.
    var request: OwnerRequest?
    /// What the program run when the download ended said (`on-complete exited 0`); cleared when
    /// it is queued again.
    var hook: String?
    var createdAt: Double
    var startedAt: Double?
    var finishedAt: Double?
    var updatedAt: Double

    /// A new download's record: queued, owned by `owner`.
    init(
        key: String, url: String, directory: String?, destination: String?, overwrite: Bool, checksum: String?,
        rateLimit: Int64?, connections: Int? = nil, mirrors: [String] = [], priority: Int, owner: String?, now: Double
    ) {
        self.key = key
        self.url = url
        self.directory = directory
        self.destination = destination
        self.overwrite = overwrite
        self.checksum = checksum
        self.rateLimit = rateLimit
        self.connections = connections
        self.mirrors = mirrors.isEmpty ? nil : mirrors.joined(separator: "\n")
        self.priority = priority
        self.state = .queued
        self.bytes = 0
        self.owner = owner
        self.createdAt = now
        self.updatedAt = now
    }

    mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }

    /// Every column but `id` and `request`, each with its value: the manager writes whole records
    /// without ever clearing a request another process has just made. One list, so a column and its
    /// value cannot drift apart.
    private static let managedColumns: [(name: String, value: @Sendable (StoredDownload) -> DatabaseValue)] = [
        ("key", { $0.key.databaseValue }), ("url", { $0.url.databaseValue }),
        ("directory", { $0.directory.databaseValue }), ("destination", { $0.destination.databaseValue }),
        ("overwrite", { $0.overwrite.databaseValue }), ("checksum", { $0.checksum.databaseValue }),
        ("rateLimit", { $0.rateLimit.databaseValue }), ("connections", { $0.connections.databaseValue }),
        ("mirrors", { $0.mirrors.databaseValue }), ("priority", { $0.priority.databaseValue }),
        ("state", { $0.state.rawValue.databaseValue }), ("errorCode", { $0.errorCode.databaseValue }),
        ("errorMessage", { $0.errorMessage.databaseValue }), ("errorStatus", { $0.errorStatus.databaseValue }),
        ("bytes", { $0.bytes.databaseValue }), ("totalBytes", { $0.totalBytes.databaseValue }),
        ("bytesPerSecond", { $0.bytesPerSecond.databaseValue }), ("owner", { $0.owner.databaseValue }),
        ("hook", { $0.hook.databaseValue }), ("createdAt", { $0.createdAt.databaseValue }),
        ("startedAt", { $0.startedAt.databaseValue }),
        ("finishedAt", { $0.finishedAt.databaseValue }), ("updatedAt", { $0.updatedAt.databaseValue }),
    ]

    /// One prepared statement for every update: a download's record is written several times over
    /// its life, and building the statement from the record each time costs more than running it.
    private static let updateManagedSQL =
        "UPDATE download SET " + managedColumns.map { "\"\($0.name)\" = ?" }.joined(separator: ", ")
        + " WHERE id = ?"

    func updateManagedColumns(_ db: Database) throws {
        let values = Self.managedColumns.map { $0.value(self) } + [id.databaseValue]
        try db.cachedStatement(sql: Self.updateManagedSQL).execute(arguments: StatementArguments(values))
        guard db.changesCount > 0 else {
            throw RecordError.recordNotFound(databaseTableName: Self.databaseTableName, key: ["id": id.databaseValue])
        }
    }

    var downloadID: DownloadID { DownloadID(id ?? 0) }

    /// The mirrors as a list (URLs hold no line break: they are checked before they are stored).
    var mirrorList: [String] {
        get { mirrors.map { $0.split(separator: "\n").map(String.init) } ?? [] }
        set { mirrors = newValue.isEmpty ? nil : newValue.joined(separator: "\n") }
    }

    var storedError: HaulError? {
        get {
            guard let errorCode else { return nil }
            return HaulError(HaulError.Code(errorCode), errorMessage ?? errorCode, status: errorStatus)
        }
        set {
            errorCode = newValue?.code.name
            errorMessage = newValue?.message
            errorStatus = newValue?.status
        }
    }

    // MARK: The lifecycle

    /// Moves the download to `next` at `now` (seconds since the epoch), with the times and error that
    /// state records. A transition the table in ``DownloadState/successors`` does not allow is refused
    /// with ``HaulError/Code/invalidState`` and changes nothing.
    mutating func move(to next: DownloadState, at now: Double, error: HaulError? = nil) throws {
        guard next == state || state.successors.contains(next) else {
            throw HaulError(.invalidState, "download \(downloadID) cannot go from \(state) to \(next)")
        }
        state = next
        updatedAt = now
        bytesPerSecond = nil
        switch next {
        case .queued:
            storedError = nil
            finishedAt = nil
            hook = nil
        case .running:
            startedAt = now
            storedError = nil
        case .paused:
            // A download paused by a full disk keeps the error: it says why, and it resumes by itself.
            storedError = error
        case .completed:
            storedError = nil
            finishedAt = now
        case .failed:
            storedError = error
            finishedAt = now
        case .cancelled:
            storedError = nil
            finishedAt = now
            bytes = 0
        }
    }
}

/// The one place a download's state changes: which transitions are allowed, and what each sets.
extension DownloadState {
    /// The states a download may move to from this one (besides staying where it is).
    var successors: Set<DownloadState> {
        switch self {
        // `completed`: the file got its final name before a process that died could say so.
        case .queued: [.running, .paused, .cancelled, .completed]
        // `queued`: the manager stops and the download waits for the next one.
        case .running: [.queued, .paused, .completed, .failed, .cancelled]
        case .paused: [.queued, .cancelled]
        // `failed`: the finished file vanished; `queued`: it is asked for again.
        case .completed: [.queued, .failed]
        case .failed: [.queued, .cancelled]
        case .cancelled: [.queued]
        }
    }
}

/// What another process asks the manager that owns a download to do with it (the record's
/// `request` column).
enum OwnerRequest: String, Codable, Sendable, CaseIterable {
    case pause
    case cancel
    case remove
    case removeFiles = "remove-files"
}
