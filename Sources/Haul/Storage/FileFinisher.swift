import NIOPosix
import Synchronization

/// Makes finished downloads durable and gives them their final names, many at once (a group commit).
///
/// A download hands over its partial file once every byte is written and checked. Its data is flushed
/// at once, beside the flushes of other downloads (see ``flushThreads``); then it joins the next
/// batch, which runs the ``Handover/beforeRename`` of each of its files, renames each to its final
/// name and then flushes each of their directories once. A final name therefore never becomes
/// durable before its data, and many small files finishing together share their directory flushes,
/// their trips to the I/O threads and the transaction that records them before their renames.
///
/// Nobody waits on a thread of their own for a batch: the download that finds no batch running runs
/// one on its I/O thread; when it ends, the first download that handed over a file meanwhile runs the
/// next, which covers every file waiting by then. A failure fails only the files it concerns: a data
/// flush or a rename its file (which keeps its partial name), a directory flush the files renamed in
/// that directory.
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
    }

    /// What a download that handed over a file is told: to run the next batch, or how its file ended.
    private enum Turn: Sendable {
        case lead
        case done(Result<Void, HaulError>)
    }

    private struct Waiter {
        let number: UInt64
        let handover: Handover
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
    /// Flushes a directory, making the renames in it durable.
    private let flushDirectory: @Sendable (DirectoryHandle) throws -> Void

    /// - Parameters:
    ///   - flushData: makes a file's data durable (`fdatasync`, or `F_FULLFSYNC` on Apple platforms,
    ///     unless a test holds or counts it).
    ///   - flushDirectory: makes the renames in a directory durable.
    init(
        flushData: @escaping @Sendable (PartialFile) throws -> Void = { try $0.syncDataNow() },
        flushDirectory: @escaping @Sendable (DirectoryHandle) throws -> Void = { try $0.sync() }
    ) {
        self.flushData = flushData
        self.flushDirectory = flushDirectory
    }

    /// How many downloads wait for a batch (for tests).
    var waitingCount: Int { state.withLock { $0.waiting.count } }

    /// The threads data flushes run on: many, since a flush mostly waits for the device, and flushes
    /// of many files issued together are merged by the kernel into few device flushes.
    ///
    /// Measured on 2 cores under other writers' load (800 files of 16 KiB in batches of 16, each batch
    /// then renamed and its directory flushed, 2026-11-25): 0.23–0.25 s flushing a batch's files at
    /// once on 16 threads, against 2.0–3.0 s one after another (even with every file's writeback
    /// started first) and 0.46–0.75 s with one `syncfs` per batch, which also waits for every other
    /// writer's data on the file system.
    static let flushThreads: BlockingIO = {
        let pool = NIOThreadPool(numberOfThreads: 16)
        pool.start()
        return BlockingIO(threadPool: pool)
    }()

    /// Makes `handover`'s data durable and gives it its final name, with the files handed over beside
    /// it. Returns once the rename is durable; throws when the file could not be finished (it then
    /// keeps its partial name, unless only the directory flush failed).
    func finish(_ handover: Handover, io: BlockingIO) async throws {
        try await Self.flushThreads.run { [flushData] in try flushData(handover.file) }
        var number: UInt64 = 0
        let turn = await withCheckedContinuation { (turn: CheckedContinuation<Turn, Never>) in
            let leads = state.withLock { state -> Bool in
                state.handed += 1
                number = state.handed
                guard state.running else {
                    state.running = true
                    return true
                }
                state.waiting.append(Waiter(number: state.handed, handover: handover, turn: turn))
                return false
            }
            if leads { turn.resume(returning: .lead) }
        }
        let outcome: Result<Void, HaulError>
        switch turn {
        case .done(let result):
            outcome = result
        case .lead:
            outcome = await lead(number, handover, io: io)
        }
        try outcome.get()
    }

    /// Runs one batch: this download's file (handed over as `number`) and every file waiting, then
    /// hands the next batch to the first download waiting. Returns this download's outcome.
    private func lead(_ number: UInt64, _ own: Handover, io: BlockingIO) async -> Result<Void, HaulError> {
        let others = state.withLock { state in
            defer { state.waiting = [] }
            return state.waiting.filter { $0.number != number }
        }
        let batch = [own] + others.map(\.handover)
        for handover in batch { await handover.beforeRename() }
        let outcomes: [Result<Void, HaulError>]
        do {
            outcomes = try await io.run { self.run(batch) }
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

    /// Finishes `batch`, whose data is durable and whose hooks ran: renames, then directories. A file
    /// its permit refuses keeps its partial name.
    private func run(_ batch: [Handover]) -> [Result<Void, HaulError>] {
        var outcomes = [Result<Void, HaulError>](repeating: .success(()), count: batch.count)
        // The directories renamed into, by identity (handles of one directory share a flush).
        var renamed: [[UInt64]: (folder: DirectoryHandle, files: [Int])] = [:]
        for (index, handover) in batch.enumerated() {
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
