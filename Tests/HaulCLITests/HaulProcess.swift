import CHaulSystem
import Dispatch
import Foundation
import Synchronization
import Testing

/// Runs the built `haul` executable as a child process.
///
/// Started with `posix_spawn` rather than Foundation's `Process`, whose `run()` crashed the test
/// run now and then (a memcpy past the end of a buffer) while other tests ran: the child gets
/// standard input from /dev/null, two pipes for its output and no other descriptor of this
/// process (whose servers' sockets it would otherwise keep open). Its output is read as it comes,
/// on a queue of its own, so a chatty child never blocks on a full pipe.
final class HaulProcess: Sendable {
    /// The `haul` binary next to the test bundle, or `HAUL_BINARY` when set.
    static var executable: String {
        if let path = ProcessInfo.processInfo.environment["HAUL_BINARY"] { return path }
        let bundle = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        return bundle.appendingPathComponent("haul").path
    }

    /// The state home every test's `haul` shares unless it asks for its own: the database is
    /// built for several processes at once.
    static let sharedStateHome: String = {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("haul-cli-state-\(getpid())").path
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }()

    let pid: Int32
    private let output: OutputCollector
    private let errors: OutputCollector
    /// The exit status, once the child has been reaped.
    private let status = Mutex<Int32?>(nil)

    /// - Parameter stateDirectory: `XDG_STATE_HOME` for the child (the database goes in its `haul` folder).
    /// - Parameter environment: variables set for the child, over this process's; an empty value
    ///   removes one.
    /// - Parameter standardInput: the file the child reads as its standard input.
    /// - Parameter launcher: a program and its arguments that run `haul` (its path and `arguments`
    ///   follow them), to start it in another setting.
    init(
        _ arguments: [String], directory: String? = nil, stateDirectory: String? = nil,
        environment extra: [String: String] = [:], standardInput: String = "/dev/null", launcher: [String] = []
    ) throws {
        var environment = ProcessInfo.processInfo.environment
        environment["XDG_STATE_HOME"] = stateDirectory ?? Self.sharedStateHome
        // The tests decide which proxies the child sees.
        for name in [
            "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy",
            "NO_PROXY",
        ] {
            environment[name] = nil
        }
        for (name, value) in extra { environment[name] = value.isEmpty ? nil : value }
        var outputPipe: [Int32] = [0, 0]
        var errorPipe: [Int32] = [0, 0]
        guard pipe(&outputPipe) == 0, pipe(&errorPipe) == 0 else {
            throw CLITestFailure("pipe: \(String(cString: strerror(errno)))")
        }
        // Children spawned here meanwhile keep none of them (they close all but 0, 1 and 2).
        for descriptor in outputPipe + errorPipe { _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC) }
        let program = launcher.first ?? Self.executable
        var child: pid_t = 0
        let spawned = withCStrings(launcher + [Self.executable] + arguments) { argv in
            withCStrings(environment.map { "\($0.key)=\($0.value)" }) { envp in
                // A structure on Linux, an opaque pointer on Apple platforms.
                #if canImport(Glibc) || canImport(Musl)
                    var actions = posix_spawn_file_actions_t()
                    var attributes = posix_spawnattr_t()
                #else
                    var actions: posix_spawn_file_actions_t = nil
                    var attributes: posix_spawnattr_t = nil
                #endif
                posix_spawn_file_actions_init(&actions)
                defer { posix_spawn_file_actions_destroy(&actions) }
                posix_spawn_file_actions_addopen(&actions, 0, standardInput, O_RDONLY, 0)
                posix_spawn_file_actions_adddup2(&actions, outputPipe[1], 1)
                posix_spawn_file_actions_adddup2(&actions, errorPipe[1], 2)
                // haul gets the signals the tests send it as a shell would give them (whatever this
                // test process ignores or blocks), and the flags that keep its other descriptors
                // here (Apple platforms close them by a flag, not a file action).
                posix_spawnattr_init(&attributes)
                defer { posix_spawnattr_destroy(&attributes) }
                var flags: Int16 = 0
                haul_spawn_default_signals(&attributes, &flags)
                var result = haul_spawn_standard_descriptors_only(&actions, &flags)
                if result == 0, let directory { result = haul_spawn_change_directory(&actions, directory) }
                guard result == 0 else { return result }
                posix_spawnattr_setflags(&attributes, flags)
                return posix_spawn(&child, program, &actions, &attributes, argv, envp)
            }
        }
        close(outputPipe[1])
        close(errorPipe[1])
        guard spawned == 0 else {
            close(outputPipe[0])
            close(errorPipe[0])
            throw CLITestFailure("cannot start \(program): \(String(cString: strerror(spawned)))")
        }
        pid = child
        output = OutputCollector(outputPipe[0])
        errors = OutputCollector(errorPipe[0])
    }

    func signal(_ number: Int32) { kill(pid, number) }

    /// Whether the child still runs (it is reaped once it has ended).
    var isRunning: Bool {
        status.withLock { status in
            guard status == nil else { return false }
            var code: Int32 = 0
            guard waitpid(pid, &code, WNOHANG) == pid else { return true }
            status = code
            return false
        }
    }

    /// Waits for the process to exit and returns its status and output.
    func finish(timeout: Duration = .seconds(60)) async throws -> (status: Int32, output: String, errors: String) {
        let deadline = ContinuousClock.now + timeout
        while isRunning {
            if ContinuousClock.now > deadline {
                signal(SIGKILL)
                throw CLITestFailure("haul did not exit within \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        let code = status.withLock { $0 } ?? -1
        // The exit code, or the signal that ended it (as Foundation's Process reports them).
        let exit = code & 0x7f == 0 ? (code >> 8) & 0xff : code & 0x7f
        // A process the child started may keep its output open: read at most 20 s more.
        let reading = ContinuousClock.now + .seconds(20)
        return (exit, await output.text(by: reading), await errors.text(by: reading))
    }

    /// Whether a signal ended the child (once ``finish(timeout:)`` has returned).
    var endedBySignal: Bool { status.withLock { $0.map { $0 & 0x7f != 0 } ?? false } }

    /// Runs `haul` to completion.
    static func run(
        _ arguments: [String], directory: String? = nil, stateDirectory: String? = nil,
        environment: [String: String] = [:], standardInput: String = "/dev/null", launcher: [String] = []
    ) async throws -> (status: Int32, output: String, errors: String) {
        try await HaulProcess(
            arguments, directory: directory, stateDirectory: stateDirectory, environment: environment,
            standardInput: standardInput, launcher: launcher
        ).finish()
    }
}

/// Reads a pipe to its end on a queue of its own.
final class OutputCollector: Sendable {
    private struct State {
        var bytes: [UInt8] = []
        var ended = false
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter = 0
    }

    private let state = Mutex(State())

    init(_ descriptor: Int32) {
        DispatchQueue(label: "haul-tests.output").async { [self] in
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            while true {
                let count = read(descriptor, &buffer, buffer.count)
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { break }
                state.withLock { $0.bytes += buffer[0..<count] }
            }
            close(descriptor)
            let waiters = state.withLock { state in
                state.ended = true
                defer { state.waiters = [:] }
                return state.waiters.values
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    /// Everything the pipe carried, once it has ended; at `deadline` at the latest, then what came
    /// so far and a line that says the pipe is still open (a process the child started keeps it),
    /// so that a test fails with its output instead of waiting for ever.
    func text(by deadline: ContinuousClock.Instant) async -> String {
        let id = state.withLock { state in
            defer { state.nextWaiter += 1 }
            return state.nextWaiter
        }
        await withCheckedContinuation { continuation in
            let ended = state.withLock { state in
                if !state.ended { state.waiters[id] = continuation }
                return state.ended
            }
            if ended { return continuation.resume() }
            // Set once the waiter is in place: whichever of the end and the deadline comes first
            // takes it out and resumes it.
            Task {
                try? await Task.sleep(until: deadline)
                self.state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
            }
        }
        return state.withLock { state in
            String(decoding: state.bytes, as: UTF8.self)
                + (state.ended ? "" : "\n[the output was still open at the test's deadline for it]\n")
        }
    }
}

/// `strings` as a NULL-terminated array of C strings, for `body`.
private func withCStrings<Result>(_ strings: [String], _ body: ([UnsafeMutablePointer<CChar>?]) -> Result) -> Result {
    let pointers = strings.map { strdup($0) }
    defer { for pointer in pointers { free(pointer) } }
    return body(pointers + [nil])
}

struct CLITestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func makeTemporaryDirectory() throws -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("haul-cli-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

func contents(_ path: String) -> [UInt8]? {
    FileManager.default.contents(atPath: path).map { [UInt8]($0) }
}

func size(_ path: String) -> Int64? {
    (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.int64Value
}
