#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Unbuffered writes to standard output and standard error, safe from any thread.
enum Output {
    static func standardOutput(_ text: String) { write(text, to: STDOUT_FILENO) }

    static func standardError(_ text: String) { write(text, to: STDERR_FILENO) }

    private static func write(_ text: String, to descriptor: Int32) {
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeMutableBytes { buffer in
                systemWrite(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
            }
            if written <= 0 { return }
            offset += written
        }
    }
}

#if canImport(Glibc)
    private let systemWrite: @Sendable (Int32, UnsafeRawPointer, Int) -> Int = { Glibc.write($0, $1, $2) }
#elseif canImport(Musl)
    private let systemWrite: @Sendable (Int32, UnsafeRawPointer, Int) -> Int = { Musl.write($0, $1, $2) }
#elseif canImport(Darwin)
    private let systemWrite: @Sendable (Int32, UnsafeRawPointer, Int) -> Int = { Darwin.write($0, $1, $2) }
#endif
