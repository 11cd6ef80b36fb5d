#if canImport(Darwin)
    import Darwin

    extension Platform {
        /// An identity of the running kernel's boot: the `kern.bootsessionuuid` sysctl; `nil` when it
        /// cannot be read.
        package static func bootIdentity() -> String? {
            var size = 0
            guard sysctlbyname("kern.bootsessionuuid", nil, &size, nil, 0) == 0, size > 0 else { return nil }
            var buffer = [CChar](repeating: 0, count: size)
            guard sysctlbyname("kern.bootsessionuuid", &buffer, &size, nil, 0) == 0 else { return nil }
            let text = buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }.filter { !$0.isWhitespace }
            return text.isEmpty ? nil : text
        }

        /// Reserves disk space for bytes `offset..<offset + length` of the open file
        /// (`F_PREALLOCATE`, contiguous when it can be, from the end of the space already
        /// allocated); without `keepingSize` the file is then extended to `offset + length`.
        /// Returns 0, or the `errno` of the failure.
        package static func reserveSpace(_ descriptor: Int32, offset: Int64, length: Int64, keepingSize: Bool)
            -> Int32
        {
            var current = stat()
            guard fstat(descriptor, &current) == 0 else { return errno }
            // F_PEOFPOSMODE counts from the end of what the file has allocated: ask for what lies past it.
            let wanted = offset + length - Int64(current.st_blocks) * 512
            if wanted > 0 {
                // All of it, in one piece when the file system can; else all of it anywhere.
                var store = fstore_t(
                    fst_flags: UInt32(F_ALLOCATECONTIG | F_ALLOCATEALL), fst_posmode: F_PEOFPOSMODE, fst_offset: 0,
                    fst_length: off_t(wanted), fst_bytesalloc: 0)
                if fcntl(descriptor, F_PREALLOCATE, &store) != 0 {
                    store.fst_flags = UInt32(F_ALLOCATEALL)
                    guard fcntl(descriptor, F_PREALLOCATE, &store) == 0 else {
                        // Callers know EOPNOTSUPP as "this file system cannot": Darwin says ENOTSUP.
                        return errno == ENOTSUP ? EOPNOTSUPP : errno
                    }
                }
            }
            if !keepingSize && Int64(current.st_size) < offset + length {
                guard ftruncate(descriptor, off_t(offset + length)) == 0 else { return errno }
            }
            return 0
        }

        /// Opens `name` in the open `directory` (`AT_FDCWD`: `name` is a path) for writes that bypass
        /// the page cache (`F_NOCACHE` on the new descriptor), never through a symbolic link; -1 with
        /// `errno` set when the file cannot be opened so.
        package static func openUncached(in directory: Int32, _ name: String, flags: Int32) -> Int32 {
            let descriptor = name.withCString { openat(directory, $0, flags | O_NOFOLLOW | O_CLOEXEC) }
            guard descriptor >= 0 else { return -1 }
            guard fcntl(descriptor, F_NOCACHE, 1) == 0 else {
                let code = errno
                POSIX.close(descriptor)
                errno = code
                return -1
            }
            return descriptor
        }

        /// Opens `path` beneath the open `directory` in one call: Darwin has no such call that every
        /// supported version offers, so this answers `ENOSYS` and the caller walks the path one
        /// component at a time (`openat` with `O_NOFOLLOW`), which holds the same rules.
        package static func openBeneath(_ directory: Int32, _ path: String, flags: Int32, mode: mode_t) -> Int32 {
            errno = ENOSYS
            return -1
        }

        /// Flushes the file's data to stable storage: `F_FULLFSYNC`, which also empties the drive's
        /// own cache (plain `fsync` does not on Apple platforms), else `fsync` where the file system
        /// does not take it. Returns 0, or -1 with `errno` set.
        package static func syncData(_ descriptor: Int32) -> Int32 {
            fcntl(descriptor, F_FULLFSYNC) == 0 ? 0 : fsync(descriptor)
        }

        /// Flushes the file, data and metadata, to stable storage: `F_FULLFSYNC`, else `fsync`.
        /// Returns 0, or -1 with `errno` set.
        package static func syncAll(_ descriptor: Int32) -> Int32 {
            fcntl(descriptor, F_FULLFSYNC) == 0 ? 0 : fsync(descriptor)
        }

        /// Whether one flush of the whole file system holding `descriptor` makes its files' data
        /// durable: never on Apple platforms, whose flush of a file (`F_FULLFSYNC`) also empties the
        /// drive's cache, and which have no flush of one file system.
        package static func fileSystemFlushSuits(_ descriptor: Int32, device: UInt64) -> Bool {
            false
        }

        /// The bytes waiting to be written: Apple platforms do not tell (nor need to: see
        /// ``fileSystemFlushSuits(_:device:)``).
        package static func pendingWriteBytes() -> Int64? {
            nil
        }

        /// Flushes the file system holding `descriptor`: Apple platforms have no such call, so this
        /// answers `ENOSYS` (``fileSystemFlushSuits(_:device:)`` never says it suits).
        package static func syncFileSystem(_ descriptor: Int32) -> Int32 {
            errno = ENOSYS
            return -1
        }

        /// Who holds a `flock` on the open file: the platform keeps no list to read; the daemon's
        /// files then try the lock (the destination lock names no holder).
        package static func lockHolder(_ descriptor: Int32) -> LockHolder {
            .unknown
        }
    }
#endif
