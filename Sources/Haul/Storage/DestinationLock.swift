import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// An advisory lock on the partial file itself, which keeps a second process (or a second download
/// in this one) from writing it. Locking the file that holds the data, not a file beside it, spares
/// a file creation and a deletion per download. The operating system releases the lock when the
/// process dies, however it dies.
///
/// Acquiring the lock creates the partial file when there is none; ``created`` tells the caller, which
/// removes it again (``removePartial()``) when it turns out not to be needed.
final class DestinationLock: Sendable {
    /// Why a lock was refused: another process holds it (the underlying error of the refusal).
    struct HeldElsewhere: Error {}

    /// Whether `error` is a refusal of the lock because another process holds it.
    static func isHeldElsewhere(_ error: HaulError) -> Bool { error.underlying is HeldElsewhere }

    let paths: DownloadPaths
    /// Whether acquiring the lock created the partial file.
    let created: Bool
    private let descriptor: Int32
    private let unlocked = Atomic<Bool>(false)

    private init(paths: DownloadPaths, descriptor: Int32, created: Bool) {
        self.paths = paths
        self.descriptor = descriptor
        self.created = created
    }

    deinit {
        unlock()
        POSIX.close(descriptor)
    }

    static func acquire(_ paths: DownloadPaths) throws -> DestinationLock {
        let path = paths.partial
        for _ in 0..<8 {
            let (descriptor, created) = try paths.folder.openOrCreate(paths.partialName, flags: O_RDWR)
            if flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
                let code = errno
                let owner = Platform.lockHolder(descriptor)
                POSIX.close(descriptor)
                guard code == EWOULDBLOCK || code == EAGAIN else { throw POSIX.error("lock", path: path, errno: code) }
                let who: String
                switch owner {
                case .nobody, .unknown: who = "another process"
                case .process(POSIX.processID): who = "another download in this process (pid \(POSIX.processID))"
                case .process(let pid): who = "another process (pid \(pid))"
                }
                let elsewhere = owner != .process(POSIX.processID)
                throw HaulError(
                    .locked, "\(paths.destination) is being downloaded by \(who)",
                    underlying: elsewhere ? HeldElsewhere() : nil)
            }
            // The previous owner may have renamed or removed the file between our open and our lock:
            // only a lock on the file that is still at `path` counts.
            guard let held = try? POSIX.identity(descriptor), let current = paths.folder.status(paths.partialName),
                held == [UInt64(current.st_dev), UInt64(current.st_ino)]
            else {
                POSIX.close(descriptor)
                continue
            }
            // A partial file with another name elsewhere (a hard link, perhaps outside the download
            // root) would be written through: refused, as a symbolic link is.
            guard current.st_nlink <= 1 else {
                POSIX.close(descriptor)
                throw HaulError(
                    .fileSystem,
                    "\(path) has \(current.st_nlink) names (hard links): Haul writes no file that is also elsewhere; "
                        + "remove it to start again")
            }
            // Created here, yet written by another process between the creation and the lock: not new.
            return DestinationLock(paths: paths, descriptor: descriptor, created: created && current.st_size == 0)
        }
        throw HaulError(.locked, "\(paths.destination) keeps changing owner; another process is downloading it")
    }

    /// The locked partial file, for reading and writing. It shares the lock's open file: the lock
    /// holds until ``unlock()``, or until both are closed.
    func partialFile(io: BlockingIO) throws -> PartialFile {
        let copy = fcntl(descriptor, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { throw POSIX.error("open", path: paths.partial) }
        return PartialFile(in: paths.folder, name: paths.partialName, descriptor: copy, io: io)
    }

    /// Removes the partial file while still holding the lock, so nobody can take over a file that is
    /// on its way out.
    func removePartial() { try? paths.folder.unlink(paths.partialName) }

    /// Lets go of the lock now. Closing the descriptor would not be enough: the partial file shares
    /// the lock's open file, and a thread that has just written it may still hold a reference for a
    /// moment.
    func unlock() {
        guard !unlocked.exchange(true, ordering: .relaxed) else { return }
        _ = flock(descriptor, LOCK_UN)
    }
}

/// Identifies the current boot of the kernel, so `written` (page-cache) offsets recorded before a
/// reboot are never trusted after it.
enum BootIdentity {
    static let current: String? = Platform.bootIdentity()
}
