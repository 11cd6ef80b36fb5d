import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Tells whether the manager that claimed a download is still alive, in this process or another.
///
/// Each open manager holds an exclusive `flock` on `owners/NAME.lock` in the state directory, where
/// NAME (`pid.n`) is what it writes into the `owner` column of the downloads it runs. The operating
/// system drops the lock when the process dies, however it dies, so a claim whose file can be locked
/// by someone else is stale; process IDs being reused later does not matter.
final class ProcessClaim: QueueOwnership {
    let name: String
    private let directory: String
    private let path: String
    private let descriptor: Int32
    private static let counter = Mutex(0)

    init(stateDirectory: String) throws {
        directory = stateDirectory + "/owners"
        // Always closed to others: the folder is Haul's alone ("." is in every folder).
        try POSIX.makePrivateDirectory(directory, marker: ".")
        let serial = Self.counter.withLock { value -> Int in
            value += 1
            return value
        }
        name = "\(POSIX.processID).\(serial)"
        path = directory + "/" + name + ".lock"
        descriptor = try POSIX.openLocked(path)
    }

    deinit {
        release()
        POSIX.close(descriptor)
    }

    /// Gives the claim up: from now on it reads as a manager that is gone.
    func release() {
        try? POSIX.unlink(path)
        _ = flock(descriptor, LOCK_UN)
    }

    /// The process ID in a claim's name, for messages.
    static func processID(of owner: String) -> String { String(owner.prefix { $0 != "." }) }

    /// `pid N`, the process of a claim's name.
    func describe(_ owner: String) -> String { "pid \(Self.processID(of: owner))" }

    /// Processes of one machine hold no lease.
    var lease: (any QueueLease)? { nil }

    /// Whether the manager named `owner` still runs. A stale claim's file is removed on the way.
    func isAlive(_ owner: String) -> Bool {
        if owner == name { return true }
        guard !owner.contains("/"), !owner.hasPrefix(".") else { return false }
        let other = directory + "/" + owner + ".lock"
        guard let descriptor = try? POSIX.open(other, flags: O_RDWR | O_NOFOLLOW) else { return false }
        defer { POSIX.close(descriptor) }
        if flock(descriptor, LOCK_EX | LOCK_NB) == 0 {
            try? POSIX.unlink(other)
            return false
        }
        return errno == EWOULDBLOCK || errno == EAGAIN
    }
}
