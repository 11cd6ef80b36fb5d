import CHaulSystem
import Haul
import Logging

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Programs the daemon runs when a download ends: `--on-complete` and `--on-error`.
///
/// Each runs with three arguments, the download's ID, its file's path and its URL, never through a
/// shell (nothing in them is ever interpreted). Its environment holds only `PATH`, `HOME`, `LANG`
/// and `TZ` from the daemon's, so no credential reaches it. It gets no input and shares the daemon's
/// output; a program still running at the time limit is killed with everything it started. What it did (`on-complete exited
/// 0`, `on-error killed after 60 s`) is logged and recorded with the download, for `haul ls` and
/// the API.
public struct Hooks: Sendable {
    /// Run when a download completes.
    public var onComplete: String?
    /// Run when a download fails.
    public var onError: String?
    /// How long a program may run before it is killed.
    public var timeLimit: Duration = .seconds(60)

    /// No programs.
    public init() {}

    /// Throws when a program given is not an executable file.
    public func check() throws {
        for (option, path) in [("--on-complete", onComplete), ("--on-error", onError)] {
            guard let path else { continue }
            guard path.contains("/"), access(path, X_OK) == 0, !POSIX.isDirectory(path) else {
                throw HaulError(
                    .invalidArgument, "\(option) \(path) is not an executable file (give its path; no shell runs it)")
            }
        }
    }
}

/// Runs the hooks for the manager's events.
struct HookRunner: Sendable {
    let hooks: Hooks
    let manager: DownloadManager
    let logger: Logger
    let clock: any Clock<Duration>

    /// Runs the programs for the downloads that end, until the events do; each one runs on its own,
    /// so a slow program holds up no other.
    func run(_ events: AsyncStream<DownloadManagerEvent>) async {
        await withDiscardingTaskGroup { group in
            for await event in events {
                // Another worker of a fleet runs its own hooks for what it did.
                guard case .stateChanged = event.kind, !event.isFromAnotherWorker else { continue }
                let download = event.download
                let (name, program): (String, String?) =
                    switch download.state {
                    case .completed: ("on-complete", hooks.onComplete)
                    case .failed: ("on-error", hooks.onError)
                    default: ("", nil)
                    }
                // A state event that only records a hook's result must not run it again.
                guard let program, download.hook == nil else { continue }
                group.addTask {
                    let result = await runProgram(
                        program, name: name,
                        arguments: [
                            download.id.description, download.destination ?? download.directory ?? "", download.url,
                        ])
                    logger.info("download \(download.id): \(result)")
                    try? await manager.recordHookResult(download.id, result)
                }
            }
        }
    }

    /// Runs `program` and waits for it (at most the time limit); returns what happened, in words.
    func runProgram(_ program: String, name: String, arguments: [String]) async -> String {
        let kept: [String] = ["PATH", "HOME", "LANG", "TZ"]
        let environment = kept.compactMap { key -> String? in
            guard let value = getenv(key) else { return nil }
            return "\(key)=\(String(cString: value))"
        }
        // The limit counts from here, whenever the task that waits for it starts.
        let clock = TransferClock(self.clock)
        let deadline = clock.now + hooks.timeLimit
        var processID = pid_t()
        let spawned = withCStrings([program] + arguments) { argv in
            withCStrings(environment) { envp in
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
                posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0)
                // The daemon ignores SIGTERM, SIGINT and SIGPIPE (it handles the first two itself):
                // the program gets them back as they normally are, nothing blocked, and a process
                // group of its own, so that the time limit ends whatever it started too.
                posix_spawnattr_init(&attributes)
                defer { posix_spawnattr_destroy(&attributes) }
                posix_spawnattr_setpgroup(&attributes, 0)
                var flags = Int16(POSIX_SPAWN_SETPGROUP)
                haul_spawn_default_signals(&attributes, &flags)
                // The daemon's sockets (its listener, its clients' connections) and files stay
                // with it: a connection it closes must close, whatever the program does meanwhile.
                let closing = haul_spawn_standard_descriptors_only(&actions, &flags)
                if closing != 0 { return closing }
                posix_spawnattr_setflags(&attributes, flags)
                return posix_spawn(&processID, program, &actions, &attributes, argv, envp)
            }
        }
        guard spawned == 0 else {
            return "\(name) could not start: \(String(cString: strerror(spawned)))"
        }
        let pid = processID
        let limit = hooks.timeLimit
        // Whichever comes first: the program's end, or the time limit on the daemon's clock.
        let status = await withTaskGroup(of: Int32?.self) { group in
            group.addTask {
                while !Task.isCancelled {
                    var status: Int32 = 0
                    let waited = waitpid(pid, &status, WNOHANG)
                    if waited == pid { return status }
                    if waited < 0 && errno != EINTR { return -1 }
                    try? await Task.sleep(for: .milliseconds(10))
                }
                return nil
            }
            group.addTask {
                try? await clock.sleep(until: deadline)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        guard let status else {
            // The whole group: the program and whatever it started.
            kill(-pid, SIGKILL)
            var ignored: Int32 = 0
            _ = waitpid(pid, &ignored, 0)
            return "\(name) killed after its \(Int(limit.components.seconds)) s limit"
        }
        return status < 0 ? "\(name) ended (its status is unknown)" : "\(name) \(Self.describe(status))"
    }

    /// `exited 0`, `killed by signal 9`.
    static func describe(_ status: Int32) -> String {
        let signal = status & 0x7f
        if signal == 0 { return "exited \((status >> 8) & 0xff)" }
        return "killed by signal \(signal)"
    }
}

/// `strings` as a NULL-terminated array of C strings, for `body`.
private func withCStrings<Result>(
    _ strings: [String], _ body: ([UnsafeMutablePointer<CChar>?]) -> Result
) -> Result {
    let pointers = strings.map { strdup($0) }
    defer { for pointer in pointers { free(pointer) } }
    return body(pointers + [nil])
}
