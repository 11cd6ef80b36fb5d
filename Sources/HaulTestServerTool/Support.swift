import Dispatch

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

// Declared outside main.swift: globals there are set only when the top-level code reaches them.

enum FileHandleLike {
    static func standardError(_ text: String) { write(text, to: STDERR_FILENO) }
    static func standardOutput(_ text: String) { write(text, to: STDOUT_FILENO) }

    private static func write(_ text: String, to descriptor: Int32) {
        var bytes = Array(text.utf8)
        _ = systemWrite(descriptor, &bytes, bytes.count)
    }
}

#if canImport(Glibc)
    private let systemWrite: @Sendable (Int32, UnsafeRawPointer, Int) -> Int = { Glibc.write($0, $1, $2) }
#elseif canImport(Darwin)
    private let systemWrite: @Sendable (Int32, UnsafeRawPointer, Int) -> Int = { Darwin.write($0, $1, $2) }
#endif

enum Thread {
    /// Runs `body` on a thread of its own (a blocking read must not hold a task's thread).
    static func detach(_ body: @escaping @Sendable () -> Void) {
        DispatchQueue(label: "haul-test-server.blocking").async { body() }
    }
}
