/// The directories of many downloads, each opened once: adding thousands of downloads into a few
/// directories, or bringing a window of them up to date with the disk, opens each directory once
/// rather than once a download (and a directory that cannot be opened is tried once). A look
/// lasts as long as one batch of downloads: a file created after it is not seen.
struct OpenFolders {
    /// How many directories are kept open at most; past it, the ones kept are let go.
    static let limit = 64
    /// A directory with at most this many names is listed once (see
    /// ``DirectoryHandle/listed(atMost:)``); a larger one is asked about each name.
    static let listingLimit = 4_096

    private let confinement: DownloadConfinement
    private let listing: Bool
    private var opened: [String: DirectoryHandle?] = [:]

    /// Opens directories as `confinement` allows, listing each when `listing` (for looks at many
    /// names in it; a look at one name costs less without).
    init(confinement: DownloadConfinement, listing: Bool = true) {
        self.confinement = confinement
        self.listing = listing
    }

    /// The files of the download into `destination`, in its directory opened once; `nil` when
    /// the directory cannot be opened (it does not exist yet, or lies outside the roots).
    mutating func paths(_ destination: String) -> DownloadPaths? {
        let (directory, name) = DownloadPaths.split(destination)
        if let folder = opened[directory] { return folder.map { DownloadPaths(in: $0, fileName: name) } }
        if opened.count >= Self.limit { opened.removeAll(keepingCapacity: true) }
        // Listed when small: most names looked at in it are not there yet.
        let handle = try? confinement.directory(directory)
        let folder = listing ? handle?.listed(atMost: Self.listingLimit) : handle
        opened[directory] = folder
        return folder.map { DownloadPaths(in: $0, fileName: name) }
    }
}
