/// The one error type Haul throws.
///
/// `code` is stable across releases and safe to switch over; `message` is a one-line explanation meant
/// for people; `underlying` keeps the error that caused it, when there is one.
public struct HaulError: Error, Sendable, CustomStringConvertible {
    /// A stable identifier for the kind of failure.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// The code's stable name, e.g. `"remoteChanged"`.
        public let name: String

        /// Codes are made here, and read back by name from the download manager's database (and
        /// from a daemon's answers).
        package init(_ name: String) { self.name = name }

        /// The code's name.
        public var description: String { name }

        /// The URL could not be parsed or has no host.
        public static let invalidURL = Code("invalidURL")
        /// The URL (or a redirect target) uses a scheme other than http or https.
        public static let unsupportedScheme = Code("unsupportedScheme")
        /// The server answered with an error status that is not worth retrying.
        public static let httpStatus = Code("httpStatus")
        /// The server broke the protocol in a way a retry cannot fix.
        public static let protocolViolation = Code("protocolViolation")
        /// The remote file kept changing while it was being fetched.
        public static let remoteChanged = Code("remoteChanged")
        /// Too many redirects, a redirect loop, or a refused redirect (https to http).
        public static let redirectRefused = Code("redirectRefused")
        /// The network failed and the retries ran out.
        public static let network = Code("network")
        /// No byte arrived for the configured stall time and the retries ran out.
        public static let timedOut = Code("timedOut")
        /// The TLS handshake or certificate check failed.
        public static let tls = Code("tls")
        /// The destination volume lacks the space for the remaining bytes.
        public static let insufficientSpace = Code("insufficientSpace")
        /// The disk filled up while writing; the partial file is kept and can be resumed.
        public static let diskFull = Code("diskFull")
        /// Reading or writing a local file failed (permissions, missing directory, I/O error).
        public static let fileSystem = Code("fileSystem")
        /// Another process is downloading to the same destination.
        public static let locked = Code("locked")
        /// A destination outside the download roots, or reached through a symbolic link beneath one
        /// (see ``DownloaderConfiguration/downloadRoots``); a haul daemon also refuses its state
        /// directory and hidden files and directories with it.
        public static let outsideDownloadRoot = Code("outsideDownloadRoot")
        /// The destination already exists and overwriting was not allowed.
        public static let destinationExists = Code("destinationExists")
        /// The partial file's manifest could not be read; it was not trusted.
        public static let manifestCorrupt = Code("manifestCorrupt")
        /// The complete file does not have the expected checksum; it is kept under its partial name.
        public static let checksumMismatch = Code("checksumMismatch")
        /// The download was cancelled; its partial data is kept for a later resume.
        public static let cancelled = Code("cancelled")
        /// An option given by the caller is not valid.
        public static let invalidArgument = Code("invalidArgument")
        /// No download with this ID is known to the download manager.
        public static let unknownDownload = Code("unknownDownload")
        /// The download is not in a state that allows the operation (resuming a completed one…).
        public static let invalidState = Code("invalidState")
        /// The state database could not be opened, read or written.
        public static let database = Code("database")
    }

    /// What kind of failure this is; stable across releases.
    public let code: Code
    /// A one-line, human-readable explanation.
    public let message: String
    /// The HTTP status, for `httpStatus` errors and retried statuses.
    public let status: Int?
    /// The error that caused this one, if any.
    public let underlying: (any Error)?
    /// The download the error is about, when it is another than the one asked for: for
    /// ``Code/destinationExists``, the download that already has the destination.
    public let downloadID: DownloadID?

    /// An error with `code` and a one-line `message`; `status`, `underlying` and `downloadID` when
    /// they apply.
    public init(
        _ code: Code, _ message: String, status: Int? = nil, underlying: (any Error)? = nil,
        downloadID: DownloadID? = nil
    ) {
        self.code = code
        self.message = message
        self.status = status
        self.underlying = underlying
        self.downloadID = downloadID
    }

    /// The message.
    public var description: String { message }
}

extension HaulError {
    /// `error` itself when it is a ``HaulError``, else a file-system error that carries it.
    package static func wrapping(_ error: any Error) -> HaulError {
        error as? HaulError ?? HaulError(.fileSystem, "\(error)", underlying: error)
    }
}
