import NIOCore
import NIOPosix
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The file that holds a download's bytes until it is complete.
///
/// Writes are positional, so any byte range can be written in any order; every blocking call runs
/// on a thread pool, never on the caller's executor or an event loop.
final class PartialFile: Sendable {
    let path: String
    /// The directory the file was opened in and its name there, to open it again for direct I/O;
    /// `nil` for a file opened by its path.
    private let place: (folder: DirectoryHandle, name: String)?
    private let descriptor: Int32
    private let io: BlockingIO
    /// A second descriptor opened for direct I/O, once ``enableDirectWrites()`` succeeded, and
    /// whether writes still use it. A refused write turns direct I/O off but leaves the descriptor
    /// open until the file closes: another thread may be writing through it at that moment, and a
    /// descriptor number closed under it could already name a different file.
    private let direct = Mutex<(descriptor: Int32?, inUse: Bool)>((nil, false))

    /// Opens (creating if needed) the partial file; a symbolic link at `path` is refused, never followed.
    /// `readOnly` opens an existing file for checking only.
    init(path: String, io: BlockingIO = .shared, readOnly: Bool = false) throws {
        self.path = path
        self.io = io
        self.place = nil
        self.descriptor = try POSIX.open(path, flags: readOnly ? O_RDONLY | O_NOFOLLOW : O_RDWR | O_CREAT | O_NOFOLLOW)
    }

    /// Takes over `descriptor`, already open on the file `name` in `folder` for reading and writing.
    init(in folder: DirectoryHandle, name: String, descriptor: Int32, io: BlockingIO) {
        self.path = folder.pathOf(name)
        self.io = io
        self.place = (folder, name)
        self.descriptor = descriptor
    }

    deinit {
        POSIX.close(descriptor)
        if let opened = direct.withLock({ $0.descriptor }) { POSIX.close(opened) }
    }

    /// Opens the file a second time for direct I/O (full, page-aligned pages straight to the disk);
    /// returns false when the file system or the platform does not offer it.
    @discardableResult
    func enableDirectWrites() -> Bool {
        direct.withLock { direct in
            if direct.descriptor != nil { return direct.inUse }
            let opened =
                if let place {
                    Platform.openUncached(in: place.folder.descriptor, place.name, flags: O_WRONLY)
                } else {
                    Platform.openUncached(in: AT_FDCWD, path, flags: O_WRONLY)
                }
            guard opened >= 0 else { return false }
            // The same file, not one that replaced it at this path in between.
            guard let mine = try? POSIX.identity(descriptor), let theirs = try? POSIX.identity(opened), mine == theirs
            else {
                POSIX.close(opened)
                return false
            }
            direct = (opened, true)
            return true
        }
    }

    var usesDirectWrites: Bool { direct.withLock { $0.inUse } }

    /// Writes a block on the thread pool (see ``WriteBlock/write(to:)``).
    func write(_ block: WriteBlock) async throws {
        try await io.run { [self] in try block.write(to: self) }
    }

    /// Writes through the page cache, on the calling thread.
    func writeNow(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        try POSIX.write(descriptor, bytes, at: offset, path: path)
    }

    /// Writes whole pages from page-aligned memory with direct I/O, on the calling thread. Should the
    /// file system refuse (or write less than asked, leaving the rest unaligned), the rest goes through
    /// the page cache, and a refusal turns direct I/O off for this file.
    func writeDirect(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        guard let direct = direct.withLock({ $0.inUse ? $0.descriptor : nil }) else {
            return try writeNow(bytes, at: offset)
        }
        var done = 0
        while done < bytes.count {
            let result = pwrite(direct, bytes.baseAddress! + done, bytes.count - done, off_t(offset) + off_t(done))
            if result > 0 {
                done += result
                if done % WriteBlock.pageSize != 0 { break }
                continue
            }
            if result < 0 && errno == EINTR { continue }
            if result < 0 && errno != EINVAL { throw POSIX.error("write to", path: path) }
            self.direct.withLock { $0.inUse = false }
            break
        }
        if done < bytes.count {
            try writeNow(UnsafeRawBufferPointer(rebasing: bytes[done...]), at: offset + Int64(done))
        }
    }

    func syncData() async throws {
        try await io.run { [self] in try syncDataNow() }
    }

    /// Flushes the data on the calling thread (which must be one that may block).
    func syncDataNow() throws { try POSIX.syncData(descriptor, path: path) }

    /// Reserves disk space for the bytes from `offset` up to `length`; with `keepingSize` the file's
    /// length stays as it is. Returns false where the file system or the platform cannot reserve
    /// space; a full disk throws ``HaulError/Code/diskFull``.
    func reserve(from offset: Int64, upTo length: Int64, keepingSize: Bool) async throws -> Bool {
        guard offset < length else { return true }
        return try await io.run { [descriptor, path] in
            while true {
                let failure = Platform.reserveSpace(
                    descriptor, offset: offset, length: length - offset, keepingSize: keepingSize)
                switch failure {
                case 0: return true
                case EINTR: continue
                case EOPNOTSUPP, ENOSYS, EINVAL: return false
                default: throw POSIX.error("reserve space for", path: path, errno: failure)
                }
            }
        }
    }

    /// Sets the file's length to `length` when it is shorter (the new bytes read as zeros).
    func extend(to length: Int64) async throws {
        try await io.run { [descriptor, path] in
            if try POSIX.size(descriptor, path: path) < length {
                try POSIX.truncate(descriptor, to: length, path: path)
            }
        }
    }

    func truncate(to length: Int64) async throws {
        try await io.run { [descriptor, path] in try POSIX.truncate(descriptor, to: length, path: path) }
    }

    func read(count: Int, at offset: Int64) async throws -> [UInt8] {
        try await io.run { [descriptor, path] in
            try POSIX.read(descriptor, count: count, at: offset, path: path)
        }
    }

    func size() throws -> Int64 { try POSIX.size(descriptor, path: path) }

    /// Reads the bytes from `start` up to `length` in order, in 1 MiB pieces, folding them into `state`.
    func readSequentially<State: Sendable>(
        from start: Int64 = 0, upTo length: Int64, into state: State,
        _ fold: @escaping @Sendable (inout State, UnsafeRawBufferPointer) -> Void
    ) async throws -> State {
        guard start < length else { return state }
        return try await io.run { [descriptor, path] in
            var state = state
            var buffer = [UInt8](repeating: 0, count: 1 << 20)
            var offset: Int64 = start
            while offset < length {
                let wanted = Int(min(Int64(buffer.count), length - offset))
                let count = try buffer.withUnsafeMutableBytes { pointer in
                    try POSIX.readInto(descriptor, pointer, count: wanted, at: offset, path: path)
                }
                guard count == wanted else {
                    throw HaulError(.fileSystem, "\(path) ended at \(offset + Int64(count)) bytes, expected \(length)")
                }
                buffer.withUnsafeBytes { fold(&state, UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
                offset += Int64(count)
            }
            return state
        }
    }
}
