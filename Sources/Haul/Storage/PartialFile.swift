import NIOCore
import NIOPosix

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
    private let descriptor: Int32
    private let io: BlockingIO

    /// Opens (creating if needed) the partial file; a symbolic link at `path` is refused, never followed.
    /// `readOnly` opens an existing file for checking only.
    init(path: String, io: BlockingIO = .shared, readOnly: Bool = false) throws {
        self.path = path
        self.io = io
        self.descriptor = try POSIX.open(path, flags: readOnly ? O_RDONLY | O_NOFOLLOW : O_RDWR | O_CREAT | O_NOFOLLOW)
    }

    deinit { POSIX.close(descriptor) }

    func write(_ buffer: ByteBuffer, at offset: Int64) async throws {
        try await io.run { [descriptor, path] in
            try buffer.withUnsafeReadableBytes { try POSIX.write(descriptor, $0, at: offset, path: path) }
        }
    }

    func syncData() async throws {
        try await io.run { [descriptor, path] in try POSIX.syncData(descriptor, path: path) }
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
        try await io.run { [descriptor, path] in
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
