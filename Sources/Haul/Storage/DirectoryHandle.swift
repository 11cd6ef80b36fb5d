import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// An open directory that holds a download's files. Its files are opened, renamed and removed by
/// name relative to it (`openat`, `renameat`, `unlinkat`), never through its path again and never
/// through a symbolic link: once the directory is open, what its path leads to later does not
/// matter. ``DownloadConfinement`` opens it beneath a download root, following no link on the way.
package final class DirectoryHandle: Sendable {
    /// The directory's path, as it was opened; for messages and for the paths of its files.
    package let path: String
    let descriptor: Int32
    /// When the directory was opened, counted from the process's first opening: a copy of a handle
    /// (`F_DUPFD`) shares the open file description, and this number, with the handle copied.
    let opening: UInt64
    /// The names ``listed(atMost:)`` read: a name not among them is taken to be absent.
    private let listing: Set<String>?
    /// The device and inode, once read: an open directory keeps them for as long as it is open.
    private let knownIdentity = Mutex<[UInt64]?>(nil)

    /// The number of the next opening.
    private static let openings = Atomic<UInt64>(0)

    private init(path: String, descriptor: Int32, copying original: DirectoryHandle? = nil, listing: Set<String>? = nil)
    {
        self.path = path
        self.descriptor = descriptor
        self.opening = original?.opening ?? Self.openings.add(1, ordering: .relaxed).oldValue
        self.listing = listing
    }

    deinit { POSIX.close(descriptor) }

    /// Opens the directory at `path`, following symbolic links as the caller's own path does
    /// (creating it and its parents first when `creating`).
    package static func open(_ path: String, creating: Bool = false) throws -> DirectoryHandle {
        if creating && !POSIX.isDirectory(path) { try POSIX.makeDirectories(path) }
        do {
            return DirectoryHandle(path: path, descriptor: try POSIX.open(path, flags: O_RDONLY | O_DIRECTORY))
        } catch let error as HaulError where (error.underlying as? SystemError)?.code == ENOENT {
            throw HaulError(.fileSystem, "directory \(path) does not exist", underlying: error.underlying)
        }
    }

    /// Opens the directory `relative` (components separated by `/`, no `..`) beneath the open
    /// `root`, following no symbolic link on the way: one `openat2` on Linux, else a walk of
    /// `openat` calls with `O_NOFOLLOW`, one component at a time. With `creating`, missing
    /// directories are made on the way (mode 0755, or less by the umask).
    static func open(
        _ relative: String, beneath root: DirectoryHandle, creating: Bool, rootPath: String
    ) throws -> DirectoryHandle {
        let components = POSIX.pathComponents(relative).filter { $0 != "." }
        let path = components.isEmpty ? root.path : root.path + "/" + components.joined(separator: "/")
        if components.contains("..") {
            throw HaulError(.outsideDownloadRoot, "\(path): a path with \"..\" is not opened beneath \(rootPath)")
        }
        if components.isEmpty {
            let copy = fcntl(root.descriptor, F_DUPFD_CLOEXEC, 0)
            guard copy >= 0 else { throw POSIX.error("open", path: path) }
            return DirectoryHandle(path: path, descriptor: copy, copying: root)
        }
        if !creating {
            let opened = Platform.openBeneath(
                root.descriptor, components.joined(separator: "/"), flags: O_RDONLY | O_DIRECTORY, mode: 0)
            if opened >= 0 { return DirectoryHandle(path: path, descriptor: opened) }
            if errno != ENOSYS { throw failure(errno, opening: path, rootPath: rootPath) }
        }
        // One component at a time: each is opened in the one before, refusing links.
        var current = root
        var walked = root.path
        for component in components {
            walked += "/" + component
            var next = current.openDirectory(component)
            if next < 0 && errno == ENOENT && creating {
                if component.withCString({ mkdirat(current.descriptor, $0, 0o755) }) != 0 && errno != EEXIST {
                    throw POSIX.error("create directory", path: walked)
                }
                next = current.openDirectory(component)
            }
            guard next >= 0 else {
                let code = errno
                if code == ENOTDIR, current.status(component).map({ $0.st_mode & S_IFMT == S_IFLNK }) == true {
                    throw failure(ELOOP, opening: walked, rootPath: rootPath)
                }
                throw failure(code, opening: walked, rootPath: rootPath)
            }
            current = DirectoryHandle(path: walked, descriptor: next)
        }
        return current
    }

    private static func failure(_ code: Int32, opening path: String, rootPath: String) -> HaulError {
        switch code {
        case ELOOP, EXDEV:
            return HaulError(
                .outsideDownloadRoot,
                "\(path) is reached through a symbolic link, which is never followed beneath the download root "
                    + rootPath,
                underlying: SystemError(code: code))
        case ENOENT:
            return HaulError(.fileSystem, "directory \(path) does not exist", underlying: SystemError(code: code))
        default:
            return POSIX.error("open", path: path, errno: code)
        }
    }

    private func openDirectory(_ name: String) -> Int32 {
        while true {
            let result = name.withCString { openat(descriptor, $0, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) }
            if result >= 0 || errno != EINTR { return result }
        }
    }

    /// The path of the file `name` in this directory.
    package func pathOf(_ name: String) -> String { path == "/" ? "/" + name : path + "/" + name }

    /// The device and inode of the directory.
    package func identity() throws -> [UInt64] {
        if let known = knownIdentity.withLock({ $0 }) { return known }
        let identity = try POSIX.identity(descriptor)
        knownIdentity.withLock { $0 = identity }
        return identity
    }

    /// Opens the file `name` (a symbolic link there is refused, never followed).
    package func openFile(_ name: String, flags: Int32, mode: mode_t = 0o644) throws -> Int32 {
        try checkName(name)
        while true {
            let result = name.withCString { openat(descriptor, $0, flags | O_NOFOLLOW | O_CLOEXEC, mode) }
            if result >= 0 { return result }
            if errno == EINTR { continue }
            throw POSIX.error("open", path: pathOf(name))
        }
    }

    /// Opens the file `name` with `flags`, creating it (mode 0644) when nothing is there; tells
    /// whether this call created it. A symbolic link is refused.
    ///
    /// The creation is tried first: most files a downloader opens this way are new ones, which then
    /// cost one call.
    package func openOrCreate(_ name: String, flags: Int32) throws -> (descriptor: Int32, created: Bool) {
        try checkName(name)
        while true {
            let fresh = name.withCString {
                openat(descriptor, $0, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
            }
            if fresh >= 0 { return (fresh, true) }
            let refusal = errno
            if refusal == EINTR { continue }
            let existing = name.withCString { openat(descriptor, $0, flags | O_NOFOLLOW | O_CLOEXEC) }
            if existing >= 0 { return (existing, false) }
            let code = errno
            if code == EINTR { continue }
            // Removed in between: created again.
            if refusal == EEXIST && code == ENOENT { continue }
            if refusal == EEXIST || code != ENOENT { throw POSIX.error("open", path: pathOf(name), errno: code) }
            throw POSIX.error("create", path: pathOf(name), errno: refusal)
        }
    }

    /// Refuses a name that is not one entry of this directory: every file is opened by name in it,
    /// never through a path.
    private func checkName(_ name: String) throws {
        guard Self.isEntryName(name) else {
            throw HaulError(.fileSystem, "\"\(name)\" is not a file name in \(path)")
        }
    }

    private static func isEntryName(_ name: String) -> Bool {
        !name.isEmpty && name != "." && name != ".." && !name.utf8.contains(UInt8(ascii: "/"))
    }

    /// What `lstat` says about `name`: `nil` when nothing is there, or when `name` is not one entry
    /// of this directory (a path would follow links in its leading components).
    package func status(_ name: String) -> stat? {
        guard Self.isEntryName(name) else { return nil }
        if let listing, !listing.contains(name) { return nil }
        var info = stat()
        return name.withCString { fstatat(descriptor, $0, &info, AT_SYMLINK_NOFOLLOW) } == 0 ? info : nil
    }

    package func exists(_ name: String) -> Bool { status(name) != nil }

    package func isDirectory(_ name: String) -> Bool {
        status(name).map { $0.st_mode & S_IFMT == S_IFDIR } ?? false
    }

    /// Renames `name` to `newName` in this directory (replacing what was there, a link itself
    /// rather than what it points to).
    package func rename(_ name: String, to newName: String) throws {
        try checkName(name)
        try checkName(newName)
        let result = name.withCString { from in newName.withCString { to in renameat(descriptor, from, descriptor, to) }
        }
        if result != 0 { throw POSIX.error("rename \(pathOf(name)) to", path: pathOf(newName)) }
    }

    /// Removes the file `name`; a file that is already gone is not an error.
    package func unlink(_ name: String) throws {
        try checkName(name)
        if name.withCString({ unlinkat(descriptor, $0, 0) }) != 0 && errno != ENOENT {
            throw POSIX.error("remove", path: pathOf(name))
        }
    }

    /// Makes renames and removals in the directory durable.
    package func sync() throws {
        try POSIX.syncAll(descriptor, path: path)
    }

    /// Writes the dirty data and metadata of the directory's whole file system to stable storage
    /// (see ``Platform/syncFileSystem(_:)``).
    package func syncFileSystem() throws {
        if Platform.syncFileSystem(descriptor) != 0 { throw POSIX.error("sync the file system of", path: path) }
    }

    /// Bytes available to unprivileged users on the directory's volume.
    package func freeSpace() -> Int64? {
        var info = statvfs()
        guard fstatvfs(descriptor, &info) == 0 else { return nil }
        return Int64(info.f_bavail) * Int64(info.f_frsize)
    }

    /// The bytes of the file `name`, at most `limit` of them.
    package func readWholeFile(_ name: String, limit: Int) throws -> [UInt8] {
        let file = try openFile(name, flags: O_RDONLY)
        defer { POSIX.close(file) }
        return try POSIX.readWholeFile(file, limit: limit, path: pathOf(name))
    }

    /// The names in the directory, `.` and `..` left out.
    package func list() -> [String] { list(atMost: .max) ?? [] }

    /// ``list()``, or `nil` when the directory holds more than `limit` names (or cannot be read).
    private func list(atMost limit: Int) -> [String]? {
        // A descriptor of its own, not a duplicate: a duplicate shares its read position with this
        // handle, so two listings at once would each see part of the directory.
        let own = openat(descriptor, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard own >= 0 else { return nil }
        guard let directory = fdopendir(own) else {
            POSIX.close(own)
            return nil
        }
        defer { closedir(directory) }
        return POSIX.names(in: directory, limit: limit)
    }

    /// This directory again, with its names read once when it holds at most `limit`: then a look
    /// at a name that is not among them (``status(_:)``, ``exists(_:)``) answers without a system
    /// call, which makes thousands of looks at names that are not there yet (an add of many
    /// downloads into it) cheap. A name among them is looked at as always. Only for a look that
    /// ends soon: a file created later is not seen.
    package func listed(atMost limit: Int) -> DirectoryHandle {
        guard let names = list(atMost: limit) else { return self }
        let copy = fcntl(descriptor, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { return self }
        return DirectoryHandle(path: path, descriptor: copy, copying: self, listing: Set(names))
    }
}
