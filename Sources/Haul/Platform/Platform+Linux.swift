#if os(Linux)
    import CHaulSystem
    import Synchronization

    #if canImport(Glibc)
        import Glibc
    #elseif canImport(Musl)
        import Musl
    #endif

    extension Platform {
        /// An identity of the running kernel's boot: `/proc/sys/kernel/random/boot_id`; `nil` when it
        /// cannot be read.
        package static func bootIdentity() -> String? {
            guard let bytes = try? POSIX.readWholeFile("/proc/sys/kernel/random/boot_id", limit: 64),
                let text = String(validating: bytes, as: UTF8.self)
            else { return nil }
            let trimmed = text.filter { !$0.isWhitespace }
            return trimmed.isEmpty ? nil : trimmed
        }

        /// Reserves disk space for bytes `offset..<offset + length` of the open file (`fallocate`);
        /// with `keepingSize` the file's length stays as it is. Returns 0, or the `errno` of the
        /// failure (`EOPNOTSUPP` where the file system cannot).
        package static func reserveSpace(_ descriptor: Int32, offset: Int64, length: Int64, keepingSize: Bool)
            -> Int32
        {
            haul_fallocate(descriptor, keepingSize ? 1 : 0, off_t(offset), off_t(length)) == 0 ? 0 : errno
        }

        /// Opens `name` in the open `directory` (`AT_FDCWD`: `name` is a path) for writes that bypass
        /// the page cache (`O_DIRECT`: whole pages from page-aligned memory), never through a symbolic
        /// link; -1 with `errno` set when the file system refuses.
        package static func openUncached(in directory: Int32, _ name: String, flags: Int32) -> Int32 {
            // Glibc's module does not export O_DIRECT; its value differs between architectures.
            #if arch(x86_64)
                let direct: Int32? = 0o40000
            #elseif arch(arm64)
                let direct: Int32? = 0o200000
            #else
                let direct: Int32? = nil
            #endif
            guard let direct else {
                errno = EINVAL
                return -1
            }
            return name.withCString { openat(directory, $0, flags | direct | O_NOFOLLOW | O_CLOEXEC) }
        }

        /// Opens `path` (relative, without `..`) beneath the open `directory` in one call, following no
        /// symbolic link on the way, the last component included (`openat2` with `RESOLVE_BENEATH` and
        /// `RESOLVE_NO_SYMLINKS`). -1 with `errno` set: `ELOOP` or `EXDEV` for a link, `ENOSYS` where the
        /// kernel (before 5.6) or a sandbox's system call filter does not offer the call; the caller
        /// then walks the path one component at a time.
        package static func openBeneath(_ directory: Int32, _ path: String, flags: Int32, mode: mode_t) -> Int32 {
            while true {
                let result = path.withCString { haul_open_beneath(directory, $0, flags | O_CLOEXEC, mode) }
                if result >= 0 { return result }
                switch errno {
                case EINTR: continue
                // Container filters answer EPERM for calls they do not know; open itself never does here.
                case EPERM, E2BIG: errno = ENOSYS
                default: break
                }
                return -1
            }
        }

        /// Flushes the file's data, and the metadata needed to read it back, to stable storage
        /// (`fdatasync`). Returns 0, or -1 with `errno` set.
        package static func syncData(_ descriptor: Int32) -> Int32 {
            fdatasync(descriptor)
        }

        /// Flushes the file, data and metadata, to stable storage (`fsync`). Returns 0, or -1 with
        /// `errno` set.
        package static func syncAll(_ descriptor: Int32) -> Int32 {
            fsync(descriptor)
        }

        /// Whether one flush of the whole file system holding the open `descriptor`, on `device`
        /// (``syncFileSystem(_:)``), makes the data of the files written there durable and reports
        /// their write errors: a kernel from 5.8 on (`syncfs` reports write errors since), and a local
        /// file system whose flush of itself empties the device's cache: ext4, XFS, Btrfs, F2FS, or
        /// tmpfs (which keeps nothing on a device). ext2 and ext3 share ext4's number but not always
        /// its flush: one with that number suits only where it is mounted as ext4. Remembered for each
        /// file system.
        ///
        /// On XFS a flush of the file system that finds nothing to log may leave the device's cache
        /// as it is (a file this session wrote has its allocation and size to log); the directory's
        /// flush after the renames then forces the log, whose write empties the cache first, before
        /// any rename is durable.
        package static func fileSystemFlushSuits(_ descriptor: Int32, device: UInt64) -> Bool {
            var type: UInt64 = 0
            var identity: UInt64 = 0
            guard kernelReportsFileSystemFlushErrors, haul_file_system_type(descriptor, &type, &identity) == 0
            else { return false }
            // By device, type and identity: a device's number may come back with another file system
            // once the first is unmounted.
            let key = FileSystemKey(device: device, type: type, identity: identity)
            if let known = fileSystemFlushSuitability.withLock({ $0[key] }) { return known }
            let suits: Bool
            if type == ext4Type {
                let (major, minor) = deviceNumbers(device)
                guard let bytes = try? POSIX.readWholeFile("/proc/self/mountinfo", limit: 1 << 24),
                    let mounted = FileSystemFacts.mountType(
                        mountinfo: String(decoding: bytes, as: UTF8.self), major: major, minor: minor)
                else { return false }
                suits = mounted == "ext4"
            } else {
                suits = flushedFileSystems.contains(type)
            }
            fileSystemFlushSuitability.withLock { $0[key] = suits }
            return suits
        }

        /// The bytes of the machine's page cache waiting to be written (`Dirty` plus `Writeback` in
        /// `/proc/meminfo`); nil when they cannot be read.
        package static func pendingWriteBytes() -> Int64? {
            guard let bytes = try? POSIX.readWholeFile("/proc/meminfo", limit: 1 << 16) else { return nil }
            return FileSystemFacts.pendingWriteBytes(meminfo: String(decoding: bytes, as: UTF8.self))
        }

        /// Writes the dirty data and metadata of the file system holding the open `descriptor` to
        /// stable storage (`syncfs`). Returns 0, or -1 with `errno` set. Not retried on `EINTR`: the
        /// failure may have reported a write error, which is reported once.
        package static func syncFileSystem(_ descriptor: Int32) -> Int32 {
            haul_syncfs(descriptor)
        }

        /// The process holding a `flock` on the open file, from `/proc/locks`.
        package static func lockHolder(_ descriptor: Int32) -> LockHolder {
            var status = stat()
            guard fstat(descriptor, &status) == 0,
                let bytes = try? POSIX.readWholeFile("/proc/locks", limit: 1 << 20),
                let text = String(validating: bytes, as: UTF8.self)
            else { return .unknown }
            let (major, minor) = deviceNumbers(UInt64(status.st_dev))
            let file =
                String(major, radix: 16).leftPadded(to: 2) + ":" + String(minor, radix: 16).leftPadded(to: 2)
                + ":" + String(status.st_ino)
            // "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF"; waiting requests carry "->" and are skipped.
            for line in text.split(separator: "\n") {
                let fields = line.split(separator: " ")
                guard fields.count >= 6, fields[1] == "FLOCK", fields[5] == file, let pid = Int32(fields[4]) else {
                    continue
                }
                return .process(pid)
            }
            return .nobody
        }
    }

    /// The `f_type` of ext2, ext3 and ext4.
    private let ext4Type: UInt64 = 0xEF53
    /// The `f_type` of the other file systems whose `syncfs` empties the device's cache: XFS, Btrfs,
    /// F2FS, and tmpfs (nothing to flush).
    private let flushedFileSystems: Set<UInt64> = [0x5846_5342, 0x9123_683E, 0xF2F5_2010, 0x0102_1994]
    /// Whether a flush of the file system suits each one asked about, by device, type and identity.
    private let fileSystemFlushSuitability = Mutex<[FileSystemKey: Bool]>([:])

    /// A file system as ``Platform/fileSystemFlushSuits(_:device:)`` remembers it.
    private struct FileSystemKey: Hashable {
        let device: UInt64
        let type: UInt64
        let identity: UInt64
    }

    /// Whether the running kernel reports write errors to `syncfs` (5.8 and later).
    private let kernelReportsFileSystemFlushErrors: Bool = {
        var names = utsname()
        guard uname(&names) == 0 else { return false }
        let release = withUnsafeBytes(of: names.release) { bytes in
            String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
        }
        return FileSystemFacts.kernelReportsFileSystemFlushErrors(release: release)
    }()

    /// The major and minor numbers of a device number (glibc's `gnu_dev_major` and `gnu_dev_minor`).
    private func deviceNumbers(_ device: UInt64) -> (major: UInt64, minor: UInt64) {
        (((device >> 8) & 0xfff) | ((device >> 32) & ~0xfff), (device & 0xff) | ((device >> 12) & ~0xff))
    }
#endif
