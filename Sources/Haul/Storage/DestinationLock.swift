#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// An advisory lock that keeps a second process (or a second download in this one) from writing
/// the same partial file. The lock file holds the owner's process ID so the refusal can name it.
/// The operating system releases the lock when the process dies, however it dies.
final class DestinationLock: Sendable {
    let path: String
    private let descriptor: Int32

    private init(path: String, descriptor: Int32) {
        self.path = path
        self.descriptor = descriptor
    }

    deinit { POSIX.close(descriptor) }

    static func acquire(_ paths: DownloadPaths) throws -> DestinationLock {
        let path = paths.lock
        for _ in 0..<8 {
            let descriptor = try POSIX.open(path, flags: O_RDWR | O_CREAT | O_NOFOLLOW)
            if flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
                let code = errno
                let owner = (try? POSIX.read(descriptor, count: 32, at: 0, path: path))
                    .flatMap { String(validating: $0, as: UTF8.self) }?
                    .trimmingHTTPWhitespace()
                POSIX.close(descriptor)
                guard code == EWOULDBLOCK || code == EAGAIN else { throw POSIX.error("lock", path: path, errno: code) }
                let who =
                    owner.map { $0.isEmpty ? "another process" : "another process (pid \($0))" } ?? "another process"
                throw HaulError(.locked, "\(paths.destination) is being downloaded by \(who)")
            }
            // The previous owner may have removed the file between our open and our lock: only a lock
            // on the file that is still at `path` counts.
            var held = stat()
            guard fstat(descriptor, &held) == 0, let current = POSIX.fileStatus(path),
                current.st_ino == held.st_ino, current.st_dev == held.st_dev
            else {
                POSIX.close(descriptor)
                continue
            }
            let pid = Array("\(POSIX.processID)\n".utf8)
            _ = ftruncate(descriptor, 0)
            try pid.withUnsafeBytes { try POSIX.write(descriptor, $0, at: 0, path: path) }
            return DestinationLock(path: path, descriptor: descriptor)
        }
        throw HaulError(.locked, "\(paths.destination) keeps changing owner; another process is downloading it")
    }

    /// Removes the lock file while still holding the lock, so nobody can take over a stale file.
    func removeFile() { try? POSIX.unlink(path) }
}

/// Identifies the current boot of the kernel, so `written` (page-cache) offsets recorded before a
/// reboot are never trusted after it.
enum BootIdentity {
    static let current: String? = {
        #if os(Linux)
            guard let bytes = try? POSIX.readWholeFile("/proc/sys/kernel/random/boot_id", limit: 64),
                let text = String(validating: bytes, as: UTF8.self)
            else { return nil }
            let trimmed = text.filter { !$0.isWhitespace }
            return trimmed.isEmpty ? nil : trimmed
        #else
            return nil
        #endif
    }()
}
