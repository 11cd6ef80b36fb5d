import AsyncHTTPClient
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Fetches every URL of a list with AsyncHTTPClient, `--jobs` at a time over kept-alive
/// connections, and writes each answer to a file named after the URL's last component: nothing
/// else Haul does (no queue, no partial-file lock, no resume, no events).
///
///     haul-ceiling LIST DIRECTORY [--durable | --batch] [--bare] [--jobs N] [--ca-cert FILE]
///
/// `--durable` makes each file durable before it counts as done, as Haul does: written under a
/// partial name, its data flushed (`fdatasync`, on a pool of 16 threads), renamed, and the directory
/// flushed once at the end. `--bare` fetches with ``BareFetch`` instead: HTTP/1.1 straight on
/// SwiftNIO, one server; with it `--batch` makes files durable in batches (one `syncfs` each).
@main
struct Ceiling {
    static func main() async throws {
        var arguments = Array(CommandLine.arguments.dropFirst())
        func option(_ name: String) -> String? {
            guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
            defer { arguments.removeSubrange(index...index + 1) }
            return arguments[index + 1]
        }
        func flag(_ name: String) -> Bool {
            defer { arguments.removeAll { $0 == name } }
            return arguments.contains(name)
        }
        let durable = flag("--durable")
        let batch = flag("--batch")
        let bare = flag("--bare")
        let jobs = option("--jobs").flatMap(Int.init) ?? 16
        let authority = option("--ca-cert")
        guard arguments.count == 2, !(durable && batch), bare || !batch else {
            complain("usage: haul-ceiling LIST DIRECTORY [--durable | --batch] [--bare] [--jobs N] [--ca-cert FILE]")
            exit(64)
        }
        let urls = try readLines(arguments[0])
        let directory = arguments[1]
        if bare {
            do {
                try BareFetch.run(
                    urls: urls, directory: directory, jobs: jobs,
                    durability: durable ? .eachFile : batch ? .batch : Durability.none, authority: authority)
            } catch {
                complain("haul-ceiling: \(error)")
                exit(1)
            }
            return
        }

        var configuration = HTTPClient.Configuration()
        configuration.connectionPool = .init(
            idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: jobs)
        if let authority {
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.trustRoots = .file(authority)
            configuration.tlsConfiguration = tls
        }
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        let flushes = NIOThreadPool(numberOfThreads: 16)
        flushes.start()
        let run = Run()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<jobs {
                group.addTask {
                    while run.failure.withLock({ $0 == nil }) {
                        let index = run.next.add(1, ordering: .relaxed).oldValue
                        guard index < urls.count else { return }
                        do {
                            try await fetch(
                                urls[index], into: directory, client: client, durable: durable ? flushes : nil)
                        } catch {
                            run.failure.withLock { $0 = $0 ?? "\(urls[index]): \(error)" }
                        }
                    }
                }
            }
        }
        if durable {
            let folder = open(directory, O_RDONLY | O_DIRECTORY)
            if folder < 0 || fsync(folder) != 0 { run.failure.withLock { $0 = $0 ?? "\(directory): cannot flush" } }
            close(folder)
        }
        try await client.shutdown()
        try await flushes.shutdownGracefully()
        if let message = run.failure.withLock({ $0 }) {
            complain("haul-ceiling: \(message)")
            exit(1)
        }
    }

    static func fetch(_ url: String, into directory: String, client: HTTPClient, durable: NIOThreadPool?) async throws {
        let response = try await client.execute(HTTPClientRequest(url: url), timeout: .seconds(30))
        guard response.status == .ok else { throw Failure("status \(response.status.code)") }
        let body = try await response.body.collect(upTo: 1 << 20)
        let name = directory + "/" + (url.split(separator: "/").last.map(String.init) ?? "index")
        let save: @Sendable () throws -> Void = {
            let path = durable == nil ? name : name + ".part"
            let file = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0o644)
            guard file >= 0 else { throw Failure("cannot create \(path)") }
            defer { close(file) }
            let written = body.withUnsafeReadableBytes { write(file, $0.baseAddress, $0.count) }
            guard written == body.readableBytes else { throw Failure("cannot write \(path)") }
            guard durable != nil else { return }
            guard fdatasync(file) == 0, rename(path, name) == 0 else { throw Failure("cannot finish \(name)") }
        }
        if let durable { try await durable.runIfActive(save) } else { try save() }
    }

    static func readLines(_ path: String) throws -> [String] {
        guard let file = fopen(path, "r") else { throw Failure("cannot read \(path)") }
        defer { fclose(file) }
        var lines: [String] = []
        var line: UnsafeMutablePointer<CChar>?
        var capacity = 0
        while getline(&line, &capacity, file) > 0, let line {
            let text = String(cString: line).trimmingCharacters(in: "\n")
            if !text.isEmpty { lines.append(text) }
        }
        free(line)
        return lines
    }
}

/// What the fetching tasks share: the next URL to take, and the first failure (which stops them).
final class Run: Sendable {
    let next = Atomic<Int>(0)
    let failure = Mutex<String?>(nil)
}

struct Failure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension String {
    fileprivate func trimmingCharacters(in set: String) -> String {
        var slice = Substring(self)
        while let last = slice.last, set.contains(last) { slice.removeLast() }
        return String(slice)
    }
}

/// Writes a line to standard error.
func complain(_ line: String) {
    let text = line + "\n"
    _ = text.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
}
