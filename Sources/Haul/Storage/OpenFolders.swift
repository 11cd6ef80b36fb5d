/// The directories of many downloads, each opened once: adding thousands of downloads into a few
/// directories, or bringing a window of them up to date with the disk, opens each directory once
/// rather than once a download (and a directory that cannot be opened is tried once). A directory
/// asked about many times is listed once (see ``DirectoryHandle/listed(atMost:)``). A look lasts
/// as long as one batch of downloads: a file created after it is not seen.
struct OpenFolders {
    /// How many directories are kept open at most; past it, the ones kept are let go.
    static let limit = 64
    /// The downloads looked at in one directory after which it is listed: for fewer, a look at
    /// each name costs less than reading every name there.
    static let looksBeforeListing = 16
    /// A directory with more names than this is never listed; each name is looked at.
    static let listingLimit = 4_096

    private let confinement: DownloadConfinement
    private var opened: [String: (folder: DirectoryHandle?, looks: Int)] = [:]

    /// Opens directories as `confinement` allows.
    init(confinement: DownloadConfinement) {
        self.confinement = confinement
    }

    /// The files of the download into `destination`, in its directory opened once; `nil` when
    /// the directory cannot be opened (it does not exist yet, or lies outside the roots).
    mutating func paths(_ destination: String) -> DownloadPaths? {
        let (directory, name) = DownloadPaths.split(destination)
        if opened[directory] == nil && opened.count >= Self.limit { opened.removeAll(keepingCapacity: true) }
        var entry = opened[directory] ?? (try? confinement.directory(directory), 0)
        entry.looks += 1
        if entry.looks == Self.looksBeforeListing { entry.folder = entry.folder?.listed(atMost: Self.listingLimit) }
        opened[directory] = entry
        return entry.folder.map { DownloadPaths(in: $0, fileName: name) }
    }
}
