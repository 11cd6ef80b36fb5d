#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Where a downloader may write: wherever the caller's paths lead when it has no download roots,
/// else only beneath one of them.
///
/// Beneath a root, the directory of a download is opened when its files are opened, not when the
/// download is added, and no symbolic link is followed on the way (``DirectoryHandle``): a folder
/// swapped for a link between the two cannot lead the download elsewhere. The directory is checked
/// once more right before the final rename, so one moved out of the root meanwhile is refused too.
package struct DownloadConfinement: Sendable {
    /// A download root, as given and with its own links resolved (a root may itself be a link).
    struct Root: Sendable {
        let given: String
        let resolved: String?
    }

    let roots: [Root]

    /// Confinement beneath `roots` (none: anywhere).
    package init(roots: [String]) {
        self.roots = roots.map { root in
            let absolute = POSIX.absolutePath(root)
            let resolved = realpath(absolute, nil).map { pointer in
                defer { free(pointer) }
                return String(cString: pointer)
            }
            let same = resolved.map { Self.sameName($0, absolute) } ?? false
            return Root(given: absolute, resolved: same ? nil : resolved)
        }
    }

    /// No download root: paths lead where they lead.
    package static let none = DownloadConfinement(roots: [])

    package var isConfined: Bool { !roots.isEmpty }

    /// Opens the directory `path` (made absolute), creating it when `creating`; beneath its
    /// download root when there are roots.
    ///
    /// - Throws: ``HaulError/Code/outsideDownloadRoot`` for a directory outside every root, or
    ///   reached through a symbolic link beneath one; ``HaulError/Code/fileSystem`` when it does
    ///   not exist.
    package func directory(_ path: String, creating: Bool = false) throws -> DirectoryHandle {
        guard isConfined else { return try DirectoryHandle.open(path, creating: creating) }
        let absolute = POSIX.absolutePath(path)
        for root in roots {
            for base in [root.given, root.resolved].compactMap({ $0 }) {
                guard let relative = Self.relative(absolute, to: base) else { continue }
                let top = try DirectoryHandle.open(base)
                return try DirectoryHandle.open(relative, beneath: top, creating: creating, rootPath: base)
            }
        }
        throw outside(absolute)
    }

    /// Throws ``HaulError/Code/outsideDownloadRoot`` for a path (made absolute) that lies outside
    /// every root, by name: whether links lead elsewhere is checked when it is opened.
    package func checkContains(_ path: String) throws {
        guard isConfined else { return }
        let absolute = POSIX.absolutePath(path)
        let inside = roots.contains { root in
            [root.given, root.resolved].compactMap { $0 }.contains { Self.relative(absolute, to: $0) != nil }
        }
        if inside { return }
        throw outside(absolute)
    }

    private func outside(_ path: String) -> HaulError {
        let names = roots.map(\.given).joined(separator: ", ")
        return HaulError(.outsideDownloadRoot, "\(path) is outside the download roots (\(names))")
    }

    /// Throws ``HaulError/Code/outsideDownloadRoot`` unless the directory `handle` is still the one
    /// its path leads to beneath its root, with no link on the way (nothing to check without roots).
    package func check(_ handle: DirectoryHandle) throws {
        guard isConfined else { return }
        let now = try? directory(handle.path)
        guard let now, try now.identity() == handle.identity() else {
            throw HaulError(
                .outsideDownloadRoot, "\(handle.path) was moved or replaced while the download was writing into it")
        }
    }

    /// `path` relative to `base` (empty for `base` itself), when it lies inside it, comparing names
    /// as the file system does (``sameName(_:_:)``).
    private static func relative(_ path: String, to base: String) -> String? {
        if sameName(path, base) { return "" }
        let prefix = sameName(base, "/") ? "/" : base + "/"
        #if canImport(Darwin)
            return path.hasPrefix(prefix) ? String(path.dropFirst(prefix.count)) : nil
        #else
            guard path.utf8.starts(with: prefix.utf8) else { return nil }
            return String(decoding: path.utf8.dropFirst(prefix.utf8.count), as: UTF8.self)
        #endif
    }

    /// Whether two paths name the same file by their spelling. Linux compares names byte by byte:
    /// "café" with a precomposed é and with an e and a combining accent are two folders there,
    /// though Swift's `==` takes them for one. APFS and HFS+ take them for one name, as `==` does.
    private static func sameName(_ one: String, _ other: String) -> Bool {
        #if canImport(Darwin)
            one == other
        #else
            one.utf8.elementsEqual(other.utf8)
        #endif
    }
}
