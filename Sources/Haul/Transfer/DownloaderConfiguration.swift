/// How a ``Downloader`` behaves. Every value has a default that suits a command-line download.
public struct DownloaderConfiguration: Sendable {
    /// When and how often failed attempts are retried.
    public struct Retry: Sendable {
        /// Failed attempts in a row that are retried before giving up. An attempt that stored new
        /// bytes resets the count, so a long download over a flaky link keeps going.
        public var maximumRetries: Int = 10
        /// The first backoff delay; each further failure doubles it, up to `maximumDelay`.
        public var initialDelay: Duration = .seconds(1)
        /// The longest backoff delay.
        public var maximumDelay: Duration = .seconds(60)
        /// Spread each delay randomly over its upper half, so many clients do not retry in lockstep.
        public var jitter: Bool = true
        /// The longest `Retry-After` Haul waits for; a server asking for more fails the download.
        public var maximumRetryAfter: Duration = .seconds(600)
        /// Restarts from zero (the remote file changed, ranges were ignored…) allowed in one call.
        public var maximumRestarts: Int = 8
        /// Retry a connection the host refused before any answer came from it. Off, a download that
        /// has no bytes yet and has heard nothing from its servers fails at the first refusal, with
        /// its one-line error, as curl and wget do (nothing listens there: waiting minutes helps
        /// rarely). On (a queue that runs for hours, curl's `--retry-connrefused`), a refusal is
        /// retried like any network error. A download with bytes, or one that heard an answer,
        /// always retries.
        public var retriesRefusedConnections: Bool = true

        /// The defaults.
        public init() {}
    }

    /// How long to wait for a connection and for data.
    public struct Timeouts: Sendable {
        /// Time allowed to open a connection.
        public var connect: Duration = .seconds(15)
        /// Time without receiving a byte after which the connection is considered stalled and retried.
        public var stall: Duration = .seconds(30)

        /// The defaults.
        public init() {}
    }

    /// Which redirects are followed.
    public struct Redirects: Sendable {
        /// The most redirects followed for one request.
        public var maximum: Int = 20
        /// Follow a redirect from https to http. Off by default: it would expose the transfer.
        public var allowHTTPSToHTTP: Bool = false

        /// The defaults.
        public init() {}
    }

    /// How bytes reach the disk.
    public struct Storage: Sendable {
        /// Bytes from the network are gathered into writes of this size.
        public var blockSize: Int = 1 << 20
        /// How often the manifest records the written offset (survives a killed process).
        public var checkpointInterval: Duration = .seconds(1)
        /// How often data is flushed with `fdatasync` and recorded as durable (survives a power loss).
        /// Measured on loopback with a 4 GiB file: every 0.5 s costs up to 2×, every 2 s about 30 %,
        /// every 5 s or more is within run-to-run noise.
        public var durableCheckpointInterval: Duration = .seconds(5)
        /// Received bytes are written at least this often, even when a block is not full.
        public var flushInterval: Duration = .seconds(1)
        /// The size of the pieces whose hashes the manifest keeps, to find damaged data on resume.
        public var pieceSize: Int64 = Manifest.defaultPieceSize
        /// Room that must stay free on the destination's volume beyond the bytes a download still
        /// needs; when there is less, the download fails with ``HaulError/Code/insufficientSpace``
        /// before writing anything.
        public var freeSpaceMargin: Int64 = 0
        /// A download over one connection with at least this many bytes to go writes its full pages
        /// with direct I/O (`O_DIRECT`), from the network buffers to the disk without a copy into the
        /// page cache; what is left over at its ends goes through the page cache. `nil` turns direct
        /// I/O off. File systems without direct I/O fall back to ordinary writes by themselves.
        /// Measured with a 4 GiB file on loopback, the page-cache copy was the largest single cost of
        /// a one-connection download (see bench/README.md); small files skip it, since a
        /// direct write waits for the disk.
        public var directWriteMinimum: Int64? = 8 << 20
        /// How disk space is reserved for a download whose length is known, before it is written.
        /// Measured with a 4 GiB file on loopback (ext4): over 8 connections `fallocate` took 2.2 s
        /// against 3.0 s for `none` and 3.1 s for `truncate`, and left 35 extents instead of 512; over
        /// 4 connections 2.6 s against 2.9 s; over one connection it makes no difference.
        public var fileAllocation: FileAllocation = .fallocate

        /// The defaults.
        public init() {}
    }

    /// How disk space is reserved for a download before it is written.
    public enum FileAllocation: String, Sendable, CaseIterable {
        /// Nothing is reserved: the file grows as bytes arrive.
        case none
        /// A download over several connections sets the file to its full length at once (a sparse
        /// file: no space is reserved). A download over one connection keeps its file as long as
        /// its written bytes, so this does nothing there.
        case truncate = "trunc"
        /// The file system reserves the space (`fallocate`), so a full disk shows at the start and
        /// the file is laid out in few extents. A download over one connection reserves the space
        /// without changing the file's length. Where the file system cannot, nothing is reserved.
        case fallocate = "falloc"
    }

    /// Several connections per file.
    public struct Segmentation: Sendable {
        /// Connections per download. Above 1, the first request asks for `bytes=0-`; when the server
        /// answers `206` with the total length and a strong validator, the file is fetched in ranges
        /// over this many connections; otherwise one connection fetches it. The library's default is
        /// 1; the `haul` command ramps up to 4 (``adaptive``) unless told otherwise.
        public var connections: Int = 1
        /// No range is split into pieces smaller than this (ranges are cut on 64 KiB boundaries, so
        /// less than 64 KiB counts as 64 KiB).
        public var minimumSplit: Int64 = 1 << 20
        /// A range whose connection has received nothing for this long is taken over by an idle connection.
        public var stallTakeover: Duration = .seconds(3)
        /// Start with one connection and open more, up to ``connections``, only while they add
        /// throughput (where one connection is the bottleneck: a per-connection limit, a long or lossy
        /// path). `false` opens all of them as soon as the server shows it serves ranges.
        public var adaptive: Bool = false
        /// How long the rate is measured before and after adding connections.
        var rampWindow: Duration = .milliseconds(500)

        /// The defaults.
        public init() {}
    }

    /// How https connections are made.
    public struct TLS: Sendable {
        /// PEM files of certificate authorities to trust in addition to the system's, e.g. a
        /// company's own authority. A file that cannot be read fails the download with
        /// ``HaulError/Code/tls`` (``DownloaderConfiguration/TLS/checkCertificateFile(_:)`` checks one beforehand).
        public var trustedCertificateFiles: [String] = []
        /// Speak HTTP/2 with servers that offer it (by ALPN, over https). Connection `k` of every
        /// download to one host shares one HTTP/2 connection, so a download's connections are still
        /// separate TCP connections (under ``DownloaderConfiguration/maxConnectionsPerHost``,
        /// connection `k` modulo the cap). `false` keeps to HTTP/1.1.
        public var allowHTTP2: Bool = true

        /// The defaults.
        public init() {}
    }

    /// When failed attempts are retried.
    public var retry = Retry()
    /// How many connections one download uses.
    public var segmentation = Segmentation()
    /// How https connections are made.
    public var tls = TLS()
    /// About the most HTTP/1.1 connections open to one host at once over all downloads of a
    /// downloader, shared out evenly over the connections of a download (each has an HTTP client of
    /// its own); requests beyond it wait for a connection to be free (connections are kept alive and
    /// reused). `nil`: 8 for each connection of a download. The download manager sets it to its
    /// concurrent downloads times the connections per download. A request that asks for more
    /// connections than ``Segmentation/connections`` (``DownloadRequest/connections``) adds clients
    /// with the same share each, so the total may pass this limit by that share per added connection.
    /// Small files fetched whole in one answer (a long list of them from one server) go over
    /// HTTP/1.1 connections of their own, kept alive for the next such file: at most one share more.
    /// Left aside when ``maxConnectionsPerHost`` is set.
    public var connectionsPerHost: Int?
    /// The most connections open to one host (scheme, name and port) at once, over all downloads of
    /// a downloader and all their connections, as curl's `--parallel-max-host`; `nil` (the
    /// default): no cap beyond ``connectionsPerHost``. Less than 1 counts as 1.
    ///
    /// A request beyond the cap waits for a connection, first come first served, before it is sent:
    /// the wait is no stall (the stall timeout runs from when it is sent), and a paused or cancelled
    /// download leaves the line at once. The connections of a segmented download that find no room
    /// leave their ranges to the ones that have it, so the download runs with fewer rather than
    /// failing.
    ///
    /// - Over HTTP/1.1 a connection carries one request at a time, so the cap counts requests in
    ///   flight. They all go through one pool that opens no more connections to a host than the cap
    ///   and keeps them open for the next request: the connections left open between requests are
    ///   within the cap too.
    /// - Over HTTP/2 a connection carries many requests as streams, and the cap counts connections,
    ///   as curl's does: every request goes at once, connection `k` of a download over connection
    ///   `k` modulo the cap.
    /// - Which of the two a host speaks is known from its first answer (only https may be HTTP/2):
    ///   until then, one request goes to it at a time.
    /// - Through a proxy the cap counts the connections to the host the requests are for, not to
    ///   the proxy.
    public var maxConnectionsPerHost: Int?
    /// How long to wait for a connection and for data.
    public var timeouts = Timeouts()
    /// Which redirects are followed.
    public var redirects = Redirects()
    /// How bytes reach the disk.
    public var storage = Storage()
    /// Which proxy each request goes through (none by default). The library reads no environment
    /// variable: the caller decides (`haul` follows curl's `http_proxy`, `https_proxy`, `all_proxy`
    /// and `no_proxy`).
    public var proxy = ProxySettings()
    /// Directories downloads may write into; empty (the default): wherever their paths lead.
    ///
    /// With roots, a download's directory must lie inside one of them, and it is opened beneath that
    /// root when the download's files are opened, following no symbolic link below the root (on
    /// Linux `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, elsewhere one component at a
    /// time with `O_NOFOLLOW`); the partial file, the manifest and the final rename are then made by
    /// name in that open directory, which is checked once more right before the rename. A download
    /// that would leave its root fails with ``HaulError/Code/outsideDownloadRoot`` and writes
    /// nothing there. A root may itself be a symbolic link. `haul daemon --download-root` sets them.
    public var downloadRoots: [String] = []
    /// Sent as `User-Agent` unless the request sets its own.
    public var userAgent: String = "haul/\(HaulVersion.current)"
    /// Resume even when the server gave no validator (no ETag, no Last-Modified). Haul then only
    /// compares a few bytes before the resume point; a file changed in place could be spliced.
    public var trustUnvalidatedResume: Bool = false
    /// Bytes re-fetched before the resume point and compared with the disk when `If-Range` cannot be used.
    public var overlapCheckBytes: Int = 64 * 1024
    /// A limit shared by every download of this downloader (and of any other given the same limiter).
    public var sharedRateLimiter: RateLimiter?
    /// Asked before every checkpoint, every change of a partial file's size or name, and the final
    /// rename, and once more on an I/O thread right before a manifest replaces the last: a download
    /// stops with ``HaulError/Code/locked`` and writes nothing more once it says no (a fleet's
    /// worker whose lease on the queue may have run out). `nil`: always allowed.
    package var writePermit: (@Sendable () -> Bool)?
    /// Makes a finished file's data durable before its rename, in place of the platform's flush
    /// (``PartialFile/syncDataNow()``): a test holds a file here, in the middle of being finished.
    /// Each file is then flushed on its own, unless ``flushFinishedFileSystem`` is set too.
    var flushFinishedData: (@Sendable (PartialFile) throws -> Void)?
    /// Flushes a batch's file system in place of its files' own flushes, in place of the platform's
    /// (``FileFinisher/FileSystemFlush/platform``): a test counts them here. Unset, and with
    /// ``flushFinishedData`` set, each file is flushed on its own.
    var flushFinishedFileSystem: FileFinisher.FileSystemFlush?

    /// What a download stops with once ``writePermit`` says no.
    static let writeRefused = HaulError(
        .locked,
        "this worker's lease on the queue may have run out: it writes nothing more of this download, "
            + "which another worker takes over")
    /// Places on remote hosts shared with other downloaders (a fleet's workers, each under its own
    /// ``maxConnectionsPerHost`` counting every worker's connections): every request takes one
    /// before it is sent. `nil`: this downloader's own cap only.
    package var sharedHostSlots: (any SharedHostSlots)?
    /// The least time between two progress events.
    public var progressInterval: Duration = .milliseconds(200)
    /// Which networks downloads may use, and whether the system may put them off: passed to
    /// `URLSession` by the `HaulURLSession` module's transport on Apple platforms. Haul's own client,
    /// and `URLSession` on Linux, cannot tell an expensive or constrained network: there these have
    /// no effect.
    public var networkAccess = NetworkAccess()
    /// What sends the requests (see ``DownloadTransport``). `nil` (the default): Haul's own HTTP
    /// client on SwiftNIO, set up from this configuration (its TLS trust, proxies, timeouts and cap
    /// per host). A transport given here refuses the settings it cannot honour
    /// (``DownloadTransport/check(_:)``): each download then fails with that error.
    public var transport: (any DownloadTransport)?

    /// The defaults.
    public init() {}
}

/// Which networks a download may use, as an app states it for `URLSession` (see
/// ``DownloaderConfiguration/networkAccess``).
public struct NetworkAccess: Sendable, Equatable {
    /// Whether the download may use a network the system deems expensive (cellular, a personal
    /// hotspot): `URLRequest.allowsExpensiveNetworkAccess`.
    public var allowsExpensiveNetworkAccess = true
    /// Whether the download may use a network in Low Data Mode:
    /// `URLRequest.allowsConstrainedNetworkAccess`.
    public var allowsConstrainedNetworkAccess = true
    /// Whether the system may wait for a good moment (power, Wi-Fi) to transfer:
    /// `URLSessionConfiguration.isDiscretionary`.
    public var isDiscretionary = false

    /// Every network, at once.
    public init() {}
}

/// This build of Haul.
public enum HaulVersion {
    /// The version, e.g. for a `User-Agent`.
    public static let current = "0.1.0"
}
