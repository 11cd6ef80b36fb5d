import Dispatch
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

extension DownloadManager {
    /// Adds a download to the queue and returns its ID.
    ///
    /// A request for a destination the manager already knows (the same file, or the same URL into the
    /// same directory) returns the existing download and never makes a second writer: a paused, failed
    /// or cancelled one is queued again with this request's URL and headers (a refreshed link keeps the
    /// partial data when the file is unchanged); a completed one whose file is still there stays
    /// completed unless the request asks to overwrite. Another URL for the file of a download that is
    /// queued, running or completed is refused, unless the request asks to overwrite: then that
    /// download is removed first (its finished file stays until the new one replaces it).
    ///
    /// - Throws: ``HaulError/Code/invalidURL`` or ``HaulError/Code/unsupportedScheme`` for a bad URL,
    ///   ``HaulError/Code/invalidArgument`` for a limit or connection count out of range,
    ///   ``HaulError/Code/destinationExists`` when a file the manager did not download is in the way,
    ///   or another URL's download has the file (its ID in ``HaulError/downloadID``),
    ///   ``HaulError/Code/locked`` when another process runs this download.
    @discardableResult
    public func enqueue(_ request: DownloadRequest, priority: DownloadPriority = .normal) async throws -> DownloadID {
        try await enqueue([request], priority: priority)[0]
    }

    /// Adds several downloads, a few thousand per database transaction (much faster than one by one
    /// for long lists). Nothing is added when one of them is refused.
    public func enqueue(_ requests: [DownloadRequest], priority: DownloadPriority = .normal) async throws
        -> [DownloadID]
    {
        try await enqueue(DownloadRequestList(requests), priority: priority)
    }

    /// Adds the downloads of a list read a chunk at a time, a chunk per database transaction, and
    /// returns their IDs in order: a list of a million holds a chunk of requests in memory, not the
    /// list. The list is read twice: every request is checked first, and nothing is added when one
    /// of them is refused or the list cannot be read. (When the second read fails all the same — the
    /// list or the disk changed in between — what its earlier chunks added stays, and the error
    /// says how many.) A list that gives all its requests in one chunk is read once: they are added
    /// from that chunk.
    public func enqueue(_ list: DownloadRequestList, priority: DownloadPriority = .normal) async throws
        -> [DownloadID]
    {
        var ids: [DownloadID] = []
        try await enqueueEvery(list, priority: priority, withInfo: false) { answers in ids += answers.map { $0.id } }
        return ids
    }

    /// ``enqueue(_:priority:)-([DownloadRequest],_)``, with each download as the add left it (a known
    /// one as stored, or queued again) when `withInfo`.
    func enqueueAnswering(_ requests: [DownloadRequest], priority: DownloadPriority, withInfo: Bool = true)
        async throws -> [(id: DownloadID, info: DownloadInfo?)]
    {
        var answers: [(id: DownloadID, info: DownloadInfo?)] = []
        answers.reserveCapacity(requests.count)
        try await enqueueEvery(DownloadRequestList(requests), priority: priority, withInfo: withInfo) { answers += $0 }
        return answers
    }

    /// Adds the downloads of `list`, passing the answer of each chunk to `answered` once it is
    /// written.
    private func enqueueEvery(
        _ list: DownloadRequestList, priority: DownloadPriority, withInfo: Bool,
        answered: ([(id: DownloadID, info: DownloadInfo?)]) -> Void
    ) async throws {
        // What was added starts (in a running queue) however the add ends.
        defer { schedule() }
        // Every refusal is found before any download is replaced or added.
        var replaced: [DownloadID] = []
        let rules = configuration.rules
        var firstReading = FirstReading(othersChangeVersion: (try? store.othersChangeVersion()) ?? nil)
        // A list read in one chunk is added from that chunk, not read (and parsed) a second time.
        var chunksRead = 0
        var onlyChunk: [DownloadRequest] = []
        try list.read { requests in
            let requests = rules.applied(to: requests)
            // The first chunk is let go as the second comes.
            onlyChunk = chunksRead == 0 ? requests : []
            chunksRead += 1
            let examined = try examine(requests)
            if let refusal = examined.refusal { throw refusal.error }
            replaced += examined.replaced
            firstReading.checked(requests.count, found: examined.found)
            trim()
        }
        let readAgain: (([DownloadRequest]) throws -> Void) throws -> Void
        if chunksRead == 1 {
            readAgain = { [onlyChunk] add in try add(onlyChunk) }
        } else {
            readAgain = { add in try list.read { try add(rules.applied(to: $0)) } }
        }
        for id in replaced { try await remove(id, deletingFiles: false) }
        var added = 0
        // A chunk that names nothing stored is written on another thread while the next one is
        // decided (see ``BackgroundCommit``).
        var running: RunningChunk?
        // Nothing is removed before the chunks are added, and no fleet's lease fences the commits.
        let alone = replaced.isEmpty && claim.lease == nil
        do {
            try readAgain { requests in
                for chunk in Self.chunks(of: requests) {
                    let start = added + (running?.decided.requests.count ?? 0)
                    let decided =
                        alone && firstReading.foundNothing(in: start..<start + chunk.count)
                        ? try decide(chunk, priority: priority, known: Known()) : nil
                    let version = try settleChunk(
                        &running, added: &added, priority: priority, withInfo: withInfo, answered: answered,
                        versionWanted: decided != nil)
                    // Decided before the version was read: nothing changed elsewhere before that.
                    if let decided, firstReading.nothingChangedElsewhere(now: version), unwritten.isEmpty {
                        running = (decided, BackgroundCommit(decided.changes, store: store))
                    } else {
                        answered(try enqueueChunk(chunk, priority: priority, withInfo: withInfo, known: nil))
                        added += chunk.count
                        trim()
                    }
                }
            }
            _ = try settleChunk(&running, added: &added, priority: priority, withInfo: withInfo, answered: answered)
        } catch {
            // What a chunk being written adds stays, and is counted.
            if running != nil {
                _ = try? settleChunk(
                    &running, added: &added, priority: priority, withInfo: withInfo, answered: answered)
            }
            guard added > 0 else { throw error }
            let wrapped = HaulError.wrapping(error)
            throw HaulError(
                wrapped.code,
                "\(wrapped.message) (after the list's first \(added) downloads were added)",
                status: wrapped.status, underlying: wrapped.underlying, downloadID: wrapped.downloadID)
        }
        if added != firstReading.checked {
            throw HaulError(
                .invalidArgument,
                "the list gave \(firstReading.checked) requests, then \(added): it changed while it was added")
        }
    }

    /// A decided chunk whose commit runs on another thread.
    private typealias RunningChunk = (decided: DecidedChunk, commit: BackgroundCommit)

    /// Ends the chunk being written (`running`), if any: takes it into memory and passes its
    /// answers on, counted in `added`. Returns the store's version of others' changes after it
    /// (read now when no chunk was being written and `versionWanted`).
    private func settleChunk(
        _ running: inout RunningChunk?, added: inout Int, priority: DownloadPriority, withInfo: Bool,
        answered: ([(id: DownloadID, info: DownloadInfo?)]) -> Void, versionWanted: Bool = false
    ) throws -> Int? {
        guard let (decided, commit) = running else {
            return versionWanted ? (try? store.othersChangeVersion()) ?? nil : nil
        }
        running = nil
        let version: Int?
        let answers: [(id: DownloadID, info: DownloadInfo?)]
        do {
            let written = try commit.wait()
            (version, answers) = (written.version, apply(decided, newIDs: written.ids, withInfo: withInfo))
            announceWritten()
        } catch {
            // A file an earlier chunk added (see FirstReading), or another failure: nothing of this
            // chunk was written. It is decided again with the lookup; a failure that stays is told.
            version = nil
            answers = try enqueueChunk(decided.requests, priority: priority, withInfo: withInfo, known: nil)
        }
        answered(answers)
        added += decided.requests.count
        // Known downloads read for the add stay in memory only as long as needed.
        trim()
        return version
    }

    /// How many requests of a long list are decided and written together, in one transaction.
    package static let enqueueBatch = 2_000

    /// `requests` in slices of ``enqueueBatch``.
    static func chunks(of requests: [DownloadRequest]) -> [ArraySlice<DownloadRequest>] {
        stride(from: 0, to: requests.count, by: enqueueBatch).map {
            requests[$0..<min(requests.count, $0 + enqueueBatch)]
        }
    }

    /// What the first reading of a list (the check) learnt that spares the second (the add) its
    /// lookups: where the list names downloads already stored. A chunk of the add for which the
    /// check found none, while nothing but this manager changed the store since, names none now
    /// but those the add's earlier chunks inserted, which the store's unique key refuses (the
    /// chunk is then decided again, with the lookup). An add of a hundred thousand new downloads
    /// spent a tenth of its time looking them up a second time.
    struct FirstReading {
        /// The store's ``QueueStore/othersChangeVersion()`` before the check; `nil`: unknown.
        private let othersChangeVersion: Int?
        /// The places in the list of the chunks in which the check found stored downloads.
        private var found: [Range<Int>] = []
        /// How many requests of the list were checked.
        private(set) var checked = 0

        init(othersChangeVersion: Int?) {
            self.othersChangeVersion = othersChangeVersion
        }

        /// The check looked at the next `count` requests and found stored downloads in these
        /// chunks of them (places from the first of them).
        mutating func checked(_ count: Int, found chunks: [Range<Int>]) {
            found += chunks.map { checked + $0.lowerBound..<checked + $0.upperBound }
            checked += count
        }

        /// Whether the check looked at the requests at `places` and found nothing stored for them,
        /// in a store that can tell others' changes. (A list that grew after the check is looked
        /// up past its checked end.)
        func foundNothing(in places: Range<Int>) -> Bool {
            othersChangeVersion != nil && places.upperBound <= checked && !found.contains { $0.overlaps(places) }
        }

        /// Whether nothing but this manager changed the store since the check (`now` is its
        /// version now).
        func nothingChangedElsewhere(now: Int?) -> Bool {
            now != nil && now == othersChangeVersion
        }
    }

    /// One slice of an add, decided: what the store is to add and change, and each request's answer.
    private struct DecidedChunk {
        let requests: ArraySlice<DownloadRequest>
        var batch: Batch
        let answers: [BatchAnswer]

        /// What the store is to add and change.
        var changes: QueueChanges {
            QueueChanges(updates: batch.updates, inserts: batch.added.map { $0.entry.record })
        }
    }

    /// A chunk's commit, made on another thread while the manager decides the next chunk: an add of
    /// a million spent more than half its time writing, with the second core mostly idle. Only a
    /// chunk that names no stored download is written so (see ``FirstReading``): deciding it reads
    /// nothing the commit before it writes. With its IDs comes the store's version of others'
    /// changes right after it.
    ///
    /// The commit is made by whichever thread comes to it first: a global queue's, or the manager's
    /// when it waits for a commit no other thread has started. So the manager's thread (a task's)
    /// only ever waits for a commit under way.
    private final class BackgroundCommit: @unchecked Sendable {
        private let commit: @Sendable () -> Result<(ids: [DownloadID], version: Int?), any Error>
        private let claimed = Atomic<Bool>(false)
        private let done = DispatchSemaphore(value: 0)
        /// Written once, before `done` is signalled; read only after a wait for it.
        private var outcome: Result<(ids: [DownloadID], version: Int?), any Error>?

        init(_ changes: QueueChanges, store: any QueueStore) {
            commit = { Result { (try store.commit(changes), (try? store.othersChangeVersion()) ?? nil) } }
            DispatchQueue.global().async { self.make() }
        }

        /// Makes the commit unless another thread has claimed it.
        private func make() {
            guard !claimed.exchange(true, ordering: .acquiringAndReleasing) else { return }
            outcome = commit()
            done.signal()
        }

        /// The commit's outcome, once it has one.
        func wait() throws -> (ids: [DownloadID], version: Int?) {
            make()
            done.wait()
            return try outcome!.get()
        }
    }

    /// Adds one slice of an ``enqueue(_:priority:)-([DownloadRequest],_)`` call in one transaction,
    /// with the stored downloads it names, looked up when `known` is `nil`.
    private func enqueueChunk(
        _ requests: ArraySlice<DownloadRequest>, priority: DownloadPriority, withInfo: Bool, known: Known?
    ) throws -> [(id: DownloadID, info: DownloadInfo?)] {
        // Everything is decided first; the store then adds and changes it all in one transaction, and
        // the memory changes only once that has committed. Changes still waiting to be written go
        // first, so a download queued again here is not overwritten by its older record.
        let decided = try decide(requests, priority: priority, known: try known ?? self.known(requests))
        return apply(decided, newIDs: try write(decided.changes), withInfo: withInfo)
    }

    /// Decides what each request of a slice does, with the stored downloads it names; changes
    /// nothing.
    private func decide(_ requests: ArraySlice<DownloadRequest>, priority: DownloadPriority, known: Known) throws
        -> DecidedChunk
    {
        var batch = Batch(folders: OpenFolders(confinement: confinement))
        let answers = try requests.map { request in
            try add(request, priority: priority, known: known, batch: &batch)
        }
        return DecidedChunk(requests: requests, batch: batch, answers: answers)
    }

    /// Takes a decided slice into memory once the store has written it (`newIDs`: the IDs given to
    /// its new downloads), and returns each request's answer.
    private func apply(_ decided: DecidedChunk, newIDs: [DownloadID], withInfo: Bool)
        -> [(id: DownloadID, info: DownloadInfo?)]
    {
        var batch = decided.batch
        let answers = decided.answers
        for (position, id) in newIDs.enumerated() { batch.added[position].entry.record.id = id.rawValue }
        for (_, entry) in batch.added {
            publish(.added, entry)
            line(entry)
        }
        for entry in batch.changed {
            if entry.state == .queued {
                publish(.stateChanged, entry)
                line(entry)
            } else {
                entries[entry.id] = entry
            }
        }
        let changed = Dictionary(batch.changed.map { ($0.id, $0) }, uniquingKeysWith: { $1 })
        return answers.map { answer in
            switch answer {
            case .known(let record):
                // As the batch left it, without reading it again.
                (
                    record.downloadID,
                    withInfo
                        ? (changed[record.downloadID] ?? entries[record.downloadID] ?? Entry(record: record)).info : nil
                )
            case .added(let position):
                (batch.added[position].entry.id, withInfo ? batch.added[position].entry.info : nil)
            }
        }
    }

    /// The stored downloads `requests` may name, once the changes still waiting are written.
    private func known(_ requests: ArraySlice<DownloadRequest>) throws -> Known {
        writeWaiting()
        return try Known(requests, store: store)
    }

    /// The stored downloads a slice of requests may name, read together: by key, and by file.
    struct Known {
        private var byKey: [String: StoredDownload] = [:]
        private var byDestination: [String: StoredDownload] = [:]

        /// None.
        init() {}

        /// Whether none was found.
        var isEmpty: Bool { byKey.isEmpty && byDestination.isEmpty }

        /// Reads the downloads of `requests` from `store` (which the manager brought up to date
        /// with ``writeWaiting()``: a file a download learnt, a download removed).
        init(_ requests: some Collection<DownloadRequest>, store: any QueueStore) throws {
            let identities = requests.map(Identity.init)
            for record in try store.downloads(keys: identities.map { $0.key }) { byKey[record.key] = record }
            // By file, those no key names (found by key, a download is not looked up by file): a
            // download into a directory may have learnt the file a request names.
            let unnamed = identities.filter { byKey[$0.key] == nil }.compactMap(\.destination)
            // The latest download of a file wins (two downloads into a directory may have learnt one name).
            for record in try store.downloadsIntoDirectories(destinations: unnamed) {
                if let destination = record.destination { byDestination[destination] = record }
            }
        }

        /// The stored download `identity` names: by key, else by file.
        func find(_ identity: Identity) -> StoredDownload? {
            byKey[identity.key] ?? identity.destination.flatMap { byDestination[$0] }
        }
    }

    /// What one `enqueue` call adds and changes.
    private struct Batch {
        /// New downloads, in the order the store adds them.
        var added: [(identity: Identity, entry: Entry)] = []
        /// Known downloads queued again, or given the new request's headers while they run or wait.
        var changed: [Entry] = []
        /// The records of the downloads queued again, to store.
        var updates: [StoredDownload] = []
        /// Where in ``added`` the new download of each key, and of each destination, is.
        var addedByKey: [String: Int] = [:]
        var addedByDestination: [String: Int] = [:]
        /// The directories of the new downloads, each opened once.
        var folders: OpenFolders

        /// The new download of this batch `identity` names, as a place in ``added``.
        func find(_ identity: Identity) -> Int? {
            addedByKey[identity.key] ?? identity.destination.flatMap { addedByDestination[$0] }
        }

        /// Notes a new download.
        mutating func add(_ identity: Identity, _ entry: Entry) {
            addedByKey[identity.key] = added.count
            if let destination = identity.destination { addedByDestination[destination] = added.count }
            added.append((identity, entry))
        }
    }

    /// Which download one request of an `enqueue` call is: one the manager knows, or a new one (its
    /// place in ``Batch/added``), whose ID the store gives when the batch is written.
    private enum BatchAnswer {
        case known(StoredDownload)
        case added(Int)
    }

    /// The first of `requests` ``enqueue(_:priority:)-([DownloadRequest],_)`` would refuse, and why;
    /// `nil` when it would take them all. Nothing changes: a caller that must add all or nothing
    /// (the daemon's API) asks first.
    package func refusal(of requests: [DownloadRequest]) throws -> (index: Int, error: HaulError)? {
        try examine(configuration.rules.applied(to: requests)).refusal
    }

    /// The first of `requests` that would be refused and why, else the downloads of other URLs their
    /// files replace and the places of the chunks that name stored downloads; one read of the
    /// store per chunk of requests.
    private func examine(_ requests: [DownloadRequest]) throws -> (
        refusal: (index: Int, error: HaulError)?, replaced: [DownloadID], found: [Range<Int>]
    ) {
        guard !lifecycle.isClosed else {
            return ((0, HaulError(.invalidState, "the download manager is closed")), [], [])
        }
        var position = 0
        var replaced: [DownloadID] = []
        var found: [Range<Int>] = []
        for chunk in Self.chunks(of: requests) {
            let known = try known(chunk)
            if !known.isEmpty { found.append(position..<position + chunk.count) }
            var folders = OpenFolders(confinement: confinement)
            for request in chunk {
                defer { position += 1 }
                do {
                    try request.check()
                    let identity = Identity(request)
                    try confinement.checkContains(identity.destination ?? identity.directory ?? "")
                    if let other = try downloadOfAnotherURL(for: request, known: known) { replaced.append(other) }
                    if known.find(identity) == nil {
                        try checkNothingInTheWay(identity, overwriting: request.overwrite, folders: &folders)
                    }
                } catch {
                    return ((position, HaulError.wrapping(error)), [], [])
                }
            }
        }
        return (nil, replaced, found)
    }

    /// Throws when a file Haul did not download is at the destination and the request does not
    /// overwrite it.
    private func checkNothingInTheWay(_ identity: Identity, overwriting: Bool, folders: inout OpenFolders) throws {
        if let destination = identity.destination, !overwriting, let paths = folders.paths(destination),
            paths.folder.exists(paths.fileName), Self.storedProgress(paths) == nil
        {
            throw HaulError(.destinationExists, "\(destination) already exists")
        }
    }

    /// Decides what one request of `batch` does: names a download already known (queued again when
    /// it may be) or a new one.
    private func add(
        _ request: DownloadRequest, priority: DownloadPriority, known: Known, batch: inout Batch
    ) throws -> BatchAnswer {
        let identity = Identity(request)
        if let position = batch.find(identity) { return .added(position) }
        if let record = known.find(identity) {
            let id = record.downloadID
            try learn(id, stored: record)
            if let (entry, changed) = try requeued(id, with: request, priority: priority) {
                batch.changed.append(entry)
                if changed { batch.updates.append(entry.record) }
            }
            return .known(record)
        }
        try checkNothingInTheWay(identity, overwriting: request.overwrite, folders: &batch.folders)
        var record = StoredDownload(
            key: identity.key, definition: identity.normalized(request), destination: identity.destination,
            priority: priority.rawValue, owner: ownerOfQueued, now: Self.now)
        Self.refreshFromDisk(&record, folders: &batch.folders)
        batch.add(identity, Entry(record: record))
        return .added(batch.added.count - 1)
    }

    /// The download of another URL that holds the file `request` names and must make way for it
    /// (`request` overwrites); throws when it may not.
    private func downloadOfAnotherURL(for request: DownloadRequest, known: Known) throws -> DownloadID? {
        let identity = Identity(request)
        guard identity.destination != nil, let record = known.find(identity) else { return nil }
        let id = record.downloadID
        try learn(id, stored: record)
        guard let entry = entries[id], entry.record.url != request.url else { return nil }
        let runsElsewhere = entry.record.owner.map { $0 != claim.name && claim.isAlive($0) } ?? false
        switch entry.state {
        case .paused, .failed, .cancelled:
            // A refreshed link continues the download (see requeued(_:with:priority:)).
            return nil
        case .queued where entry.record.owner == nil || !(runsElsewhere || entry.record.owner == claim.name):
            // Left queued by a process that is gone (killed, or the machine restarted): as paused.
            return nil
        case .completed where entry.record.destination.map(finishedFileExists) != true:
            return nil
        case .queued, .running, .completed:
            if request.overwrite { return id }
            let keep =
                entry.state == .completed
                ? ""
                : "; to keep its partial data, pause it and resume it with the new URL (haul resume \(id) --url URL)"
            throw HaulError(
                .destinationExists,
                "\(entry.info.destination ?? entry.info.name) is the file of download \(id) (\(entry.record.url), "
                    + "\(entry.state)): overwrite (haul get --force) replaces that download" + keep,
                downloadID: id)
        }
    }

    /// The existing download queued again for a new request of the same destination (`changed`: its
    /// record is to be stored), or given the request's headers only (running, or already queued
    /// here); `nil` when it stays as it is (completed with its file in place).
    private func requeued(
        _ id: DownloadID, with request: DownloadRequest, priority: DownloadPriority
    ) throws -> (entry: Entry, changed: Bool)? {
        guard var entry = entries[id] else { return nil }
        if let owner = entry.record.owner, owner != claim.name, claim.isAlive(owner) {
            throw HaulError(
                .locked,
                "\(entry.info.name) (download \(id)) is being downloaded by another haul process "
                    + "(\(claim.describe(owner)))"
            )
        }
        let kept = entry.record.definition
        entry.record.definition.headers = request.headers
        entry.record.definition.secretHeaders = request.secretHeaders
        entry.record.definition.cookies = request.cookies
        switch entry.state {
        case .running:
            return (entry, false)
        case .queued where entry.record.owner == claim.name:
            return (entry, false)
        case .completed where !request.overwrite && entry.record.destination.map(finishedFileExists) == true:
            return nil
        default:
            break
        }
        if entry.state == .completed || entry.state == .cancelled { entry.record.bytes = 0 }
        // The same file, so the same destination as it was first asked for (the key stays true).
        entry.record.definition = request
        entry.record.definition.destination = kept.destination
        entry.record.priority = priority.rawValue
        markQueued(&entry)
        return (entry, true)
    }

    /// Stops a download, keeping its partial data; ``resume(_:url:headers:secretHeaders:credentials:cookies:)`` continues it. Returns
    /// once a running download has written its checkpoint, with the download as it stands then.
    @discardableResult
    public func pause(_ id: DownloadID) async throws -> DownloadInfo {
        try await stopKeepingData(id)
        return try download(id: id)
    }

    private func stopKeepingData(_ id: DownloadID) async throws {
        if try await askOwner(id, .pause) { return }
        var entry = try controllable(id)
        switch entry.state {
        case .running:
            await stop(id, .pause)
        case .queued:
            entry.move(to: .paused)
            entry.record.owner = nil
            try save(&entry)
        case .paused:
            return
        case .completed, .failed, .cancelled:
            throw HaulError(
                .invalidState, "download \(id) is \(entry.state); only a queued or running download can be paused")
        }
    }

    /// Queues a paused download again (or one left queued by a manager that is gone, or one that
    /// failed, whose partial data was kept: after a 401, with the credentials it lacked). A new `url`
    /// replaces the old one, for links that expire; the partial data is kept when the server's file
    /// is unchanged (credentials in it are taken out, as ``DownloadRequest/url`` does). `headers`
    /// replace the request headers (`secretHeaders` names those of them to hold as secret, beside
    /// the ones ``DownloadRequest/looksSecret(_:)`` knows), `credentials` join them (the given or the
    /// stored ones) and `cookies` replace the cookie jar: secrets are never stored, so a download
    /// resumed in a new process needs them again.
    public func resume(
        _ id: DownloadID, url: String? = nil, headers: [(name: String, value: String)]? = nil,
        secretHeaders: Set<String> = [], credentials: BasicCredentials? = nil, cookies: CookieJar? = nil
    ) throws {
        var entry = try controllable(id)
        switch entry.state {
        case .paused, .queued, .failed:
            break
        case .running:
            return
        case .completed, .cancelled:
            throw HaulError(
                .invalidState,
                "download \(id) is \(entry.state); only a paused, queued or failed download can be resumed"
                    + (entry.state == .completed ? "" : " (use retry)"))
        }
        var credentials = credentials
        if let url {
            let (plain, written) = DownloadRequest.splittingCredentials(url)
            _ = try DownloadURL(plain)
            entry.record.url = plain
            credentials = credentials ?? written
        }
        if let headers {
            entry.record.definition.headers = headers
            entry.record.definition.secretHeaders = secretHeaders
        }
        if let credentials { entry.record.definition.credentials = credentials }
        if let cookies { entry.record.definition.cookies = cookies }
        markQueued(&entry)
        try write([entry.record])
        enter(entry)
    }

    /// Starts a failed or cancelled download again (a cancelled one from zero), and returns it.
    @discardableResult
    public func retry(_ id: DownloadID) throws -> DownloadInfo {
        var entry = try controllable(id)
        guard entry.state == .failed || entry.state == .cancelled else {
            throw HaulError(
                .invalidState, "download \(id) is \(entry.state); only a failed or cancelled download can be retried")
        }
        markQueued(&entry)
        try write([entry.record])
        enter(entry)
        return entry.info
    }

    /// Moves a waiting download (queued or paused) to `priority` in the queue, and returns it: of
    /// the downloads waiting, higher priorities start first, and equal ones in the order they were
    /// added.
    @discardableResult
    public func setPriority(_ id: DownloadID, _ priority: DownloadPriority) throws -> DownloadInfo {
        var entry = try controllable(id)
        guard entry.state == .queued || entry.state == .paused else {
            throw HaulError(
                .invalidState, "download \(id) is \(entry.state); only a queued or paused download has a place in line")
        }
        guard entry.record.priority != priority.rawValue else { return entry.info }
        entry.record.priority = priority.rawValue
        try save(&entry)
        // Its place in line under the old priority is passed over when it comes up (see schedule()).
        if entry.state == .queued { line(entry) }
        return entry.info
    }

    /// Changes what a download asks for from its next request on (its limit, connections, headers),
    /// as `edit` says, and returns it. A running download changes only its own limit, at once; a
    /// finished one cannot change.
    @discardableResult
    public func changeRequest(_ id: DownloadID, _ edit: @Sendable (inout DownloadRequest) throws -> Void)
        async throws -> DownloadInfo
    {
        var entry = try controllable(id)
        var request = entry.record.definition
        try edit(&request)
        _ = try request.check()
        // A running download's own limit changes as it runs.
        var unlimited = request
        unlimited.bytesPerSecondLimit = entry.record.definition.bytesPerSecondLimit
        switch entry.state {
        case .running:
            guard unlimited == entry.record.definition, let limiter = jobs[id]?.rateLimiter else {
                throw HaulError(
                    .invalidState, "download \(id) is running: only its limit changes while it runs; pause it first")
            }
            limiter.setRate(request.bytesPerSecondLimit)
        case .queued, .paused, .failed: break
        case .completed, .cancelled:
            throw HaulError(.invalidState, "download \(id) is \(entry.state); its request can no longer change")
        }
        entry.record.definition = request
        entry.record.updatedAt = Self.now
        // Its state stays: nothing is told (a failed download is not told to have failed again).
        try write([entry.record])
        entries[id] = entry
        return entry.info
    }

    /// Stops a download for good and deletes its partial data; the record stays, as cancelled.
    public func cancel(_ id: DownloadID) async throws {
        if try await askOwner(id, .cancel) { return }
        var entry = try controllable(id)
        switch entry.state {
        case .running:
            await stop(id, .cancel)
        case .queued, .paused, .failed:
            try deleteFiles(of: entry.record, finished: false)
            entry.move(to: .cancelled)
            entry.record.owner = nil
            try save(&entry)
        case .completed, .cancelled:
            throw HaulError(.invalidState, "download \(id) is \(entry.state); there is nothing to cancel")
        }
    }

    /// Deletes a download's partial data and manifest, its finished file when `deletingFiles` is set,
    /// and its record. A running download is stopped first.
    public func remove(_ id: DownloadID, deletingFiles: Bool = false) async throws {
        if try await askOwner(id, .remove(deletingFiles: deletingFiles)) { return }
        let entry = try controllable(id)
        if entry.state == .running {
            await stop(id, .remove(deletingFiles: deletingFiles))
            return
        }
        try deleteFiles(of: entry.record, finished: deletingFiles)
        try deleteRecord(entry)
    }

    /// Records what the program run at the end of a download (a daemon's completion hook) reported,
    /// e.g. `on-complete exited 0`; `haul ls` and ``DownloadInfo/hook`` show it until the download
    /// is queued again.
    public func recordHookResult(_ id: DownloadID, _ result: String) throws {
        try learn(id)
        guard var entry = entries[id] else { throw HaulError(.unknownDownload, "no download with ID \(id)") }
        entry.record.hook = result
        try save(&entry)
    }

    /// Pauses every queued and running download of this manager; a fleet's worker pauses those
    /// of the other workers too, as the queue is theirs together.
    public func pauseAll() async {
        var after: DownloadID?
        var elsewhere: [(id: DownloadID, owner: String)] = []
        while let page = try? storedPage(in: [.queued, .running], after: after), let last = page.last {
            after = last.id
            for entry in page {
                if entry.record.owner == nil || entry.record.owner == claim.name {
                    _ = try? await pause(entry.id)
                } else if claim.lease != nil, let owner = entry.record.owner {
                    elsewhere.append((entry.id, owner))
                }
            }
        }
        // Asked all at once, each answered at its owner's next tick; those whose owner is gone
        // are paused here.
        let answer = try? await askOwners(elsewhere, .pause)
        for id in answer?.actHere ?? [] { _ = try? await pause(id) }
    }

    /// Resumes every paused download, and every one left queued by a manager that is gone.
    public func resumeAll() {
        var after: DownloadID?
        while let page = try? storedPage(in: [.paused, .queued], after: after), let last = page.last {
            after = last.id
            for entry in page where entry.state == .paused || (entry.state == .queued && entry.record.owner == nil) {
                try? resume(entry.id)
            }
        }
    }

    // MARK: - Helpers

    /// The entry, when this manager may act on it (it is not another live process's).
    func controllable(_ id: DownloadID) throws -> Entry {
        try learn(id)
        guard let entry = entries[id] else { throw HaulError(.unknownDownload, "there is no download \(id)") }
        if let owner = entry.record.owner, owner != claim.name, claim.isAlive(owner) {
            throw HaulError(
                .locked,
                "download \(id) is run by another haul process (\(claim.describe(owner))); "
                    + "pause it there, or stop that process")
        }
        return entry
    }

    /// Reads a download another process added after this manager opened (a `haul get` beside a
    /// daemon), so that it can be controlled here too.
    /// `stored`: the record as just read, when the caller has it.
    func learn(_ id: DownloadID, stored: StoredDownload? = nil) throws {
        // What this manager runs, or has changes for still to write, it knows best; anything else
        // another process may have changed since it was read.
        if let entry = entries[id], entry.record.owner == claim.name || unwritten.holds(id) { return }
        try reload(id, stored: stored)
    }

    /// Marks the entry queued, owned by ``ownerOfQueued``.
    func markQueued(_ entry: inout Entry) {
        entry.move(to: .queued)
        entry.record.owner = ownerOfQueued
    }

    /// Who owns a download this manager queues: this manager, unless it is a fleet's worker (which
    /// leaves it to whichever worker claims it first, see refillWindow()) or one that does not run
    /// what it queues (``Configuration/claimsQueuedDownloads``).
    var ownerOfQueued: String? {
        claim.lease == nil && configuration.claimsQueuedDownloads ? claim.name : nil
    }

    /// Keeps a queued entry whose record is stored, puts it in line and starts what can start.
    func enter(_ entry: Entry) {
        line(entry)
        publish(.stateChanged, entry)
        schedule()
    }

    /// Puts a queued download of this manager, whose record is stored, in line: in ``waiting``
    /// (and memory) when it is among the best ``windowSize``, else in the store only, to be read
    /// once the downloads before it have started. One that takes the place of the worst in line
    /// sends that one back to the store. One nobody owns waits in the store only: for a fleet's
    /// next claim, or for the manager that runs the queue when this one does not claim what it
    /// queues.
    func line(_ entry: Entry) {
        // A manager that does not run what it queues holds none of it.
        if !configuration.claimsQueuedDownloads && entry.record.owner == nil {
            if jobs[entry.id] == nil && !unwritten.holds(entry.id) { entries[entry.id] = nil }
            return
        }
        // A fleet's queued download nobody owns waits in the store, for the next claim.
        if claim.lease != nil && entry.record.owner == nil {
            moreWaiting = true
            if jobs[entry.id] == nil && !unwritten.holds(entry.id) { entries[entry.id] = entry }
            return
        }
        let place = WaitingDownload(priority: entry.record.priority, id: entry.id)
        if waiting.count < Self.windowSize && !moreWaiting {
            entries[entry.id] = entry
            waiting.insert(place)
            return
        }
        moreWaiting = true
        guard let worst = waiting.min, worst < place else {
            if jobs[entry.id] == nil && !unwritten.holds(entry.id) { entries[entry.id] = nil }
            return
        }
        entries[entry.id] = entry
        waiting.insert(place)
        if waiting.count > Self.windowSize, let dropped = waiting.popMin(), jobs[dropped.id] == nil,
            !unwritten.holds(dropped.id), dropped.id != entry.id, entries[dropped.id]?.state == .queued
        {
            entries[dropped.id] = nil
        }
    }

    /// Writes the entry's record (at once, or with the next transaction when `soon`), keeps it and
    /// tells the listeners its state changed.
    func save(_ entry: inout Entry, soon: Bool = false) throws {
        entry.record.updatedAt = Self.now
        if soon { writeSoon(entry.record) } else { try write([entry.record]) }
        entries[entry.id] = entry
        publish(.stateChanged, entry)
    }

    func deleteRecord(_ entry: Entry) throws {
        unwritten.drop(entry.id)
        // Under the worker's fence in a fleet, like every other write.
        try write(QueueChanges(deletes: [entry.id]))
        entries[entry.id] = nil
        publish(.removed, entry)
    }

    /// Whether the finished file `destination` is in place (as the download roots let it be seen).
    func finishedFileExists(_ destination: String) -> Bool {
        guard let paths = try? DownloadPaths.open(destination, confinement: confinement) else { return false }
        return paths.folder.exists(paths.fileName)
    }

    /// Deletes the partial file and manifest (and the finished file when asked), under the
    /// destination's lock so a process writing them is never pulled from under; beneath the download
    /// roots only, so a directory swapped for a link is refused, never followed.
    func deleteFiles(of record: StoredDownload, finished: Bool) throws {
        guard let destination = record.destination else { return }
        let paths: DownloadPaths
        do {
            paths = try DownloadPaths.open(destination, confinement: confinement)
        } catch let error as HaulError where (error.underlying as? SystemError)?.code == ENOENT {
            return  // its directory is gone, and its files with it
        }
        let folder = paths.folder
        guard
            folder.exists(paths.partialName) || folder.exists(paths.manifestName)
                || (finished && folder.exists(paths.fileName))
        else { return }
        let lock = try DestinationLock.acquire(paths)
        defer { lock.unlock() }
        lock.removePartial()
        try ManifestStore.remove(paths)
        if finished { try folder.unlink(paths.fileName) }
    }
}

/// What makes two requests the same download.
struct Identity {
    let key: String
    let directory: String?
    let destination: String?

    init(_ request: DownloadRequest) {
        switch request.destination {
        case .file(let path):
            let destination = POSIX.absolutePath(path)
            self.init(key: Self.key(destination: destination), directory: nil, destination: destination)
        case .directory(let path):
            let directory = POSIX.absolutePath(path)
            self.init(
                key: StoredDownload.directoryKeyPrefix + directory + "\n" + request.url, directory: directory,
                destination: nil)
        }
    }

    /// `request` with its destination's path absolute, as the manager keeps it.
    func normalized(_ request: DownloadRequest) -> DownloadRequest {
        var request = request
        request.destination = destination.map { .file($0) } ?? .directory(directory ?? ".")
        return request
    }

    private init(key: String, directory: String?, destination: String?) {
        self.key = key
        self.directory = directory
        self.destination = destination
    }

    static func key(destination: String) -> String { "file:" + destination }
}
