import ArgumentParser
import Dispatch
import Haul
import HaulDaemon

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// What to download and where: URLs or an input file, names, headers, checksum, priority.
struct RequestOptions: ParsableArguments {
    @Argument(help: "The http or https URLs to download.")
    var urls: [String] = []

    @Option(
        name: [.customShort("i"), .customLong("input-file")],
        help: ArgumentHelp(
            "Download the URLs listed in this file ('-' for standard input): one per line, with optional "
                + "indented out=, dir=, checksum=, header=, secret-header=, user=, limit-rate=, mirror= lines after each.",
            valueName: "file"))
    var inputFile: String?

    @Option(name: [.customShort("o"), .long], help: "Write to this file (one URL only).")
    var output: String?

    @Option(name: [.customShort("d"), .long], help: "Directory for the files (default: the current directory).")
    var directory: String?

    @Option(name: [.customShort("H"), .customLong("header")], help: "Extra request header 'Name: value'; repeatable.")
    var headers: [String] = []

    @OptionGroup var secrets: SecretHeaderOptions

    @Option(
        help: ArgumentHelp(
            "The checksum the file must have, as ALG=HEX (sha-256, sha-512; sha-1 and md5 for legacy mirrors).",
            valueName: "alg=hex"
        )
    )
    var checksum: String?

    @Option(
        name: .customLong("mirror"),
        help: ArgumentHelp(
            "Another URL of the same file (one URL only); repeatable. With --checksum, or when every server sends "
                + "the same Repr-Digest, ranges come from all of them; otherwise they are tried in turn, never mixed.",
            valueName: "url"))
    var mirrors: [String] = []

    @Option(
        help: ArgumentHelp(
            "A short text of yours shown beside the downloads (haul ls, the daemon's page).", valueName: "text"))
    var label: String?

    @Option(help: ArgumentHelp("Queue priority: low, normal, high or a number.", valueName: "priority"))
    var priority: String = "normal"

    @Flag(help: "Replace an existing file at the destination once the new download is complete.")
    var force = false

    func validate() throws {
        if urls.isEmpty && inputFile == nil { throw ValidationError("give at least one URL, or -i FILE") }
        if output == "-" { throw ValidationError("writing to standard output is not supported; use -o FILE") }
        if output?.isEmpty == true { throw ValidationError("-o needs a file name") }
        if output != nil && (urls.count != 1 || inputFile != nil) {
            throw ValidationError("-o names one file; with several URLs use -d DIR (or out= lines in an input file)")
        }
        if checksum != nil && (urls.count != 1 || inputFile != nil) {
            throw ValidationError("--checksum applies to one URL; in an input file use a checksum= line per URL")
        }
        if !mirrors.isEmpty && (urls.count != 1 || inputFile != nil) {
            throw ValidationError("--mirror names another URL of one file; in an input file use mirror= lines per URL")
        }
        if let output, output.hasPrefix("/"), directory != nil {
            throw ValidationError("-d cannot be combined with an absolute -o path; give one or the other")
        }
        try secrets.validate(headers: parseHeaders(headers), more: inputFile != nil)
        _ = try parsedChecksum()
        _ = try parsedPriority()
    }

    func parsedPriority() throws -> DownloadPriority {
        switch priority {
        case "low": return .low
        case "normal": return .normal
        case "high": return .high
        default:
            guard let value = Int(priority) else {
                throw ValidationError("--priority must be low, normal, high or a number, not '\(priority)'")
            }
            return DownloadPriority(value)
        }
    }

    func parsedChecksum() throws -> Checksum? {
        guard let checksum else { return nil }
        do {
            return try Checksum(parsing: checksum)
        } catch let error as HaulError {
            throw ValidationError(error.message)
        }
    }

    static func destination(output: String?, directory: String?) -> DownloadRequest.Destination {
        switch (output, directory) {
        case (let output?, let directory?) where !output.hasPrefix("/"): .file(directory + "/" + output)
        case (let output?, _): .file(output)
        case (nil, let directory?): .directory(directory)
        case (nil, nil): .directory(".")
        }
    }

    /// The requests as a queue takes them: paths made absolute here (a haul daemon takes relative
    /// ones from its download root), with `connections` each; never empty.
    func queueRequests(_ transfer: TransferOptions, connections: Int?) throws -> [DownloadRequest] {
        let requests = try queueList(transfer, connections: connections).all()
        guard !requests.isEmpty else { throw noURL }
        return requests
    }

    /// ``queueRequests(_:connections:)`` as a list read a chunk at a time: those of the command
    /// line, then those of the input file (possibly none: the queue's answer tells).
    func queueList(_ transfer: TransferOptions, connections: Int?) throws -> DownloadRequestList {
        let rate = transfer.perDownloadRate
        let commandLine = try commandLineRequests(bytesPerSecondLimit: rate)
        let input = try inputList(bytesPerSecondLimit: rate)
        return DownloadRequestList { chunk in
            /// The requests as a queue takes them: paths absolute, `connections` each.
            @Sendable func queued(_ requests: [DownloadRequest], _ paths: inout AbsolutePaths) -> [DownloadRequest] {
                requests.map { request in
                    var request = request
                    switch request.destination {
                    case .file(let path): request.destination = .file(paths.absolute(path))
                    case .directory(let path): request.destination = .directory(paths.absolute(path))
                    }
                    request.connections = connections
                    return request
                }
            }
            var paths = AbsolutePaths()
            if !commandLine.isEmpty { try chunk(queued(commandLine, &paths)) }
            guard let input else { return }
            // The next chunks are read while the queue takes one.
            try readingAhead(
                { next in
                    var paths = AbsolutePaths()
                    try input.read(by: 2_000) { try next(queued($0, &paths)) }
                }, consume: chunk)
        }
    }

    /// The error for a command whose input lists no URL.
    var noURL: HaulError { HaulError(.invalidArgument, "\(inputFile ?? "the input") lists no URL") }

    /// The requests of the command line's URLs.
    private func commandLineRequests(bytesPerSecondLimit rate: Int64?) throws -> [DownloadRequest] {
        let common = try parseHeaders(headers)
        return urls.map { url in
            var request = DownloadRequest(
                url: url, destination: Self.destination(output: output, directory: directory), headers: common,
                overwrite: force, checksum: try? parsedChecksum(), bytesPerSecondLimit: rate, mirrors: mirrors,
                label: label)
            request.secretHeaders = secrets.names
            return request
        }
    }

    /// The input file, opened, its requests starting from the command line's options.
    private func inputList(bytesPerSecondLimit rate: Int64?) throws -> InputFile? {
        guard let inputFile else { return nil }
        var base = DownloadRequest(
            url: "", destination: .directory("."), headers: try parseHeaders(headers), overwrite: force,
            bytesPerSecondLimit: rate, label: label)
        base.secretHeaders = secrets.names
        return try InputFile(path: inputFile, base: base, directory: directory)
    }

    /// Says once that an MD5 or SHA-1 checksum catches corruption but not forgery.
    func noteWeakChecksum(quiet: Bool) {
        if let expected = try? parsedChecksum(), expected.algorithm.isWeak, !quiet {
            Output.standardError(
                "haul: note: \(expected.algorithm.rawValue) is weak: it catches corruption, not a deliberate forgery\n")
        }
    }
}

struct Get: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "get",
        abstract: "Download URLs to files, resuming any earlier partial download of them.",
        discussion: """
            Without -o, each file is named after the server's Content-Disposition, else the URL's last path \
            segment, else index.html, always inside the target directory. An existing file is never replaced \
            unless --force is given. Every download is recorded in the state directory: `haul ls` lists them \
            and `haul resume` continues those a killed or interrupted run left unfinished. When a haul daemon \
            runs on the state directory, it runs the downloads and this command follows them (Ctrl-C leaves \
            them running there); --no-daemon downloads in this process instead.
            """
    )

    @OptionGroup var request: RequestOptions
    @OptionGroup var access: CredentialOptions
    @OptionGroup var transfer: TransferOptions
    @OptionGroup var state: StateOptions
    @OptionGroup var display: OutputOptions
    @OptionGroup var daemon: DaemonUseOptions

    func validate() throws { try access.validate(headers: parseHeaders(request.headers)) }

    func run() async throws {
        let request = self.request
        let transfer = self.transfer
        let access = self.access
        let quiet = display.quiet || display.json
        let netrc = try await reportingErrors { try access.netrcEntries() }
        let jar = try await reportingErrors { try access.cookieJar() }
        /// The requests with the credentials each URL's site gets and the cookie jar.
        @Sendable func authorized(_ requests: [DownloadRequest]) -> [DownloadRequest] {
            requests.map { request in
                var request = request
                // -u wins over credentials written into the URL, which win over a netrc file's.
                if access.user != nil || !request.headers.contains(where: { $0.name.lowercased() == "authorization" }) {
                    request.credentials = access.credentials(for: request.url, netrc: netrc)
                }
                request.cookies = jar
                return request
            }
        }
        try await runInQueue(state, transfer, display, daemon, perDownload: true, refusing: access.daemonRefusals) {
            session in
            let requests = authorized(try request.queueRequests(transfer, connections: session.connections(transfer)))
            request.noteWeakChecksum(quiet: quiet)
            session.queued.add(try await session.queue.add(requests, priority: try request.parsedPriority()))
        } finishing: {
            try access.save(jar)
        }
    }
}

struct Add: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "add",
        abstract: "Queue downloads without starting them; `haul resume` runs them.",
        discussion: "Prints the ID of each download, one per line.")

    @OptionGroup var request: RequestOptions
    @OptionGroup var state: StateOptions

    func run() async throws {
        let transfer = TransferOptions.defaults
        let ids = try await withQueue(state) { queue in
            request.noteWeakChecksum(quiet: false)
            // A long list is read a chunk at a time, so that it is never held whole.
            let ids = try await queue.enqueue(
                try request.queueList(transfer, connections: nil), priority: try request.parsedPriority())
            guard !ids.isEmpty else { throw request.noURL }
            return ids
        }
        Output.standardOutput(ids.map { "\($0)\n" }.joined())
    }
}

/// Paths made absolute against the current directory, read once: a list of a million files into
/// one directory asks for it once, not once a file.
struct AbsolutePaths {
    private var directories: [String: String] = [:]

    /// `path` from the root, with no `.` or `..` component.
    mutating func absolute(_ path: String) -> String {
        if POSIX.isNormalAbsolutePath(path) { return path }
        let (directory, name) = POSIX.splitAtLastSlash(path) ?? (".", path)
        guard name != "..", name != "." else { return POSIX.absolutePath(path) }
        let base = directories[directory] ?? POSIX.absolutePath(directory.isEmpty ? "/" : directory)
        if directories.count < 64 { directories[directory] = base }
        return name.isEmpty ? base : (base == "/" ? "/" : base + "/") + name
    }
}

extension StringProtocol {
    func trimmingCharacters(in set: String) -> String {
        var slice = Substring(self)
        while let first = slice.first, set.contains(first) { slice.removeFirst() }
        while let last = slice.last, set.contains(last) { slice.removeLast() }
        return String(slice)
    }
}
