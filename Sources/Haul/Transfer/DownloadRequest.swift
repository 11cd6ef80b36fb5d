/// What to download and where to put it.
public struct DownloadRequest: Sendable {
    /// Where the finished file goes.
    public enum Destination: Sendable, Equatable {
        /// Exactly this path.
        case file(String)
        /// A file in this directory, named by the server's `Content-Disposition`, else the URL's last
        /// path segment, else `index.html`; always sanitized so it stays inside the directory.
        case directory(String)
    }

    /// The http or https URL of the file.
    public var url: String
    /// Where the file goes.
    public var destination: Destination
    /// Extra request headers, e.g. `Authorization`. They are sent, never stored; `Authorization`
    /// and `Cookie` are dropped when a redirect leaves the origin.
    public var headers: [(name: String, value: String)]
    /// Replace an existing file at the destination once the new one is complete.
    public var overwrite: Bool
    /// The digest the complete file must have; checked before the file gets its final name.
    public var checksum: Checksum?
    /// The most bytes per second this download may receive (`nil`: no limit of its own).
    public var bytesPerSecondLimit: Int64?

    /// A request for `url` into `destination`; the rest has defaults (no extra headers, no overwriting, no checksum, no limit of its own).
    public init(
        url: String, destination: Destination, headers: [(name: String, value: String)] = [], overwrite: Bool = false,
        checksum: Checksum? = nil, bytesPerSecondLimit: Int64? = nil
    ) {
        self.url = url
        self.destination = destination
        self.headers = headers
        self.overwrite = overwrite
        self.checksum = checksum
        self.bytesPerSecondLimit = bytesPerSecondLimit
    }
}
