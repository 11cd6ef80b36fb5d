#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// What Haul knows about a partial download, stored beside it as versioned JSON.
///
/// The manifest never claims a byte that could be lost: `written` offsets are trusted only while
/// the machine has not rebooted (the page cache survives a killed process), `durable` offsets only
/// cover data that was flushed with `fdatasync` before the manifest naming them was written.
/// Secrets (`Authorization`, cookies) are never stored here.
package struct Manifest: Codable, Equatable, Sendable {
    /// The manifest layout this version of Haul writes. Format 2 hashes pieces with XXH64 and may
    /// record them out of order; format 1 recorded SHA-256 pieces, which are forgotten on reading.
    package static let currentFormat = 2

    /// One contiguous range of the file fetched by one connection.
    package struct Segment: Codable, Equatable, Sendable {
        /// First byte of the segment.
        package var start: Int64
        /// One past the last byte, or `nil` when the total length is unknown.
        package var end: Int64?
        /// Bytes from `start` that were handed to the operating system.
        package var written: Int64
        /// Bytes from `start` that were flushed to stable storage.
        package var durable: Int64

        package init(start: Int64, end: Int64?, written: Int64 = 0, durable: Int64 = 0) {
            self.start = start
            self.end = end
            self.written = written
            self.durable = durable
        }
    }

    package var format: Int
    /// The URL the user asked for.
    package var originalURL: String
    /// The URL the bytes came from after redirects.
    package var finalURL: String
    /// The mirror the bytes came from, when the request's mirrors are used one after another and
    /// the file comes from one of them (`nil`: the URL asked for, or several mixed).
    package var source: String?
    package var validator: ResourceValidator
    /// The complete length, when the server announced it.
    package var totalLength: Int64?
    /// Whether the server advertised byte ranges (`Accept-Ranges: bytes`, or answered a range with 206).
    package var acceptsRanges: Bool
    /// A content coding the server applied despite `Accept-Encoding: identity`; such bytes are not resumable.
    package var contentEncoding: String?
    package var segments: [Segment]
    /// The kernel boot the `written` offsets belong to.
    package var bootID: String?
    /// The size of the pieces hashed in `pieces`.
    package var pieceSize: Int64
    /// The hash of every complete piece written so far, by piece index (see `PieceHasher`); `nil`
    /// where a piece has not been (completely) written or not hashed yet. A download over one
    /// connection records them in order, one over several connections in any order.
    package var pieces: [String?]
    /// Seconds since the epoch.
    package var createdAt: Int64
    package var updatedAt: Int64
    /// Whether every whole piece inside the written ranges had its hash recorded when the manifest
    /// was written, as Haul has done since format 2; not stored. A format 1 manifest's hashes are
    /// forgotten on reading, so its written bytes are trusted without them (checked by the final
    /// checksum only).
    package var piecesCoverWrites = true

    enum CodingKeys: String, CodingKey {
        case format, originalURL, finalURL, source, validator, totalLength, acceptsRanges, contentEncoding, segments
        case bootID, pieceSize, pieces, createdAt, updatedAt
    }

    package init(
        originalURL: String, finalURL: String, validator: ResourceValidator, totalLength: Int64?, acceptsRanges: Bool,
        contentEncoding: String?, bootID: String?, now: Int64, pieceSize: Int64 = Manifest.defaultPieceSize
    ) {
        self.format = Self.currentFormat
        self.originalURL = originalURL
        self.finalURL = finalURL
        self.validator = validator
        self.totalLength = totalLength
        self.acceptsRanges = acceptsRanges
        self.contentEncoding = contentEncoding
        self.segments = [Segment(start: 0, end: totalLength)]
        self.bootID = bootID
        self.pieceSize = pieceSize
        self.pieces = []
        self.createdAt = now
        self.updatedAt = now
    }

    /// The longest file Haul takes a length for: 8 PiB, past what any one file system a download
    /// fills holds. A longer one in an answer is a lie, and in a manifest damage.
    package static let largestLength: Int64 = 1 << 53

    /// 4 MiB: re-checking one piece on resume costs a few milliseconds, and a 4 GiB file needs 1,024 hashes.
    package static let defaultPieceSize: Int64 = 4 << 20

    /// Bytes from the start of the file that can be trusted, given the partial file's current size.
    ///
    /// On the boot that wrote them, every byte `write()` accepted survives a killed process in the page
    /// cache, and one connection writes in order, so the file's size is the trusted prefix, even when
    /// the process died before its next checkpoint. (Data of another version is never there: starting
    /// over truncates the file before the new manifest is written.) After a reboot, only the bytes
    /// flushed before the last durable checkpoint are trusted.
    package func trustedPrefix(currentBootID: String?, partialSize: Int64) -> Int64 {
        guard segments.count == 1, let first = segments.first, first.start == 0 else { return 0 }
        let sameBoot = currentBootID != nil && currentBootID == bootID
        let limit = min(partialSize, totalLength ?? Int64.max)
        return sameBoot ? limit : min(first.durable, limit)
    }

    /// The bytes a resume keeps, over every segment: for one segment the trusted prefix; for several,
    /// each segment's written bytes on the boot that wrote them, else its durable ones, never more
    /// than the file holds.
    package func trustedBytes(currentBootID: String?, partialSize: Int64) -> Int64 {
        trustedRanges(currentBootID: currentBootID, partialSize: partialSize).reduce(0) {
            $0 + $1.upperBound - $1.lowerBound
        }
    }

    /// The bytes from a segment's start that a download over several connections keeps: its written
    /// bytes on the boot that wrote them (they survived in the page cache), else its durable ones,
    /// never more than the file holds.
    func trustedLength(of segment: Segment, currentBootID: String?, partialSize: Int64) -> Int64 {
        let sameBoot = currentBootID != nil && currentBootID == bootID
        return min(sameBoot ? segment.written : segment.durable, max(0, partialSize - segment.start))
    }

    /// Where the bytes `segment` says were written stop being covered by piece hashes: its end, or
    /// the start of the first whole piece inside it without a hash. Every checkpoint records the hash
    /// of each whole piece inside what it says was written, so written bytes past such a gap were
    /// never vouched for by Haul (an edited or damaged manifest): they are fetched again rather than
    /// believed. The piece a segment starts in and the one it ends in may be partly written, unhashed.
    func hashedEnd(of segment: Segment) -> Int64 {
        let end = segment.start + segment.written
        guard piecesCoverWrites else { return end }
        var piece = (segment.start + pieceSize - 1) / pieceSize
        while (piece + 1) * pieceSize <= end {
            guard piece < Int64(pieces.count), pieces[Int(piece)] != nil else {
                return max(segment.start, piece * pieceSize)
            }
            piece += 1
        }
        return end
    }

    /// Forgets everything at or past `offset`: progress and piece hashes. The partial file must be cut
    /// to the same length.
    mutating func truncate(to offset: Int64) {
        for index in segments.indices {
            segments[index].written = min(segments[index].written, offset)
            segments[index].durable = min(segments[index].durable, offset)
        }
        pieces = Array(pieces.prefix(Int(offset / pieceSize)))
    }

    /// The byte ranges whose data can be trusted, given the partial file's current size, in file order:
    /// one range for a download written in order (see ``trustedPrefix(currentBootID:partialSize:)``),
    /// each segment's trusted bytes for one written over several connections.
    package func trustedRanges(currentBootID: String?, partialSize: Int64) -> [Range<Int64>] {
        guard segments.count > 1 else {
            let prefix = trustedPrefix(currentBootID: currentBootID, partialSize: partialSize)
            return prefix > 0 ? [0..<prefix] : []
        }
        return segments.compactMap { segment in
            let trusted = trustedLength(of: segment, currentBootID: currentBootID, partialSize: partialSize)
            return trusted > 0 ? segment.start..<segment.start + trusted : nil
        }.sorted { $0.lowerBound < $1.lowerBound }
    }

    /// The recorded pieces that lie wholly inside `ranges` (sorted, as ``trustedRanges(currentBootID:partialSize:)``
    /// returns them; adjacent ranges join), in order.
    func recordedPieces(within ranges: [Range<Int64>]) -> [Int] {
        var indexes: [Int] = []
        for covered in Self.joined(ranges) {
            let first = Int((covered.lowerBound + pieceSize - 1) / pieceSize)
            let end = min(Int(covered.upperBound / pieceSize), pieces.count)
            guard first < end else { continue }
            indexes += (first..<end).filter { pieces[$0] != nil }
        }
        return indexes
    }

    /// Sorted ranges with the adjacent or overlapping ones joined.
    static func joined(_ ranges: [Range<Int64>]) -> [Range<Int64>] {
        var joined: [Range<Int64>] = []
        for range in ranges.sorted(by: { $0.lowerBound < $1.lowerBound }) where !range.isEmpty {
            if let last = joined.last, range.lowerBound <= last.upperBound {
                joined[joined.count - 1] = last.lowerBound..<max(last.upperBound, range.upperBound)
            } else {
                joined.append(range)
            }
        }
        return joined
    }

    /// Checks that the values make sense together; a manifest that does not is not trusted.
    func validate() throws {
        if let totalLength, totalLength > Self.largestLength {
            throw HaulError(.manifestCorrupt, "manifest has an impossible length of \(totalLength) bytes")
        }
        let end = totalLength ?? segments.map { $0.start + $0.written }.max() ?? 0
        guard pieceSize > 0, Int64(pieces.count) <= end / pieceSize else {
            throw HaulError(.manifestCorrupt, "manifest has impossible piece hashes")
        }
        guard format == Self.currentFormat else {
            throw HaulError(.manifestCorrupt, "manifest format \(format) is not supported by this version of Haul")
        }
        for segment in segments {
            let limit = segment.end.map { $0 - segment.start } ?? Int64.max
            guard segment.start >= 0, segment.start <= Self.largestLength, segment.written >= 0,
                segment.written <= Self.largestLength, segment.durable >= 0, segment.durable <= segment.written,
                segment.written <= limit, (totalLength ?? Int64.max) >= segment.start + segment.written
            else { throw HaulError(.manifestCorrupt, "manifest has an impossible segment \(segment)") }
        }
    }
}

extension Manifest {
    /// Decodes and checks a manifest; anything malformed or impossible is a ``HaulError/Code/manifestCorrupt``.
    package static func decode(_ bytes: [UInt8]) throws -> Manifest {
        do {
            var manifest = try JSONDecoder().decode(Manifest.self, from: Data(bytes))
            if manifest.format == 1 {
                // Format 1 recorded SHA-256 pieces; the data stays, checked by the final checksum only.
                manifest.format = 2
                manifest.pieces = []
                manifest.piecesCoverWrites = false
            }
            try manifest.validate()
            return manifest
        } catch let error as HaulError {
            throw error
        } catch {
            throw HaulError(.manifestCorrupt, "cannot read manifest: \(error)", underlying: error)
        }
    }
}

/// Reads and atomically replaces manifests.
enum ManifestStore {
    static func load(_ paths: DownloadPaths) throws -> Manifest? {
        guard paths.folder.exists(paths.manifestName) else { return nil }
        let bytes = try paths.folder.readWholeFile(paths.manifestName, limit: 1 << 24)
        do {
            return try Manifest.decode(bytes)
        } catch let error as HaulError {
            throw HaulError(.manifestCorrupt, "\(paths.manifest): \(error.message)", underlying: error.underlying)
        }
    }

    /// Replaces the manifest through a temporary file and a rename, so a reader sees the old or the
    /// new manifest, never a mix. `durable` adds the fsyncs that make the replacement survive a power loss.
    /// `permit` is asked last, right before the rename: a checkpoint begun while writes were allowed
    /// (its flush and hashing may take long) replaces nothing once they are not.
    static func store(
        _ manifest: Manifest, at paths: DownloadPaths, durable: Bool, permit: (@Sendable () -> Bool)? = nil
    ) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let data = try encoder.encode(manifest)
        let temporary = paths.manifestTemporaryName
        // Made anew: a temporary file left in its place (or a hard link to a file elsewhere) is
        // replaced, never written through.
        let descriptor: Int32
        do {
            descriptor = try paths.folder.openFile(temporary, flags: O_WRONLY | O_CREAT | O_EXCL)
        } catch let error as HaulError where (error.underlying as? SystemError)?.code == EEXIST {
            try paths.folder.unlink(temporary)
            descriptor = try paths.folder.openFile(temporary, flags: O_WRONLY | O_CREAT | O_EXCL)
        }
        do {
            try data.withUnsafeBytes { try POSIX.write(descriptor, $0, at: 0, path: paths.folder.pathOf(temporary)) }
            if durable { try POSIX.syncAll(descriptor, path: paths.folder.pathOf(temporary)) }
            POSIX.close(descriptor)
        } catch {
            POSIX.close(descriptor)
            throw error
        }
        if let permit, !permit() {
            try? paths.folder.unlink(temporary)
            throw DownloaderConfiguration.writeRefused
        }
        try paths.folder.rename(temporary, to: paths.manifestName)
        if durable { try paths.folder.sync() }
    }

    /// Removes the manifest and any temporary one (only the temporary one when the caller just saw
    /// there is no manifest). Looking before unlinking spares the directory's write lock when there
    /// is nothing to remove, as for a small file that never needed a manifest.
    static func remove(_ paths: DownloadPaths, temporaryOnly: Bool = false) throws {
        let names = temporaryOnly ? [paths.manifestTemporaryName] : [paths.manifestName, paths.manifestTemporaryName]
        for name in names where paths.folder.exists(name) {
            try paths.folder.unlink(name)
        }
    }
}
