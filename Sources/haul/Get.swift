import ArgumentParser
import Dispatch
import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

struct Get: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Download a URL to a file, resuming any earlier partial download of it.",
        discussion: """
            Without -o, the file is named after the server's Content-Disposition, else the URL's last path \
            segment, else index.html, always inside the target directory. An existing file is never replaced \
            unless --force is given.
            """
    )

    @Argument(help: "The http or https URL to download.")
    var url: String

    @Option(name: [.customShort("o"), .long], help: "Write to this file.")
    var output: String?

    @Option(name: [.customShort("d"), .long], help: "Directory for the file (default: the current directory).")
    var directory: String?

    @Option(name: [.customShort("H"), .customLong("header")], help: "Extra request header 'Name: value'; repeatable.")
    var headers: [String] = []

    @Option(
        help: ArgumentHelp(
            "The checksum the file must have, as ALG=HEX (sha-256, sha-512; sha-1 and md5 for legacy mirrors).",
            valueName: "alg=hex"
        )
    )
    var checksum: String?

    @Option(
        help: ArgumentHelp("The most bytes per second to receive, e.g. 500k or 2M (powers of 1024).", valueName: "rate")
    )
    var limitRate: String?

    @Option(help: "Failed attempts in a row to retry before giving up.")
    var retries: Int = 10

    @Option(help: "Seconds before the first retry; each further failure doubles it (up to 60 s).")
    var retryDelay: Double = 1

    @Option(help: "Seconds without a byte before a connection counts as stalled and is retried.")
    var stallTimeout: Double = 30

    @Option(help: "Seconds allowed to connect.")
    var connectTimeout: Double = 15

    @Option(help: .hidden)
    var durableCheckpointInterval: Double = 5

    @Flag(help: "Replace an existing file at the destination once the new download is complete.")
    var force = false

    @Flag(help: "Resume even when the server gives no ETag or Last-Modified to check the partial file against.")
    var trustUnvalidated = false

    @Flag(help: "Follow redirects from https to http.")
    var allowInsecureRedirects = false

    @Flag(name: [.customShort("q"), .long], help: "Print nothing but errors.")
    var quiet = false

    @Flag(help: "Print one JSON event per line on standard output.")
    var json = false

    func validate() throws {
        if output == "-" { throw ValidationError("writing to standard output is not supported; use -o FILE") }
        if output?.isEmpty == true { throw ValidationError("-o needs a file name") }
        if let output, output.hasPrefix("/"), directory != nil {
            throw ValidationError("-d cannot be combined with an absolute -o path; give one or the other")
        }
        if quiet && json {
            throw ValidationError("--quiet and --json cannot be combined; --json prints only JSON events")
        }
        guard retries >= 0 else { throw ValidationError("--retries must be 0 or more") }
        guard retryDelay >= 0 else { throw ValidationError("--retry-delay must be 0 or more") }
        guard stallTimeout > 0, connectTimeout > 0 else { throw ValidationError("timeouts must be greater than 0") }
        guard durableCheckpointInterval > 0 else { throw ValidationError("intervals must be greater than 0") }
        _ = try parsedHeaders()
        _ = try parsedChecksum()
        _ = try parsedRate()
    }

    func parsedRate() throws -> Int64? {
        guard let limitRate else { return nil }
        do {
            return try ByteRate.parse(limitRate)
        } catch let error as HaulError {
            throw ValidationError(error.message)
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

    func parsedHeaders() throws -> [(name: String, value: String)] {
        try headers.map { header in
            guard let colon = header.firstIndex(of: ":") else {
                throw ValidationError("header '\(header)' must look like 'Name: value'")
            }
            let name = header[..<colon].trimmingCharacters(in: " \t")
            let value = header[header.index(after: colon)...].trimmingCharacters(in: " \t")
            guard !name.isEmpty else { throw ValidationError("header '\(header)' has no name") }
            return (name, value)
        }
    }

    func destination() -> DownloadRequest.Destination {
        switch (output, directory) {
        case (let output?, let directory?) where !output.hasPrefix("/"): .file(directory + "/" + output)
        case (let output?, _): .file(output)
        case (nil, let directory?): .directory(directory)
        case (nil, nil): .directory(".")
        }
    }

    func run() async throws {
        var configuration = DownloaderConfiguration()
        configuration.retry.maximumRetries = retries
        configuration.retry.initialDelay = .milliseconds(Int64(retryDelay * 1000))
        configuration.timeouts.stall = .milliseconds(Int64(stallTimeout * 1000))
        configuration.timeouts.connect = .milliseconds(Int64(connectTimeout * 1000))
        configuration.trustUnvalidatedResume = trustUnvalidated
        configuration.redirects.allowHTTPSToHTTP = allowInsecureRedirects
        configuration.progressInterval = .milliseconds(100)
        configuration.storage.durableCheckpointInterval = .milliseconds(Int64(durableCheckpointInterval * 1000))

        let expected = try parsedChecksum()
        let request = DownloadRequest(
            url: url, destination: destination(), headers: try parsedHeaders(), overwrite: force, checksum: expected,
            bytesPerSecondLimit: try parsedRate()
        )
        let style: ProgressRenderer.Style =
            json ? .json : quiet ? .quiet : (isatty(STDERR_FILENO) != 0 ? .terminal : .lines)
        let renderer = ProgressRenderer(style: style, url: url)
        if let expected, expected.algorithm.isWeak, style != .quiet, style != .json {
            renderer.note("\(expected.algorithm.rawValue) is weak: it catches corruption, not a deliberate forgery")
        }
        let downloader = Downloader(configuration: configuration)
        let signals = SignalWatcher(signals: [SIGINT, SIGTERM])

        let outcome: Result<DownloadResult, any Error> = await withTaskGroup(
            of: Result<DownloadResult, any Error>?.self
        ) {
            group in
            group.addTask {
                do {
                    return .success(try await downloader.download(request, observing: renderer.handle))
                } catch {
                    return .failure(error)
                }
            }
            group.addTask {
                // Ends with nil when the download finishes first and this task is cancelled.
                await signals.next()
                return nil
            }
            var result: Result<DownloadResult, any Error>?
            while let next = await group.next() {
                if let next {
                    result = next
                    group.cancelAll()
                } else if result == nil {
                    // A signal: cancelling pauses the download, which checkpoints before it returns.
                    group.cancelAll()
                }
            }
            return result ?? .failure(CancellationError())
        }
        signals.stop()
        try? await downloader.shutdown()

        switch outcome {
        case .success(let result):
            renderer.finish(result)
        case .failure(let error as HaulError):
            renderer.fail(error)
            if error.code == .cancelled, signals.received == SIGTERM { throw ExitCode(ExitCodes.terminated) }
            throw ExitCode(ExitCodes.code(for: error.code))
        case .failure(let error):
            renderer.fail(HaulError(.fileSystem, "\(error)"))
            throw ExitCode(ExitCodes.unexpected)
        }
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
