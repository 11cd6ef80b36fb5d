import NIOPosix
import Synchronization

/// Makes finished downloads durable and gives them their final names, many at once (a group commit).
///
/// A download hands over its partial file once every byte is written and checked, and joins the next
/// batch. A batch makes the data of its files durable, runs the ``Handover/beforeRename`` of each,
/// renames each to its final name and then flushes each of their directories once. A final name
/// therefore never becomes durable before its data, and many small files finishing together share
/// their data flush, their directory flushes, their trips to the I/O threads and the transaction
/// that records them before their renames.
///
/// Each file's data is flushed on its own as it is handed over, beside the flushes of other
/// downloads (see ``flushThreads``), unless one flush of its file system may stand for it (Linux's
/// `syncfs`, see ``FileSystemFlush``): then the file joins the batch unflushed, and the batch flushes
/// each file system its files lie on once. A small file's own flush costs a flush of the device's
/// cache, which the batch then pays once. That flush also waits for every other writer's data on the
/// file system: with more than ``fileSystemFlushAllowance`` bytes waiting to be written on the
/// machine, the batch's files are flushed each on its own instead. Measured on 2 cores under other
/// writers' load (800 files of 16 KiB in batches of 16, each batch then renamed and its directory
/// flushed, 2026-11-25): 0.23–0.25 s flushing a batch's files at once on 16 threads, against
/// 0.46–0.75 s with one `syncfs` per batch. Without that load (2026-11-27), `bench/ceiling`'s bare
/// HTTP/1.1 client fetched 2,000 files of 16 KiB in 0.18 s with a `syncfs` per batch, 0.22 s with
/// each file flushed; `haul get -i -j 16` made about 110 `syncfs` calls in place of 2,000 `fdatasync`.
///
/// Nobody waits on a thread of their own for a batch: the download that finds no batch running runs
/// one on its I/O thread; when it ends, the first download that handed over a file meanwhile runs the
/// next, which covers every file waiting by then. A failure fails only the files it concerns: a data
/// flush or a rename its file (which keeps its partial name), a directory flush the files renamed in
/// that directory. A failed flush of a file system is retried file by file.
final class FileFinisher: Sendable {
    /// A file to finish: its partial name and final name in `folder`.
    struct Handover: Sendable {
        let file: PartialFile
        let folder: DirectoryHandle
        let partialName: String
        let fileName: String
        /// Checks, right before the rename, that `folder` still lies beneath the download roots.
        let confinement: DownloadConfinement
        /// Runs once the data is durable, right before the batch's renames (a queue records the
        /// download's file there: the first record written carries those of the whole batch).
        var beforeRename: @Sendable () async -> Void = {}
        /// Asked right before the rename, after every hook of the batch: `false` fails the file, which
        /// keeps its partial name (a fleet's worker whose lease may have run out).
        var permit: (@Sendable () -> Bool)? = nil
        /// Whether every byte of the file was written after `folder` was opened (the file was created
        /// by this session): only then may a flush of the file system through the batch's first
        /// opened directory stand for the file's own flush (see ``FileFinisher``).
        /// Bytes an earlier session wrote, and never flushed, may have failed to reach the disk with
        /// an error that another flush of the file system has reported already; the file's own flush
        /// reports it again.
        var writtenSinceOpened = false
    }

    /// One flush of a whole file system in place of the flushes of the files on it.
    struct FileSystemFlush: Sendable {
        /// Whether a flush of the file system holding a directory may stand for the flushes of its
        /// files: asked as each file is handed over.
        var suits: @Sendable (DirectoryHandle) -> Bool
        /// Flushes the file system holding a directory and returns true, or returns false when it
        /// should not now (too much of the machine's data waits to be written).
        var flush: @Sendable (DirectoryHandle) throws -> Bool

        /// The platform's: `syncfs` where ``Platform/fileSystemFlushSuits(_:device:)`` says it suits, and
        /// while at most ``FileFinisher/fileSystemFlushAllowance`` bytes wait to be written.
        static let platform = FileSystemFlush(
            suits: { folder in
                guard let device = try? folder.identity().first else { return false }
                return Platform.fileSystemFlushSuits(folder.descriptor, device: device)
            },
            flush: { folder in
                guard let pending = Platform.pendingWriteBytes(), pending <= fileSystemFlushAllowance else {
                    return false
                }
                try folder.syncFileSystem()
                return true
            })
    }

    /// What a download that handed over a file is told: to run the next batch, or how its file ended.
    private enum Turn: Sendable {
        case lead
        case done(Result<Void, HaulError>)
    }

    private struct Waiter {
        let number: UInt64
        let handover: Handover
        /// Whether the file joined unflushed, for a flush of its file system.
        let together: Bool
        let turn: CheckedContinuation<Turn, Never>
    }

    private struct State {
        var running = false
        var handed: UInt64 = 0
        var waiting: [Waiter] = []
    }

    private let state = Mutex(State())
    /// Flushes the data of one file.
    private let flushData: @Sendable (PartialFile) throws -> Void
    /// The flush of a file system that may stand for its files' own; nil: each file is flushed on
    /// its own, as it is handed over.
    private let fileSystemFlush: FileSystemFlush?
    /// Flushes a directory, making the renames in it durable.
    private let flushDirectory: @Sendable (DirectoryHandle) throws -> Void
    /// Set once a flush of a file system failed; from then on each file is flushed on its own, for as
    /// long as the finisher lasts.
    ///
    /// A write error is reported once to each open directory a file system's flush is made through:
    /// to the first flush after the error. The file whose write failed may be one still being
    /// written, to join a later batch; if that batch's flush went through the same directory, it
    /// would report nothing. A file's own flush reports every error of its writes since it was
    /// opened, and tells which file failed. Such failures are rare; the flushes of the files after
    /// one cost what they cost before file systems were flushed whole.
    private let fileSystemFlushFailed = Atomic<Bool>(false)

    /// - Parameters:
    ///   - flushData: makes a file's data durable (`fdatasync`, or `F_FULLFSYNC` on Apple platforms,
    ///     unless a test holds or counts it).
    ///   - fileSystemFlush: the flush of a whole file system that may stand for its files' own
    ///     (``FileSystemFlush/platform``, unless a test counts it); nil: each file's data is flushed
    ///     on its own.
    ///   - flushDirectory: makes the renames in a directory durable.
    init(
        flushData: @escaping @Sendable (PartialFile) throws -> Void = { try $0.syncDataNow() },
        fileSystemFlush: FileSystemFlush? = .platform,
        flushDirectory: @escaping @Sendable (DirectoryHandle) throws -> Void = { try $0.sync() }
    ) {
        self.flushData = flushData
        self.fileSystemFlush = fileSystemFlush
        self.flushDirectory = flushDirectory
    }

    /// The bytes waiting to be written on the machine, a batch's own included, up to which the
    /// batch's data is flushed with one flush of each file system: what such a flush may write
    /// beyond the batch's files costs about what the device's flushes of a batch of small files do.
    static let fileSystemFlushAllowance: Int64 = 32 << 20

    /// How many downloads wait for a batch (for tests).
    var waitingCount: Int { state.withLock { $0.waiting.count } }

    /// The threads data flushes run on: many, since a flush mostly waits for the device, and flushes
    /// of many files issued together are merged by the kernel into few device flushes.
    ///
    /// Measured on 2 cores under other writers' load (800 files of 16 KiB in batches of 16, each batch
    /// then renamed and its directory flushed, 2026-11-25): 0.23–0.25 s flushing a batch's files at
    /// once on 16 threads, against 2.0–3.0 s one after another (even with every file's writeback
    /// started first).
    static let flushThreads: BlockingIO = {
        let pool = NIOThreadPool(numberOfThreads: 16)
        pool.start()
        return BlockingIO(threadPool: pool)
    }()

    /// Makes `handover`'s data durable and gives it its final name, with the files handed over beside
    /// it. Returns once the rename is durable; throws when the file could not be finished (it then
    /// keeps its partial name, unless only the directory flush failed).
    func finish(_ handover: Handover, io: BlockingIO) async throws {
        let together =
            handover.writtenSinceOpened && !fileSystemFlushFailed.load(ordering: .relaxed)
            && fileSystemFlush?.suits(handover.folder) == true
        if !together { try await flushOnItsOwn(handover.file) }
        var number: UInt64 = 0
        let turn = await withCheckedContinuation { (turn: CheckedContinuation<Turn, Never>) in
            let leads = state.withLock { state -> Bool in
                state.handed += 1
                number = state.handed
                guard state.running else {
                    state.running = true
                    return true
                }
                state.waiting.append(
                    Waiter(number: state.handed, handover: handover, together: together, turn: turn))
                return false
            }
            if leads { turn.resume(returning: .lead) }
        }
        let outcome: Result<Void, HaulError>
        switch turn {
        case .done(let result):
            outcome = result
        case .lead:
            outcome = await lead(number, handover, together: together, io: io)
        }
        try outcome.get()
    }

    /// Runs one batch: this download's file (handed over as `number`) and every file waiting, then
    /// hands the next batch to the first download waiting. Returns this download's outcome.
    private func lead(_ number: UInt64, _ own: Handover, together: Bool, io: BlockingIO) async -> Result<
        Void, HaulError
    > {
        let others = state.withLock { state in
            defer { state.waiting = [] }
            return state.waiting.filter { $0.number != number }
        }
        let batch = [own] + others.map(\.handover)
        var outcomes = await flushData(of: batch, together: [together] + others.map(\.together))
        for (handover, outcome) in zip(batch, outcomes) where outcome.succeeded { await handover.beforeRename() }
        do {
            outcomes = try await io.run { [outcomes] in self.run(batch, flushed: outcomes) }
        } catch {
            outcomes = Array(repeating: .failure(HaulError.wrapping(error)), count: batch.count)
        }
        let next = state.withLock { state -> CheckedContinuation<Turn, Never>? in
            guard let first = state.waiting.first else {
                state.running = false
                return nil
            }
            return first.turn
        }
        for (waiter, outcome) in zip(others, outcomes.dropFirst()) { waiter.turn.resume(returning: .done(outcome)) }
        next?.resume(returning: .lead)
        return outcomes[0]
    }

    /// Makes the data of the files of `batch` that joined it unflushed (`together`) durable: with
    /// one flush of each file system they lie on, else (where that should not be now, or once such a
    /// flush failed) each file on its own, all at once. Returns each file's outcome.
    ///
    /// A file system's flush goes through the batch's directory there that was opened first. Each
    /// of those files was created, and all its bytes written, after its own directory was opened, so
    /// after that one was: the flush reports their write errors (the directories a downloader opens
    /// are never another's).
    private func flushData(of batch: [Handover], together: [Bool]) async -> [Result<Void, HaulError>] {
        var outcomes = [Result<Void, HaulError>](repeating: .success(()), count: batch.count)
        guard let fileSystemFlush else { return outcomes }
        var unflushed: [Int] = []
        var volumes: [UInt64: (folder: DirectoryHandle, files: [Int])] = [:]
        for (index, handover) in batch.enumerated() where together[index] {
            guard let device = try? handover.folder.identity().first else {
                unflushed.append(index)
                continue
            }
            var volume = volumes[device] ?? (handover.folder, [])
            if handover.folder.opening < volume.folder.opening { volume.folder = handover.folder }
            volume.files.append(index)
            volumes[device] = volume
        }
        for (folder, files) in volumes.values {
            if !fileSystemFlushFailed.load(ordering: .relaxed) {
                do {
                    if try await Self.flushThreads.run({ try fileSystemFlush.flush(folder) }) { continue }
                } catch {
                    fileSystemFlushFailed.store(true, ordering: .relaxed)
                }
            }
            unflushed += files
        }
        await withTaskGroup(of: (Int, Result<Void, HaulError>).self) { group in
            for index in unflushed {
                group.addTask {
                    do {
                        try await self.flushOnItsOwn(batch[index].file)
                        return (index, .success(()))
                    } catch {
                        return (index, .failure(HaulError.wrapping(error)))
                    }
                }
            }
            for await (index, outcome) in group { outcomes[index] = outcome }
        }
        return outcomes
    }

    /// Flushes `file`'s data on its own, on one of ``flushThreads``.
    private func flushOnItsOwn(_ file: PartialFile) async throws {
        try await Self.flushThreads.run { [flushData] in try flushData(file) }
    }

    /// Finishes `batch`, whose hooks ran, and whose data is durable where `flushed` holds a success:
    /// renames, then directories. A file whose flush failed, or which its permit refuses, keeps its
    /// partial name.
    private func run(_ batch: [Handover], flushed: [Result<Void, HaulError>]) -> [Result<Void, HaulError>] {
        var outcomes = flushed
        // The directories renamed into, by identity (handles of one directory share a flush).
        var renamed: [[UInt64]: (folder: DirectoryHandle, files: [Int])] = [:]
        for (index, handover) in batch.enumerated() where outcomes[index].succeeded {
            if let permit = handover.permit, !permit() {
                outcomes[index] = .failure(DownloaderConfiguration.writeRefused)
                continue
            }
            do {
                let folder = handover.folder
                guard folder.exists(handover.partialName) else { continue }
                // The directory was opened beneath its root; it must still lie there.
                try handover.confinement.check(folder)
                try folder.rename(handover.partialName, to: handover.fileName)
                renamed[try folder.identity(), default: (folder, [])].files.append(index)
            } catch {
                outcomes[index] = .failure(HaulError.wrapping(error))
            }
        }
        for (folder, files) in renamed.values {
            do {
                try flushDirectory(folder)
            } catch {
                for index in files { outcomes[index] = .failure(HaulError.wrapping(error)) }
            }
        }
        return outcomes
    }
}

extension Result {
    /// Whether this is a success.
    fileprivate var succeeded: Bool {
        if case .success = self { return true }
        return false
    }
}
