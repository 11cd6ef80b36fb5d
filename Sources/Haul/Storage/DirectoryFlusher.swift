import Synchronization

/// Makes renames durable with as few directory flushes as possible: downloads that finish in the same
/// directory while a flush of it is running share the next one (a group commit).
///
/// A download renames its file, then takes a ticket. With no flush of the directory running, it flushes
/// at once on the thread it is on, covering every ticket taken so far, so a lone download costs what a
/// plain `fsync` costs. Otherwise it waits; when the running flush ends, the waiters it did not cover
/// get one more flush, run by one of them, that covers them all. A failed flush covers nobody: the next
/// waiter tries again and reports its own error.
final class DirectoryFlusher: Sendable {
    private struct Directory {
        /// Tickets handed out; a ticket is taken after its rename.
        var issued: UInt64 = 0
        /// Every ticket up to this one is covered by a finished flush.
        var covered: UInt64 = 0
        var flushing = false
        var waiting: [(ticket: UInt64, turn: CheckedContinuation<Bool, Never>)] = []
    }

    /// By the directory's device and inode: handles of one directory share flushes, and a path that
    /// came to lead to another directory does not.
    private let directories = Mutex<[[UInt64]: Directory]>([:])
    private let flush: @Sendable (DirectoryHandle) throws -> Void

    /// - Parameter flush: makes the renames in a directory durable.
    init(flush: @escaping @Sendable (DirectoryHandle) throws -> Void = { try $0.sync() }) {
        self.flush = flush
    }

    /// Call on an I/O thread after a rename in `folder`. Flushes the directory and returns nil, or,
    /// when a flush of it is already running, returns the ticket to pass to ``waitForFlush(of:ticket:io:)``.
    func flushOrQueue(_ folder: DirectoryHandle) throws -> UInt64? {
        let directory = try folder.identity()
        let ticket = directories.withLock { directories -> UInt64? in
            directories[directory, default: Directory()].issued += 1
            if directories[directory]!.flushing { return directories[directory]!.issued }
            directories[directory]!.flushing = true
            return nil
        }
        if ticket == nil { try flushRound(folder, directory) }
        return ticket
    }

    /// Waits until a flush covers `ticket`, running that flush itself when no one else is.
    func waitForFlush(of folder: DirectoryHandle, ticket: UInt64, io: BlockingIO) async throws {
        let directory = try folder.identity()
        let leads = await withCheckedContinuation { (turn: CheckedContinuation<Bool, Never>) in
            let now = directories.withLock { directories -> Bool? in
                // A directory is forgotten once every ticket issued for it is covered.
                guard let state = directories[directory], state.covered < ticket else { return false }
                if !state.flushing {
                    directories[directory]!.flushing = true
                    return true
                }
                directories[directory]!.waiting.append((ticket, turn))
                return nil
            }
            if let now { turn.resume(returning: now) }
        }
        if leads { try await io.run { try self.flushRound(folder, directory) } }
    }

    /// Flushes the directory for every ticket issued so far, then wakes the waiters it covered and hands
    /// the next round to one of the others.
    private func flushRound(_ folder: DirectoryHandle, _ directory: [UInt64]) throws {
        let covers = directories.withLock { $0[directory]!.issued }
        var failure: (any Error)?
        do { try flush(folder) } catch { failure = error }
        let (covered, next) = directories.withLock { directories in
            var state = directories[directory]!
            if failure == nil { state.covered = max(state.covered, covers) }
            let covered = state.waiting.filter { $0.ticket <= state.covered }.map(\.turn)
            state.waiting.removeAll { $0.ticket <= state.covered }
            var next: CheckedContinuation<Bool, Never>?
            if state.waiting.isEmpty {
                state.flushing = false
            } else {
                next = state.waiting.removeFirst().turn
            }
            if !state.flushing && state.covered == state.issued {
                directories[directory] = nil
            } else {
                directories[directory] = state
            }
            return (covered, next)
        }
        for turn in covered { turn.resume(returning: false) }
        next?.resume(returning: true)
        if let failure { throw failure }
    }
}
