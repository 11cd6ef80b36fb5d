#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// One download's record in a ``QueueStore``: what a download manager must remember across processes.
///
/// What the user asked for is one field, ``definition``: the request, which a store keeps as
/// ``DownloadRequest``'s own encoder writes it, leaving its secrets out (so a field added to the
/// request is stored without a migration). The other fields are what the manager learns and
/// changes as the download runs, and the two it looks downloads up by (`key`, `destination`).
package struct StoredDownload: Codable, Sendable, Equatable {
    /// The number the store gave the record; `nil` until it is stored.
    package var id: Int64?
    /// What identifies the download: its destination file, or its URL and directory until the server names the file.
    package var key: String
    /// The request, its destination's path absolute. In memory it holds what was given in this
    /// process too (secret headers, cookies); the store never does.
    package var definition: DownloadRequest
    /// The file's path, once known (a download into a directory learns it from the server).
    package var destination: String?
    package var priority: Int
    /// Changed only by ``move(to:at:error:)``, which allows only the transitions of
    /// ``DownloadState/successors``.
    package private(set) var state: DownloadState
    package var errorCode: String?
    package var errorMessage: String?
    package var errorStatus: Int?
    package var bytes: Int64
    package var totalBytes: Int64?
    package var bytesPerSecond: Double?
    /// The manager running or about to run the download (`pid.n`); NULL when no manager has claimed it.
    package var owner: String?
    /// What another process asks the owner to do with the download; the owner clears it once done.
    /// Only ``QueueStore/setRequest(_:for:ifOwnedBy:)`` and ``QueueStore/clearRequest(for:)`` store it:
    /// the manager's writes of a record leave it as it is.
    package var request: OwnerRequest?
    /// What the program run when the download ended said (`on-complete exited 0`); cleared when
    /// it is queued again.
    package var hook: String?
    package var createdAt: Double
    package var startedAt: Double?
    package var finishedAt: Double?
    package var updatedAt: Double

    /// A new download's record: queued, owned by `owner`.
    package init(
        key: String, definition: DownloadRequest, destination: String?, priority: Int, owner: String?, now: Double
    ) {
        self.key = key
        self.definition = definition
        self.destination = destination
        self.priority = priority
        self.state = .queued
        self.bytes = 0
        self.owner = owner
        self.createdAt = now
        self.updatedAt = now
    }

    /// A record as a store holds it, every field as it was read.
    package init(
        id: Int64, key: String, definition: DownloadRequest, destination: String?, priority: Int,
        state: DownloadState, error: (code: String?, message: String?, status: Int?), bytes: Int64,
        totalBytes: Int64?, bytesPerSecond: Double?, owner: String?, request: OwnerRequest?, hook: String?,
        createdAt: Double, startedAt: Double?, finishedAt: Double?, updatedAt: Double
    ) {
        self.id = id
        self.key = key
        self.definition = definition
        self.destination = destination
        self.priority = priority
        self.state = state
        (errorCode, errorMessage, errorStatus) = error
        self.bytes = bytes
        self.totalBytes = totalBytes
        self.bytesPerSecond = bytesPerSecond
        self.owner = owner
        self.request = request
        self.hook = hook
        self.createdAt = createdAt
        self.startedAt = startedAt
        self.finishedAt = finishedAt
        self.updatedAt = updatedAt
    }

    package var downloadID: DownloadID { DownloadID(id ?? 0) }

    /// How the ``key`` of a download into a directory begins (`url:DIRECTORY\nURL`); the key of a
    /// download to a named file is `file:` and its path.
    package static let directoryKeyPrefix = "url:"

    /// The URL the next attempt uses.
    package var url: String {
        get { definition.url }
        set { definition.url = newValue }
    }

    /// The directory the file goes to, when the request named a directory rather than a file.
    package var directory: String? {
        guard case .directory(let path) = definition.destination else { return nil }
        return path
    }

    /// Keeps what `old` held in memory only (secret headers, cookies) when this record was read
    /// back from the store, which never has them.
    package mutating func keepSecrets(of old: StoredDownload) {
        let given = old.definition
        guard given.cookies != nil || given.headers.contains(where: { given.isSecret($0.name) }) else { return }
        definition.headers = given.headers
        definition.secretHeaders = given.secretHeaders
        definition.cookies = given.cookies
    }

    package var storedError: HaulError? {
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

    // MARK: How a store keeps the request

    /// The request as a store keeps it: JSON with sorted keys, without secrets (see
    /// ``DownloadRequest``'s encoder).
    package static func encodeDefinition(_ definition: DownloadRequest) -> String {
        DefinitionJSON.encode(definition)
    }

    /// The request a store kept as ``encodeDefinition(_:)`` wrote it.
    package static func decodeDefinition(_ text: String) throws -> DownloadRequest {
        try definitionDecoder.decode(DownloadRequest.self, from: Data(text.utf8))
    }

    /// The decoder of ``decodeDefinition(_:)``, made once (an add reads thousands of records).
    private static let definitionDecoder = JSONDecoder()

    // MARK: The lifecycle

    /// Moves the download to `next` at `now` (seconds since the epoch), with the times and error that
    /// state records. A transition the table in ``DownloadState/successors`` does not allow is refused
    /// with ``HaulError/Code/invalidState`` and changes nothing.
    package mutating func move(to next: DownloadState, at now: Double, error: HaulError? = nil) throws {
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
    package var successors: Set<DownloadState> {
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
/// ``StoredDownload/request``).
package enum OwnerRequest: String, Codable, Sendable, CaseIterable {
    case pause
    case cancel
    case remove
    case removeFiles = "remove-files"
}
