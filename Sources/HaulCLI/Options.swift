import ArgumentParser
import Haul

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Where the download queue's state lives.
struct StateOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "Directory of the download database (default: $XDG_STATE_HOME/haul or ~/.local/state/haul).",
            valueName: "dir"))
    var stateDir: String?

    var directory: String { stateDir ?? DownloadManager.defaultStateDirectory }

    func validate() throws {
        if stateDir?.isEmpty == true { throw ValidationError("--state-dir needs a directory") }
    }
}

/// How transfers behave: retries, timeouts, limits.
struct TransferOptions: ParsableArguments {
    @Option(
        name: [.customShort("j"), .long],
        help: "Transfer at most this many files at once (one being flushed and renamed no longer counts).")
    var jobs: Int = 3

    @Option(
        name: [.customShort("x"), .long],
        help: ArgumentHelp(
            "Connections per file, from the start: a server that supports ranges sends parts of the file over "
                + "each at once (default: one, and up to \(Self.adaptiveConnections) while each added one speeds "
                + "the download up).", valueName: "n"))
    var connections: Int?

    /// The most connections a download opens when `-x` is not given.
    static let adaptiveConnections = 4

    @Option(
        help: ArgumentHelp(
            "The most connections open to one host at once, over all downloads and their connections; "
                + "over HTTP/2 it counts connections, not requests (curl --parallel-max-host). "
                + "A daemon with --queue counts every worker's requests in flight, and the connections each "
                + "keeps open a moment after.",
            valueName: "n"))
    var maxConnectionsPerHost: Int?

    @Option(help: ArgumentHelp("No part is split smaller than this, e.g. 1M.", valueName: "size"))
    var minSplitSize: String = "1M"

    @Option(
        help: ArgumentHelp(
            "The most bytes per second each download may receive, e.g. 500k or 2M (powers of 1024).",
            valueName: "rate"))
    var limitRate: String?

    @Option(
        help: ArgumentHelp("The most bytes per second all downloads together may receive.", valueName: "rate"))
    var totalLimitRate: String?

    @Option(help: "Failed attempts in a row to retry before giving up.")
    var retries: Int = 10

    @Flag(
        help:
            "Retry a connection the host refuses before it has answered (else the download fails at once, as curl's does)."
    )
    var retryConnrefused = false

    @Option(help: "Seconds before the first retry; each further failure doubles it (up to 60 s).")
    var retryDelay: Double = 1

    @Option(help: "Seconds without a byte before a connection counts as stalled and is retried.")
    var stallTimeout: Double = 30

    @Option(help: "Seconds allowed to connect.")
    var connectTimeout: Double = 15

    @Option(help: ArgumentHelp("Free space to leave on the destination's disk, e.g. 64M.", valueName: "size"))
    var keepFree: String = "64M"

    @Option(
        help: ArgumentHelp(
            "How to reserve disk space before writing: none, trunc (full length at once, several connections "
                + "only) or falloc (the file system reserves the space).",
            valueName: "mode"))
    var fileAllocation: String = DownloaderConfiguration.Storage().fileAllocation.rawValue

    @Option(help: .hidden)
    var durableCheckpointInterval: Double = 5

    @Flag(help: "Resume even when the server gives no ETag or Last-Modified to check the partial file against.")
    var trustUnvalidated = false

    @Flag(help: "Follow redirects from https to http.")
    var allowInsecureRedirects = false

    @Option(
        name: .customLong("ca-cert"),
        help: ArgumentHelp(
            "Also trust the certificate authorities in this PEM file for https (repeatable).", valueName: "file"))
    var caCertificates: [String] = []

    @Flag(name: .customLong("no-http2"), help: "Speak HTTP/1.1 even to servers that offer HTTP/2.")
    var noHTTP2 = false

    @Option(
        help: ArgumentHelp(
            "Use this proxy for every URL instead of the environment's (http://[user:password@]host:port, "
                + "socks5h://host:port; '' for none; curl -x, wget and aria2 --all-proxy).", valueName: "url"))
    var proxy: String?

    @Option(
        name: .customLong("no-proxy"),
        help: ArgumentHelp(
            "Hosts reached without a proxy, separated by commas, instead of no_proxy (curl --noproxy).",
            valueName: "hosts"))
    var noProxy: String?

    func validate() throws {
        guard jobs >= 1 else { throw ValidationError("--jobs must be 1 or more") }
        if let connections, !(1...DownloadRequest.maximumConnections).contains(connections) {
            throw ValidationError("--connections must be from 1 to \(DownloadRequest.maximumConnections)")
        }
        if let maxConnectionsPerHost, maxConnectionsPerHost < 1 {
            throw ValidationError("--max-connections-per-host must be 1 or more")
        }
        guard try Self.size(minSplitSize, option: "--min-split-size") >= 64 * 1024 else {
            throw ValidationError("--min-split-size must be at least 64k")
        }
        guard retries >= 0 else { throw ValidationError("--retries must be 0 or more") }
        guard retryDelay >= 0 else { throw ValidationError("--retry-delay must be 0 or more") }
        guard stallTimeout > 0, connectTimeout > 0 else { throw ValidationError("timeouts must be greater than 0") }
        guard durableCheckpointInterval > 0 else { throw ValidationError("intervals must be greater than 0") }
        _ = try Self.rate(limitRate, option: "--limit-rate")
        _ = try Self.rate(totalLimitRate, option: "--total-limit-rate")
        _ = try Self.size(keepFree, option: "--keep-free")
        for path in caCertificates {
            do {
                try DownloaderConfiguration.TLS.checkCertificateFile(path)
            } catch let error as HaulError {
                throw ValidationError("--ca-cert: \(error.message)")
            }
        }
        guard DownloaderConfiguration.FileAllocation(rawValue: fileAllocation) != nil else {
            let modes = DownloaderConfiguration.FileAllocation.allCases.map(\.rawValue).joined(separator: ", ")
            throw ValidationError("--file-allocation must be one of \(modes), not \"\(fileAllocation)\"")
        }
    }

    var perDownloadRate: Int64? { try? Self.rate(limitRate, option: "--limit-rate") }

    /// The options given that belong to the process that runs the queue, not to one download: a
    /// haul daemon runs its downloads with its own.
    var queueSettingsGiven: [String] {
        let defaults = Self.defaults
        let settings: [(String, Bool)] = [
            ("--jobs", jobs != defaults.jobs), ("--min-split-size", minSplitSize != defaults.minSplitSize),
            ("--max-connections-per-host", maxConnectionsPerHost != nil),
            ("--total-limit-rate", totalLimitRate != nil), ("--retries", retries != defaults.retries),
            ("--retry-delay", retryDelay != defaults.retryDelay), ("--retry-connrefused", retryConnrefused),
            ("--stall-timeout", stallTimeout != defaults.stallTimeout),
            ("--connect-timeout", connectTimeout != defaults.connectTimeout),
            ("--keep-free", keepFree != defaults.keepFree),
            ("--file-allocation", fileAllocation != defaults.fileAllocation),
            ("--durable-checkpoint-interval", durableCheckpointInterval != defaults.durableCheckpointInterval),
            ("--trust-unvalidated", trustUnvalidated), ("--allow-insecure-redirects", allowInsecureRedirects),
            ("--ca-cert", !caCertificates.isEmpty), ("--no-http2", noHTTP2), ("--proxy", proxy != nil),
            ("--no-proxy", noProxy != nil),
        ]
        return settings.filter(\.1).map(\.0)
    }

    static func rate(_ text: String?, option: String) throws -> Int64? {
        guard let text else { return nil }
        do {
            return try ByteRate.parse(text)
        } catch let error as HaulError {
            throw ValidationError("\(option): \(error.message)")
        }
    }

    /// A size such as `--keep-free`'s (0 allowed).
    static func size(_ text: String, option: String) throws -> Int64 {
        do {
            return try ByteCount.parse(text)
        } catch let error as HaulError {
            throw ValidationError("\(option): \(error.message)")
        }
    }

    /// The manager's settings.
    func managerConfiguration(restoring: DownloadManager.Configuration.RestoredDownloads)
        -> DownloadManager.Configuration
    {
        var configuration = DownloadManager.Configuration()
        configuration.maxConcurrentDownloads = jobs
        configuration.restoredDownloads = restoring
        configuration.bytesPerSecondLimit = try? Self.rate(totalLimitRate, option: "")
        configuration.freeSpaceMargin = (try? Self.size(keepFree, option: "")) ?? 0
        configuration.progressInterval = .milliseconds(100)
        return configuration
    }

    /// The transfers' settings.
    /// - Throws: ``HaulError/Code/invalidArgument`` for a proxy URL (option or environment) that is not one.
    func downloaderConfiguration() throws -> DownloaderConfiguration {
        var configuration = DownloaderConfiguration()
        configuration.retry.maximumRetries = retries
        configuration.retry.retriesRefusedConnections = retryConnrefused
        configuration.retry.initialDelay = .milliseconds(Int64(retryDelay * 1000))
        configuration.timeouts.stall = .milliseconds(Int64(stallTimeout * 1000))
        configuration.timeouts.connect = .milliseconds(Int64(connectTimeout * 1000))
        configuration.trustUnvalidatedResume = trustUnvalidated
        configuration.redirects.allowHTTPSToHTTP = allowInsecureRedirects
        configuration.storage.durableCheckpointInterval = .milliseconds(Int64(durableCheckpointInterval * 1000))
        configuration.segmentation.connections = connections ?? Self.adaptiveConnections
        configuration.segmentation.adaptive = connections == nil
        configuration.maxConnectionsPerHost = maxConnectionsPerHost
        configuration.storage.fileAllocation = DownloaderConfiguration.FileAllocation(rawValue: fileAllocation) ?? .none
        configuration.segmentation.minimumSplit = (try? Self.size(minSplitSize, option: "")) ?? (1 << 20)
        configuration.tls.trustedCertificateFiles = caCertificates
        configuration.tls.allowHTTP2 = !noHTTP2
        configuration.proxy = try ProxyEnvironment.settings(
            ProcessInfo.processInfo.environment, proxy: proxy, noProxy: noProxy)
        return configuration
    }
}

/// Whether `get`, `resume` and `retry` hand their downloads to a running haul daemon.
struct DaemonUseOptions: ParsableArguments {
    @Flag(
        help:
            "Download in this process even when a haul daemon runs on the state directory (otherwise the daemon runs the downloads and this command follows them)."
    )
    var noDaemon = false
}

/// How progress is shown.
struct OutputOptions: ParsableArguments {
    @Flag(name: [.customShort("q"), .long], help: "Print nothing but errors.")
    var quiet = false

    @Flag(help: "Print one JSON event per line on standard output.")
    var json = false

    @Flag(
        name: [.customShort("v"), .long],
        help:
            "Also print what each download does on the way: redirects, retries, restarts and why, connections added or leaving."
    )
    var verbose = false

    func validate() throws {
        if quiet && json {
            throw ValidationError("--quiet and --json cannot be combined; --json prints only JSON events")
        }
    }
}

/// Parses `Name: value` request headers.
func parseHeaders(_ headers: [String]) throws -> [(name: String, value: String)] {
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
