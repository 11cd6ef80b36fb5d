#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Thin, throwing wrappers over the POSIX calls the storage layer (and the daemon's own files) need.
///
/// Every failure becomes a ``HaulError`` naming the path and the system's reason, with `ENOSPC`
/// and `EDQUOT` mapped to ``HaulError/Code/diskFull``.
package enum POSIX {
    package static func error(_ operation: String, path: String, errno code: Int32 = errno) -> HaulError {
        let reason = String(cString: strerror(code))
        if code == ENOSPC || code == EDQUOT {
            return HaulError(
                .diskFull, "disk full while \(operation) \(path): \(reason)", underlying: SystemError(code: code))
        }
        return HaulError(.fileSystem, "cannot \(operation) \(path): \(reason)", underlying: SystemError(code: code))
    }

    package static func open(_ path: String, flags: Int32, mode: mode_t = 0o644) throws -> Int32 {
        while true {
            let descriptor = path.withCString { systemOpen($0, flags | O_CLOEXEC, mode) }
            if descriptor >= 0 { return descriptor }
            if errno == EINTR { continue }
            throw error("open", path: path)
        }
    }

    /// The device and inode of an open file.
    package static func identity(_ descriptor: Int32) throws -> [UInt64] {
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { throw error("inspect", path: "descriptor \(descriptor)") }
        return [UInt64(status.st_dev), UInt64(status.st_ino)]
    }

    /// Writes all of `bytes` at `offset`, looping over short writes.
    package static func write(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer, at offset: Int64, path: String)
        throws
    {
        var done = 0
        while done < bytes.count {
            let result = pwrite(descriptor, bytes.baseAddress! + done, bytes.count - done, off_t(offset) + off_t(done))
            if result < 0 {
                if errno == EINTR { continue }
                throw error("write to", path: path)
            }
            done += result
        }
    }

    /// Reads up to `count` bytes at `offset` into `buffer`; fewer only at the end of the file.
    package static func readInto(
        _ descriptor: Int32, _ buffer: UnsafeMutableRawBufferPointer, count: Int, at offset: Int64, path: String
    ) throws -> Int {
        var done = 0
        while done < count {
            let result = pread(descriptor, buffer.baseAddress! + done, count - done, off_t(offset) + off_t(done))
            if result < 0 {
                if errno == EINTR { continue }
                throw error("read", path: path)
            }
            if result == 0 { break }
            done += result
        }
        return done
    }

    /// Reads up to `count` bytes at `offset`; fewer only at the end of the file.
    package static func read(_ descriptor: Int32, count: Int, at offset: Int64, path: String) throws -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let result = buffer.withUnsafeMutableBytes {
                pread(descriptor, $0.baseAddress! + done, count - done, off_t(offset) + off_t(done))
            }
            if result < 0 {
                if errno == EINTR { continue }
                throw error("read", path: path)
            }
            if result == 0 { break }
            done += result
        }
        buffer.removeLast(count - done)
        return buffer
    }

    /// Flushes the file's data (and the metadata needed to read it back) to stable storage.
    package static func syncData(_ descriptor: Int32, path: String) throws {
        if Platform.syncData(descriptor) != 0 { throw error("sync", path: path) }
    }

    package static func syncAll(_ descriptor: Int32, path: String) throws {
        if Platform.syncAll(descriptor) != 0 { throw error("sync", path: path) }
    }

    package static func truncate(_ descriptor: Int32, to length: Int64, path: String) throws {
        if ftruncate(descriptor, off_t(length)) != 0 { throw error("truncate", path: path) }
    }

    package static func size(_ descriptor: Int32, path: String) throws -> Int64 {
        var info = stat()
        if fstat(descriptor, &info) != 0 { throw error("stat", path: path) }
        return Int64(info.st_size)
    }

    package static func close(_ descriptor: Int32) {
        _ = systemClose(descriptor)
    }

    /// Opens (creating, mode 0600) the file at `path` and takes its exclusive lock without
    /// waiting; a file already locked throws with `EWOULDBLOCK` as the underlying error. A lock
    /// object takes the descriptor only from here: one that set it and then threw would close it
    /// twice (`deinit` runs), the second time under another thread's file or socket.
    package static func openLocked(_ path: String) throws -> Int32 {
        let descriptor = try open(path, flags: O_RDWR | O_CREAT | O_NOFOLLOW, mode: 0o600)
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            close(descriptor)
            throw error("lock", path: path, errno: code == EAGAIN ? EWOULDBLOCK : code)
        }
        return descriptor
    }

    package static func rename(_ source: String, to destination: String) throws {
        let result = source.withCString { from in destination.withCString { to in systemRename(from, to) } }
        if result != 0 { throw error("rename \(source) to", path: destination) }
    }

    /// Replaces the file at `path` with `bytes`, readable by its owner only (mode 0600): written to a
    /// temporary name beside it, then renamed, so a reader sees the old file or the new one.
    package static func replacePrivateFile(_ path: String, with bytes: [UInt8]) throws {
        let temporary = path + ".tmp"
        let descriptor = try open(temporary, flags: O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, mode: 0o600)
        defer { close(descriptor) }
        try bytes.withUnsafeBytes { try write(descriptor, $0, at: 0, path: temporary) }
        try rename(temporary, to: path)
    }

    /// Removes a file; a file that is already gone is not an error.
    package static func unlink(_ path: String) throws {
        if path.withCString({ systemUnlink($0) }) != 0 && errno != ENOENT { throw error("remove", path: path) }
    }

    /// What `lstat` says about a path: `nil` when nothing is there.
    package static func fileStatus(_ path: String) -> stat? {
        var info = stat()
        return path.withCString { lstat($0, &info) } == 0 ? info : nil
    }

    package static func exists(_ path: String) -> Bool { fileStatus(path) != nil }

    package static func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return path.withCString { stat($0, &info) } == 0 && (info.st_mode & S_IFMT) == S_IFDIR
    }

    /// The limit on the files a process may have open.
    #if canImport(Glibc)
        private static let openFiles = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
    #else
        private static let openFiles = RLIMIT_NOFILE
    #endif

    /// How many files the process may have open at once (its soft limit); `Int.max` when unlimited
    /// or unknown.
    package static func openFileLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(openFiles, &limit) == 0 else { return .max }
        // Unlimited is the largest value there is.
        return Int(clamping: limit.rlim_cur)
    }

    /// Raises the soft limit on open files to the hard one (on macOS, at most `OPEN_MAX`, past which
    /// it refuses a soft limit though it reports no hard one).
    package static func raiseOpenFileLimit() {
        var limit = rlimit()
        guard getrlimit(openFiles, &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        #if canImport(Darwin)
            limit.rlim_cur = min(limit.rlim_max, rlim_t(OPEN_MAX))
        #endif
        _ = setrlimit(openFiles, &limit)
    }

    /// Bytes available to unprivileged users on the volume holding `directory`.
    package static func freeSpace(_ directory: String) -> Int64? {
        var info = statvfs()
        guard directory.withCString({ statvfs($0, &info) }) == 0 else { return nil }
        return Int64(info.f_bavail) * Int64(info.f_frsize)
    }

    /// The file's bytes, at most `limit` of them; the buffer is sized by the file, not by the limit.
    package static func readWholeFile(_ path: String, limit: Int) throws -> [UInt8] {
        let descriptor = try open(path, flags: O_RDONLY | O_NOFOLLOW)
        defer { close(descriptor) }
        return try readWholeFile(descriptor, limit: limit, path: path)
    }

    /// The bytes of the open file, at most `limit` of them.
    package static func readWholeFile(_ descriptor: Int32, limit: Int, path: String) throws -> [UInt8] {
        let length = Int(clamping: try size(descriptor, path: path))
        // One byte more than the size says, so a file that grew meanwhile is still read to its end.
        // A size of 0 says nothing for the kernel's files under /proc, whose text the kernel makes
        // again for every read: those are read in pieces of 16 KiB, which hold the usual ones whole.
        let first = min(limit, length == 0 ? 16 * 1024 : length + 1)
        var bytes = try read(descriptor, count: first, at: 0, path: path)
        guard bytes.count == first else { return bytes }
        while bytes.count < limit {
            let more = try read(
                descriptor, count: min(limit - bytes.count, 64 * 1024), at: Int64(bytes.count), path: path)
            if more.isEmpty { break }
            bytes += more
        }
        return bytes
    }

    /// The names a directory stream lists, `.` and `..` left out; `nil` once there are more than
    /// `limit`.
    static func names(in directory: DirectoryStream, limit: Int = .max) -> [String]? {
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafePointer(to: entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: Int(NAME_MAX) + 1) { String(cString: $0) }
            }
            guard name != "." && name != ".." else { continue }
            if names.count == limit { return nil }
            names.append(name)
        }
        return names
    }

    package static var processID: Int32 { getpid() }

    /// `path` made absolute against the working directory, with `.`, `..` and repeated slashes
    /// resolved by name (symbolic links are left alone).
    package static func absolutePath(_ path: String) -> String {
        if isNormalAbsolutePath(path) { return path }
        var base = ""
        if path.utf8.first != UInt8(ascii: "/") {
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            if getcwd(&buffer, buffer.count) != nil {
                base = buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            }
        }
        var components: [String] = []
        for component in pathComponents(base + "/" + path) {
            switch component {
            case ".": continue
            case "..": if !components.isEmpty { components.removeLast() }
            default: components.append(component)
            }
        }
        return "/" + components.joined(separator: "/")
    }

    /// The components of `path` between its `/` bytes, empty ones left out, as the kernel reads
    /// it: a `/` followed by a combining mark is one Swift character, yet still a separator (split
    /// by characters, `../\u{301}x` would be one name, not `..` and another).
    package static func pathComponents(_ path: String) -> [String] {
        path.utf8.split(separator: UInt8(ascii: "/")).map { String(decoding: $0, as: UTF8.self) }
    }

    /// `path` split at its last `/` byte (see ``pathComponents(_:)``): what comes before it and
    /// after it; `nil` when it has none.
    package static func splitAtLastSlash(_ path: String) -> (parent: String, name: String)? {
        let bytes = path.utf8
        guard let slash = bytes.lastIndex(of: UInt8(ascii: "/")) else { return nil }
        return (
            String(decoding: bytes[..<slash], as: UTF8.self),
            String(decoding: bytes[bytes.index(after: slash)...], as: UTF8.self)
        )
    }

    /// Whether `path` is absolute with nothing to resolve: no empty, `.` or `..` component and no
    /// slash at its end (but `/` itself), so ``absolutePath(_:)`` would give it back unchanged.
    package static func isNormalAbsolutePath(_ path: String) -> Bool {
        var utf8 = path.utf8.makeIterator()
        guard utf8.next() == UInt8(ascii: "/") else { return false }
        if path.utf8.count == 1 { return true }
        // The length of the current component and whether it holds only dots so far.
        var length = 0
        var dots = true
        while let byte = utf8.next() {
            if byte == UInt8(ascii: "/") {
                if length == 0 || (dots && length <= 2) { return false }
                length = 0
                dots = true
            } else {
                length += 1
                dots = dots && byte == UInt8(ascii: ".")
            }
        }
        return length > 0 && !(dots && length <= 2)
    }

    /// Creates the directory `path` for files no other user may read (mode 0700), and any missing
    /// parents (0755). An existing one that holds `marker` (a file only such a directory holds) and
    /// lets others in is closed to them: an earlier version made it 0755.
    package static func makePrivateDirectory(_ path: String, marker: String) throws {
        guard let (parent, _) = splitAtLastSlash(path) else {
            return try makePrivateDirectory("./" + path, marker: marker)
        }
        if !parent.isEmpty { try makeDirectories(parent) }
        if path.withCString({ mkdir($0, 0o700) }) == 0 { return }
        guard errno == EEXIST else { throw error("create directory", path: path) }
        guard isDirectory(path) else { throw HaulError(.fileSystem, "\(path) is not a directory") }
        if let status = fileStatus(path), status.st_uid == getuid(), status.st_mode & 0o077 != 0,
            exists(path + "/" + marker)
        {
            _ = path.withCString { chmod($0, 0o700) }
        }
    }

    /// Creates `path` and any missing parent directories.
    package static func makeDirectories(_ path: String) throws {
        var current = path.utf8.first == UInt8(ascii: "/") ? "" : "."
        for component in pathComponents(path) {
            current += "/" + component
            if isDirectory(current) { continue }
            if current.withCString({ mkdir($0, 0o755) }) != 0 && errno != EEXIST {
                throw error("create directory", path: current)
            }
        }
    }
}

#if canImport(Darwin)
    /// What `opendir` returns.
    typealias DirectoryStream = UnsafeMutablePointer<DIR>
#else
    /// What `opendir` returns (`DIR` is opaque in Glibc).
    typealias DirectoryStream = OpaquePointer
#endif

/// An `errno` value, kept as the underlying error of a ``HaulError``.
public struct SystemError: Error, Sendable, Equatable {
    /// The `errno` value.
    public let code: Int32
}

// The module-qualified names keep these calls unambiguous next to the wrappers above.
#if canImport(Glibc)
    private let systemOpen: @Sendable (UnsafePointer<CChar>, Int32, mode_t) -> Int32 = { Glibc.open($0, $1, $2) }
    private let systemClose: @Sendable (Int32) -> Int32 = { Glibc.close($0) }
    private let systemRename: @Sendable (UnsafePointer<CChar>, UnsafePointer<CChar>) -> Int32 = { Glibc.rename($0, $1) }
    private let systemUnlink: @Sendable (UnsafePointer<CChar>) -> Int32 = { Glibc.unlink($0) }
#elseif canImport(Musl)
    private let systemOpen: @Sendable (UnsafePointer<CChar>, Int32, mode_t) -> Int32 = { Musl.open($0, $1, $2) }
    private let systemClose: @Sendable (Int32) -> Int32 = { Musl.close($0) }
    private let systemRename: @Sendable (UnsafePointer<CChar>, UnsafePointer<CChar>) -> Int32 = { Musl.rename($0, $1) }
    private let systemUnlink: @Sendable (UnsafePointer<CChar>) -> Int32 = { Musl.unlink($0) }
#elseif canImport(Darwin)
    private let systemOpen: @Sendable (UnsafePointer<CChar>, Int32, mode_t) -> Int32 = { Darwin.open($0, $1, $2) }
    private let systemClose: @Sendable (Int32) -> Int32 = { Darwin.close($0) }
    private let systemRename: @Sendable (UnsafePointer<CChar>, UnsafePointer<CChar>) -> Int32 = {
        Darwin.rename($0, $1)
    }
    private let systemUnlink: @Sendable (UnsafePointer<CChar>) -> Int32 = { Darwin.unlink($0) }
#endif
