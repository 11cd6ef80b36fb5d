import ArgumentParser
import Foundation
import HaulTestServer

/// Downloads one file with the real `haul` binary while the server misbehaves at random and the
/// process is SIGKILLed at random moments, checking after every kill that the partial file holds
/// only correct bytes, and at the end that the file is exactly the expected version.
///
/// With `--mirrors N`, N more servers serve the same file (each with an ETag of its own) and haul
/// gets them with `--mirror` and the file's checksum, so it mixes their ranges; every server
/// misbehaves at random, and now and then a mirror starts serving another version of the same
/// length, which only the checksum at the end can catch. The partial file may then hold that
/// mirror's bytes for a while; what must hold is the end: the file is exactly the checksum's.
///
/// With `--files N`, haul downloads N small files from one input file instead (see `ManyFiles.swift`).
@main
struct Torture: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "haul-torture",
        abstract: "Kill haul at random moments against a misbehaving server; every outcome must be exact."
    )

    @Option(help: "Path of the haul binary.")
    var haul: String

    @Option(help: "How many times haul is killed before the final run.")
    var kills: Int = 10

    @Option(name: .customLong("size-mib"), help: "Size of the file, in MiB.")
    var sizeMiB: Int = 16

    @Option(help: "Connections per download (haul's -x).")
    var connections: Int = 1

    @Option(help: "Seed for the random choices, to replay a run.")
    var seed: UInt64 = UInt64(Date().timeIntervalSince1970)

    @Option(
        name: .customLong("mirrors"),
        help: "Other servers of the same file, given to haul with --mirror and the file's checksum.")
    var mirrorServers: Int = 0

    @Option(help: "Working directory (a temporary one by default).")
    var directory: String?

    @Option(
        help: ArgumentHelp(
            "Download this many small files (2 KiB to 64 KiB) with one 'haul get -i' instead of one large file.",
            discussion: "--size-mib, --connections and --mirrors do not apply."))
    var files: Int = 0

    @Option(name: .customLong("min-kill-ms"), help: "With --files: the earliest kill, in ms after haul starts.")
    var minimumKillDelay: Int = 20

    @Option(name: .customLong("max-kill-ms"), help: "With --files: the latest kill, in ms after haul starts.")
    var maximumKillDelay: Int = 400

    @Option(name: .customLong("final-limit"), help: "Seconds the final run may take before it counts as hung.")
    var finalRunLimit: Double = 600

    mutating func validate() throws {
        guard kills >= 1 else { throw ValidationError("--kills must be 1 or more") }
        guard files >= 0 else { throw ValidationError("--files must be 0 or more") }
        guard minimumKillDelay >= 0, maximumKillDelay >= minimumKillDelay else {
            throw ValidationError("--min-kill-ms must be 0 or more and at most --max-kill-ms")
        }
    }

    mutating func run() async throws {
        let options = self
        if files > 0 {
            print(try await Self.withServers(1, []) { servers in try await options.tortureMany(servers[0]) })
            return
        }
        let report = try await Self.withServers(1 + mirrorServers, []) { servers in try await options.torture(servers) }
        print(report)
    }

    /// Runs `body` with `count` test servers.
    static func withServers(
        _ count: Int, _ started: [HaulTestServer], _ body: @escaping @Sendable ([HaulTestServer]) async throws -> String
    ) async throws -> String {
        guard started.count < count else { return try await body(started) }
        return try await HaulTestServer.withRunning { server in
            try await withServers(count, started + [server], body)
        }
    }

    func torture(_ servers: [HaulTestServer]) async throws -> String {
        var random = SeededRandom(seed: seed)
        let size = Int64(sizeMiB) * 1024 * 1024
        let server = servers[0]
        for (index, each) in servers.enumerated() {
            var resource = TestResource(name: "torture", size: size)
            if index > 0 { resource.fixedEntityTag = "\"mirror-\(index)\"" }
            each.add("/file", resource)
        }
        let work = directory ?? NSTemporaryDirectory() + "haul-torture-\(seed)"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        let destination = work + "/file"
        removeDownload(destination)
        var arguments = [
            "get", server.url("/file"), "-o", destination, "-q", "--retries", "1000", "--retry-delay", "0.05",
            "--stall-timeout", "1", "-x", String(connections),
        ]
        let expected = TestResource(name: "torture", size: size)
        if mirrorServers > 0 {
            let digest = expected.sha256(0..<size).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
            arguments += ["--checksum", "sha-256=" + digest, "--no-daemon"]
            for mirror in servers.dropFirst() { arguments += ["--mirror", mirror.url("/file")] }
        }
        // Slow enough that a round moves a small part of the file, so kills land mid-transfer.
        let rate = Int(max(64 * 1024, size / Int64(kills * 2)))
        var applied: [String: Int] = [:]
        var completions = 0
        var versions = [1]

        for round in 1...kills {
            if random.next(in: 0...9) == 0 {
                if mirrorServers > 0 {
                    // A mirror starts serving another version of the same length (its own ETag
                    // stays): only the checksum at the end can tell.
                    let mirror = servers[random.next(in: 1...mirrorServers)]
                    mirror.update("/file") { $0.version += 1 }
                    applied["mirror version switch", default: 0] += 1
                } else {
                    // The file changes on the server between two runs.
                    let version = versions.last! + 1
                    versions.append(version)
                    server.update("/file") { $0.version = version }
                    applied["version switch", default: 0] += 1
                }
            }
            var steps: [(String, [Fault])] = []
            for _ in 0..<6 {
                let (name, fault) = randomFault(&random, within: Int64(rate / 2))
                steps.append((name, [fault, .throttle(bytesPerSecond: rate)]))
            }
            for each in servers {
                each.script("/file", steps.map(\.1))
                each.setStandingFaults("/file", [.throttle(bytesPerSecond: rate)])
            }
            let requestsBefore = server.requests.count

            let process = try launch(arguments)
            let deadline = Date().addingTimeInterval(Double(random.next(in: 100...1500)) / 1000)
            while process.isRunning && Date() < deadline { try await Task.sleep(for: .milliseconds(10)) }
            if process.isRunning {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
                if mirrorServers == 0 { try checkPartial(destination, versions: versions, round: round) }
            } else {
                guard process.terminationStatus == 0 else {
                    throw TortureFailure("round \(round): haul exited with \(process.terminationStatus)")
                }
                // Finished before the kill: the outcome must be exact, then start over.
                let version = mirrorServers > 0 ? expected : server.resource("/file")!
                guard try compare(destination, expected: version, length: size) else {
                    throw TortureFailure("round \(round): a completed file differs from the expected bytes")
                }
                completions += 1
                removeDownload(destination)
            }
            let used = min(steps.count, server.requests.count - requestsBefore)
            for (name, _) in steps.prefix(used) { applied[name, default: 0] += 1 }
        }

        for each in servers {
            each.script("/file", [])
            each.setStandingFaults("/file", [])
        }
        let log = work + "/final.log"
        let final = try launch(arguments.filter { $0 != "-q" } + ["-v"], log: log)
        try await finish(final, within: finalRunLimit, "the final run")
        guard final.terminationStatus == 0 else {
            throw TortureFailure(
                "the final run failed with exit code \(final.terminationStatus); its log is \(log)")
        }
        try? FileManager.default.removeItem(atPath: log)
        guard try compare(destination, expected: mirrorServers > 0 ? expected : server.resource("/file")!, length: size)
        else {
            throw TortureFailure("the final file differs from the expected bytes")
        }
        let names = try FileManager.default.contentsOfDirectory(atPath: work)
        guard names == ["file"] else { throw TortureFailure("left behind: \(names)") }
        try? FileManager.default.removeItem(atPath: work)

        let sent = servers.map(\.bodyBytesSent).reduce(0, +)
        let fetched = Double(sent) / Double(size * Int64(completions + 1))
        let faults = applied.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        return """
            haul-torture: seed \(seed), \(kills) kills, \(completions) completions before a kill, \
            \(servers.map(\.requests.count).reduce(0, +)) requests, file \(sizeMiB) MiB, \(connections) connection(s)\
            \(mirrorServers > 0 ? ", \(mirrorServers) mirrors and the file's checksum" : "")
            faults applied: \(faults)
            bytes sent: \(sent) = \(String(format: "%.2f", fetched))× the file size per completed file
            result: \(mirrorServers > 0 ? "every completed file was byte-identical to the checksum's version" : "every partial file held one version's exact bytes; every completed file was byte-identical")
            """
    }

    func removeDownload(_ destination: String) {
        for suffix in ["", ".haul.part", ".haul.json", ".haul.json.tmp"] {
            try? FileManager.default.removeItem(atPath: destination + suffix)
        }
    }

    func randomFault(_ random: inout SeededRandom, within limit: Int64) -> (String, Fault) {
        let offset = Int64(random.next(in: 1...Int(max(1, limit))))
        switch random.next(in: 0...5) {
        case 0: return ("reset", .closeAfter(bytes: offset))
        case 1: return ("stall", .stall(afterBytes: offset, seconds: 3))
        case 2: return ("short body", .shortBody(missing: offset))
        case 3: return ("503", .status(503, retryAfter: "0"))
        case 4: return ("ignored range", .ignoreRange)
        default: return ("none", .omitHeader("X-None"))
        }
    }

    /// Starts haul; its standard error goes to `log` and its standard output to `output` when given.
    func launch(_ arguments: [String], log: String? = nil, output: String? = nil) throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: haul)
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        if let log, FileManager.default.createFile(atPath: log, contents: nil),
            let handle = FileHandle(forWritingAtPath: log)
        {
            process.standardError = handle
        }
        if let output, FileManager.default.createFile(atPath: output, contents: nil),
            let handle = FileHandle(forWritingAtPath: output)
        {
            process.standardOutput = handle
        }
        try process.run()
        return process
    }

    /// Waits for `process` to end, at most `seconds`: past that it is killed and the run fails, so
    /// a haul that hangs never hangs the torture.
    func finish(_ process: Process, within seconds: Double, _ what: String) async throws {
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning && Date() < deadline { try await Task.sleep(for: .milliseconds(10)) }
        guard !process.isRunning else {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw TortureFailure("\(what) ran longer than \(Int(seconds)) s and was killed")
        }
        process.waitUntilExit()
    }

    /// After a kill, the partial file must hold exact bytes of one version of the file: a kill loses
    /// nothing written, nothing wrong is ever written, and two versions are never mixed.
    /// The bytes a resume would keep must all be one version's. With one recorded range the whole
    /// partial file is kept (its size is trusted on the boot that wrote it); with several, each range's
    /// recorded bytes are. A partial file without a manifest is not trusted (the next run discards it).
    func checkPartial(_ destination: String, versions: [Int], round: Int) throws {
        let path = destination + ".haul.part"
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
            let length = (attributes[.size] as? NSNumber)?.int64Value,
            let manifest = FileManager.default.contents(atPath: destination + ".haul.json"),
            let object = try? JSONSerialization.jsonObject(with: manifest) as? [String: Any],
            let segments = object["segments"] as? [[String: Any]]
        else { return }
        var ranges: [Range<Int64>] = [0..<length]
        if segments.count > 1 {
            ranges = segments.compactMap { segment in
                guard let start = (segment["start"] as? NSNumber)?.int64Value,
                    let written = (segment["written"] as? NSNumber)?.int64Value, written > 0,
                    start < length
                else { return nil }
                // A resume keeps no more than the file holds (a kill between cutting the file and
                // storing the manifest leaves a manifest that claims more).
                return start..<min(length, start + written)
            }
        }
        let size = Int64(sizeMiB) * 1024 * 1024
        for version in versions.reversed() {
            let resource = TestResource(name: "torture", size: size, version: version)
            if try ranges.allSatisfy({ try compare(path, expected: resource, range: $0) }) { return }
        }
        throw TortureFailure(
            "round \(round): the kept bytes of the partial file (\(length) bytes, \(ranges.count) ranges) "
                + "match no version of the file")
    }

    /// Whether `range` of the file at `path` holds the expected bytes.
    func compare(_ path: String, expected: TestResource, range: Range<Int64>) throws -> Bool {
        guard let handle = FileHandle(forReadingAtPath: path) else { return false }
        defer { try? handle.close() }
        try handle.seek(toOffset: UInt64(range.lowerBound))
        var offset = range.lowerBound
        while offset < range.upperBound {
            let count = Int(min(4 << 20, range.upperBound - offset))
            guard let data = try handle.read(upToCount: count), data.count == count else { return false }
            if [UInt8](data) != expected.bytes(offset..<offset + Int64(count)) { return false }
            offset += Int64(count)
        }
        return true
    }

    func compare(_ path: String, expected: TestResource, length: Int64) throws -> Bool {
        guard let handle = FileHandle(forReadingAtPath: path) else { return false }
        defer { try? handle.close() }
        var offset: Int64 = 0
        while offset < length {
            let count = Int(min(4 << 20, length - offset))
            guard let data = try handle.read(upToCount: count), data.count == count else { return false }
            if [UInt8](data) != expected.bytes(offset..<offset + Int64(count)) { return false }
            offset += Int64(count)
        }
        return try handle.readToEnd()?.isEmpty ?? true
    }
}

struct TortureFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A small deterministic generator (SplitMix64), so a failing run can be replayed with its seed.
struct SeededRandom {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func next(in range: ClosedRange<Int>) -> Int {
        range.lowerBound + Int(next() % UInt64(range.count))
    }
}
