import CHaulSystem
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

#if canImport(FoundationEssentials)
    import FoundationEssentials
#endif

/// The PostgreSQL server the tests of the PostgreSQL store use: started by the test process on
/// loopback, in a temporary folder, the first time a test asks for it, and stopped when the
/// process ends (however it ends: the server's shell watches a pipe the process holds).
///
/// `HAUL_TEST_POSTGRES_URL` names a server to use instead (its user may create databases). Each
/// test gets a database of its own.
public enum PostgreSQLTestServer {
    /// Where the server listens, and the user the tests connect as.
    public struct Server: Sendable {
        public let host: String
        public let port: Int
        public let user: String
        public let password: String?
        /// The folder of the server's programs (`psql`, `pg_isready`).
        let programs: String
    }

    /// What went wrong starting or using the server.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    /// A database of the server: its name, and the URL a store connects with.
    public struct Database: Sendable {
        public let name: String
        public let url: String
    }

    private static let started = Mutex<Result<Server, Failure>?>(nil)
    private static let databases = Mutex(0)

    /// The server, started on first use.
    public static func server() async throws -> Server {
        try await offThread { try startedServer() }
    }

    /// Runs `body` with a new, empty database of its own, dropped afterwards.
    public static func withDatabase<Result>(_ body: (Database) async throws -> Result) async throws -> Result {
        let database = try await offThread { try makeDatabase() }
        do {
            let result = try await body(database)
            await offThread { dropDatabase(database) }
            return result
        } catch {
            await offThread { dropDatabase(database) }
            throw error
        }
    }

    /// Runs `statement` in the database named `database` (one ``withDatabase(_:)`` made).
    public static func sql(_ statement: String, inDatabaseNamed database: String) async throws {
        try await offThread { try sql(statement, database: database, server: try startedServer()) }
    }

    /// Runs `work` on a thread of Dispatch's, not on one of the few the tests share: the server's
    /// programs take seconds to start, and a test waits on each one it runs.
    private static func offThread<Value: Sendable>(_ work: @escaping @Sendable () throws -> Value) async throws
        -> Value
    {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(with: Result { try work() }) }
        }
    }

    private static func offThread(_ work: @escaping @Sendable () -> Void) async {
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                work()
                continuation.resume()
            }
        }
    }

    /// The server, started by the first caller.
    private static func startedServer() throws -> Server {
        try started.withLock { started in
            if let started { return try started.get() }
            let result: Result<Server, Failure>
            do {
                result = .success(try start())
            } catch let failure as Failure {
                result = .failure(failure)
            } catch {
                result = .failure(Failure("could not start PostgreSQL for the tests: \(error)"))
            }
            started = result
            return try result.get()
        }
    }

    /// A new, empty database on the server, for one test.
    private static func makeDatabase() throws -> Database {
        let server = try startedServer()
        let number = databases.withLock { value -> Int in
            value += 1
            return value
        }
        let name = "haul_test_\(getpid())_\(number)"
        try sql("CREATE DATABASE \(name)", database: "postgres", server: server)
        let password = server.password.map {
            ":" + ($0.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? $0)
        }
        return Database(
            name: name,
            url: "postgresql://\(server.user)\(password ?? "")@\(server.host):\(server.port)/\(name)?sslmode=disable")
    }

    /// Drops a database ``makeDatabase()`` made, with whatever is still connected to it.
    private static func dropDatabase(_ database: Database) {
        guard let server = try? startedServer() else { return }
        try? sql("DROP DATABASE IF EXISTS \(database.name) WITH (FORCE)", database: "postgres", server: server)
    }

    /// Runs one SQL statement with `psql`, failing on any error.
    private static func sql(_ statement: String, database: String, server: Server) throws {
        var environment = ProcessInfo.processInfo.environment
        if let password = server.password { environment["PGPASSWORD"] = password }
        let output = try run(
            server.programs + "/psql",
            [
                "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", server.host, "-p", "\(server.port)", "-U", server.user,
                "-d", database, "-c", statement,
            ], environment: environment)
        guard output.status == 0 else {
            throw Failure("psql failed (\(output.status)) on \(statement): \(output.text)")
        }
    }

    // MARK: Starting

    private static func start() throws -> Server {
        if let url = ProcessInfo.processInfo.environment["HAUL_TEST_POSTGRES_URL"], !url.isEmpty {
            guard let parts = URLComponents(string: url), let host = parts.host, let user = parts.user else {
                throw Failure("HAUL_TEST_POSTGRES_URL is not a postgresql://USER@HOST:PORT URL")
            }
            return Server(
                host: host, port: parts.port ?? 5432, user: user, password: parts.password, programs: try programs())
        }
        // The control pipe is never written to: the server runs until this process ends.
        return try launch().server
    }

    /// Starts a server of its own in a new temporary folder. It runs until the returned control
    /// pipe (close-on-exec) is closed, or this process ends: then it stops and its folder goes.
    /// A line written to the pipe stops it (`stop`) or starts it again (`start`).
    private static func launch() throws -> (server: Server, control: Int32, folder: String) {
        let programs = try programs()
        let folder = try makeFolder()
        let asPostgres = geteuid() == 0
        // initdb refuses to run as root: the server runs as the postgres user the package made.
        if asPostgres {
            let owned = try run("/bin/chown", ["postgres:postgres", folder])
            guard owned.status == 0 else {
                throw Failure("cannot give \(folder) to the postgres user: \(owned.text)")
            }
        }
        func command(_ arguments: [String]) -> (String, [String]) {
            asPostgres
                ? ("/usr/sbin/runuser", ["-u", "postgres", "--"] + arguments)
                : (arguments[0], Array(arguments.dropFirst()))
        }
        let (initdb, initArguments) = command([
            programs + "/initdb", "-D", folder + "/data", "-U", "haul", "--auth=trust", "-E", "UTF8", "--no-sync",
            "--no-instructions",
        ])
        let initialized = try run(initdb, initArguments)
        guard initialized.status == 0 else {
            throw Failure("initdb failed (\(initialized.status)): \(initialized.text)")
        }
        let port = try freePort()
        // The shell starts the server, then reads its standard input, a pipe this process holds
        // open, for commands; at its end (this process ended or closed it), the server stops and
        // its folder goes.
        let script = """
            run() {
                "$1" -D "$2/data" -p "$3" -k "$2" -c listen_addresses=127.0.0.1 -c fsync=off \
                    -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 >> "$2/log" 2>&1 &
                server=$!
            }
            run "$1" "$2" "$3"
            while read command; do
                case "$command" in
                    stop) kill -INT $server; while [ -e "$2/data/postmaster.pid" ]; do sleep 0.1; done ;;
                    start) run "$1" "$2" "$3" ;;
                esac
            done
            kill -INT $server 2>/dev/null
            wait $server
            rm -rf "$2"
            """
        let (shell, shellArguments) = command([
            "/bin/sh", "-c", script, "sh", programs + "/postgres", folder, "\(port)",
        ])
        // The keeper: the child reads its end as standard input; this process holds the other,
        // never written, never closed, and kept from other children (close-on-exec).
        var keeper: [Int32] = [0, 0]
        guard pipe(&keeper) == 0 else { throw Failure("pipe: \(String(cString: strerror(errno)))") }
        for descriptor in keeper { _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC) }
        let child = try spawn(shell, shellArguments, input: keeper[0], output: folder + "/shell.log")
        close(keeper[0])
        let server = Server(host: "127.0.0.1", port: port, user: "haul", password: nil, programs: programs)
        do {
            try waitUntil(server, answers: true) {
                var status: Int32 = 0
                return waitpid(child, &status, WNOHANG) == 0
            }
        } catch {
            close(keeper[1])
            let log = (try? String(contentsOfFile: folder + "/log", encoding: .utf8)) ?? ""
            throw Failure("PostgreSQL did not start within 30 s: \(log)")
        }
        return (server, keeper[1], folder)
    }

    /// Waits at most 30 s until `server` answers (or no longer does), while `alive` says its
    /// process may still come up.
    private static func waitUntil(_ server: Server, answers: Bool, alive: () -> Bool = { true }) throws {
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            let ready = try run(server.programs + "/pg_isready", ["-q", "-h", server.host, "-p", "\(server.port)"])
            if (ready.status == 0) == answers { return }
            guard alive() else { break }
            usleep(100_000)
        }
        throw Failure("PostgreSQL on port \(server.port) did not \(answers ? "start" : "stop") within 30 s")
    }

    // MARK: A server of a test's own

    /// A server of one test's own, which the test stops and starts again (a database outage).
    public final class OwnServer: Sendable {
        /// The database the test uses, on this server.
        public let database: Database
        let server: Server
        let control: Int32
        /// The server's folder, with its log.
        let folder: String

        init(server: Server, control: Int32, folder: String, database: Database) {
            self.server = server
            self.control = control
            self.folder = folder
            self.database = database
        }

        /// Stops the server (a fast shutdown: every session is ended) and returns once it no
        /// longer answers.
        public func stop() async throws { try await command("stop", answering: false) }

        /// Starts the server again and returns once it answers.
        public func start() async throws { try await command("start", answering: true) }

        private func command(_ line: String, answering: Bool) async throws {
            let (control, server, folder) = (self.control, self.server, self.folder)
            try await PostgreSQLTestServer.offThread {
                let bytes = Array((line + "\n").utf8)
                guard write(control, bytes, bytes.count) == bytes.count else {
                    throw Failure("cannot tell the test's PostgreSQL to \(line)")
                }
                do {
                    try PostgreSQLTestServer.waitUntil(server, answers: answering)
                } catch {
                    let log = (try? String(contentsOfFile: folder + "/log", encoding: .utf8)) ?? ""
                    throw Failure("\(error): \(log.suffix(2000))")
                }
            }
        }
    }

    /// Runs `body` with a PostgreSQL server of its own, which it may stop and start again, and an
    /// empty database on it; the server stops and its folder goes when `body` returns.
    public static func withOwnServer<Result>(_ body: (OwnServer) async throws -> Result) async throws -> Result {
        let own = try await offThread { () throws -> OwnServer in
            let (server, control, folder) = try launch()
            do {
                try sql("CREATE DATABASE haul_test", database: "postgres", server: server)
            } catch {
                close(control)
                throw error
            }
            let url = "postgresql://\(server.user)@\(server.host):\(server.port)/haul_test?sslmode=disable"
            return OwnServer(
                server: server, control: control, folder: folder, database: Database(name: "haul_test", url: url))
        }
        defer { close(own.control) }
        return try await body(own)
    }

    /// The folder of the PostgreSQL server's programs: the newest `/usr/lib/postgresql/N/bin`
    /// (Debian's), else the one `pg_config` names.
    private static func programs() throws -> String {
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [])
            .compactMap(Int.init).sorted()
        for version in versions.reversed()
        where FileManager.default.isExecutableFile(atPath: "\(root)/\(version)/bin/initdb") {
            return "\(root)/\(version)/bin"
        }
        if let found = try? run("/usr/bin/env", ["pg_config", "--bindir"]), found.status == 0 {
            let folder = found.text.trimmingCharacters(in: .whitespacesAndNewlines)
            if FileManager.default.isExecutableFile(atPath: folder + "/initdb") { return folder }
        }
        throw Failure(
            "PostgreSQL's server is not installed, and the PostgreSQL store's tests need one: "
                + "install it (apt-get install postgresql) or set HAUL_TEST_POSTGRES_URL to a server's URL")
    }

    private static func makeFolder() throws -> String {
        var template = Array((NSTemporaryDirectory() + "/haul-postgresql-XXXXXX").utf8CString)
        guard let made = mkdtemp(&template) else { throw Failure("mkdtemp failed: \(errno)") }
        let folder = String(cString: made)
        chmod(folder, 0o755)
        return folder
    }

    /// A TCP port nothing listens on now, on loopback.
    private static func freePort() throws -> Int {
        #if canImport(Glibc)
            let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let socket = Darwin.socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard socket >= 0 else { throw Failure("socket failed: \(errno)") }
        defer { close(socket) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(socket, pointer, length) == 0 && getsockname(socket, pointer, &length) == 0
            }
        }
        guard bound else { throw Failure("bind failed: \(errno)") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// Runs a program to its end (at most 60 s) and returns its exit status and what it printed.
    private static func run(_ program: String, _ arguments: [String], environment: [String: String]? = nil) throws
        -> (status: Int32, text: String)
    {
        let output = NSTemporaryDirectory() + "/haul-postgresql-\(getpid())-\(UInt64.random(in: 0...UInt64.max)).out"
        defer { unlink(output) }
        let child = try spawn(program, arguments, output: output, environment: environment)
        var status: Int32 = 0
        let deadline = Date().addingTimeInterval(60)
        while waitpid(child, &status, WNOHANG) == 0 {
            if Date() > deadline {
                kill(child, SIGKILL)
                waitpid(child, &status, 0)
                break
            }
            usleep(5_000)
        }
        let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        // The exit code, as a shell gives it.
        let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        return (code, text)
    }

    /// Starts `program` with `input` as its standard input (`/dev/null` when none) and its output
    /// and errors into the file `output`, and no other descriptor of this process: a server that
    /// kept one (another test's pipe) would hold it open for the whole run, and whoever waits for
    /// that pipe's end would wait forever. Spawned directly rather than through Foundation's
    /// `Process`, whose handling of descriptors in this process is not something every test's
    /// sockets should depend on.
    private static func spawn(
        _ program: String, _ arguments: [String], input: Int32? = nil, output: String,
        environment: [String: String]? = nil
    ) throws -> pid_t {
        let variables = (environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" }
        // A structure on Linux, an opaque pointer on Apple platforms.
        #if canImport(Glibc) || canImport(Musl)
            var actions = posix_spawn_file_actions_t()
        #else
            var actions: posix_spawn_file_actions_t? = nil
        #endif
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if let input {
            posix_spawn_file_actions_adddup2(&actions, input, 0)
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        #if canImport(Glibc) || canImport(Musl)
            var attributes = posix_spawnattr_t()
        #else
            var attributes: posix_spawnattr_t? = nil
        #endif
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var flags: Int16 = 0
        let closing = haul_spawn_standard_descriptors_only(&actions, &flags)
        guard closing == 0 else { throw Failure("cannot start \(program): \(String(cString: strerror(closing)))") }
        posix_spawnattr_setflags(&attributes, flags)
        var child: pid_t = 0
        let result = withCStrings([program] + arguments) { argv in
            withCStrings(variables) { envp in posix_spawn(&child, program, &actions, &attributes, argv, envp) }
        }
        guard result == 0 else { throw Failure("cannot start \(program): \(String(cString: strerror(result)))") }
        return child
    }

    /// `strings` as a C array of C strings, ending with a null pointer.
    private static func withCStrings<Result>(
        _ strings: [String], _ body: ([UnsafeMutablePointer<CChar>?]) -> Result
    ) -> Result {
        let pointers = strings.map { strdup($0) } + [nil]
        defer { for pointer in pointers { free(pointer) } }
        return body(pointers)
    }
}
