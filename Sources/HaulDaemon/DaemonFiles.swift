import Haul

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

/// The daemon's files in the state directory: the lock that keeps one daemon per directory, the
/// token clients prove themselves with, and the address file through which the CLI finds the daemon.
///
/// - `daemon.lock`: an exclusive `flock` held while the daemon runs; the system drops it however the
///   process ends.
/// - `daemon.token`: the bearer token, made on first start, mode 0600; a token file others can read
///   is refused.
/// - `daemon.address`: `URL PID` of the running daemon, removed when it stops.
public enum DaemonFiles {
    /// The lock file's name.
    public static let lockName = "daemon.lock"
    /// The token file's name.
    public static let tokenName = "daemon.token"
    /// The address file's name.
    public static let addressName = "daemon.address"

    /// The token in `stateDirectory`, made (32 random bytes as hex, mode 0600) when there is none.
    /// Throws when the file is readable or writable by others, or is not a regular file.
    public static func token(in stateDirectory: String) throws -> String {
        try POSIX.makePrivateDirectory(stateDirectory, marker: DownloadManager.databaseName)
        let path = stateDirectory + "/" + tokenName
        if let existing = try readToken(path) { return existing }
        var generator = SystemRandomNumberGenerator()
        let token = (0..<32).map { _ in hexByte(UInt8.random(in: 0...255, using: &generator)) }.joined()
        let descriptor = path.withCString { open($0, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600) }
        guard descriptor >= 0 else {
            // Another process made it in between: use theirs.
            if errno == EEXIST, let theirs = try readToken(path) { return theirs }
            throw POSIX.error("create", path: path)
        }
        defer { POSIX.close(descriptor) }
        // The umask may have taken bits away; it never adds any, but be exact.
        _ = fchmod(descriptor, 0o600)
        let bytes = Array((token + "\n").utf8)
        try bytes.withUnsafeBytes { try POSIX.write(descriptor, $0, at: 0, path: path) }
        try POSIX.syncAll(descriptor, path: path)
        return token
    }

    /// The token a client reads to reach the daemon of `stateDirectory`, if a daemon made one.
    public static func existingToken(in stateDirectory: String) throws -> String? {
        try readToken(stateDirectory + "/" + tokenName)
    }

    private static func readToken(_ path: String) throws -> String? {
        guard let status = POSIX.fileStatus(path) else { return nil }
        guard status.st_mode & S_IFMT == S_IFREG else {
            throw HaulError(.fileSystem, "\(path) is not a regular file")
        }
        guard status.st_mode & 0o077 == 0 else {
            throw HaulError(
                .fileSystem,
                "\(path) can be read by other users: run chmod 600 on it (or delete it for a new token)")
        }
        let bytes = try POSIX.readWholeFile(path, limit: 4096)
        let token = String(decoding: bytes, as: UTF8.self).trimmingWhitespace
        guard token.count >= 32, token.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber) }) else {
            throw HaulError(.fileSystem, "\(path) does not hold a token: delete it for a new one")
        }
        return token
    }

    private static func hexByte(_ byte: UInt8) -> String {
        let digits = Array("0123456789abcdef")
        return String([digits[Int(byte >> 4)], digits[Int(byte & 0xf)]])
    }

    /// Whether `given` equals `expected`, in time that does not depend on where they differ.
    public static func tokensMatch(_ given: some StringProtocol, _ expected: String) -> Bool {
        let left = Array(given.utf8)
        let right = Array(expected.utf8)
        var difference = UInt8(left.count == right.count ? 0 : 1)
        for index in 0..<right.count {
            difference |= (index < left.count ? left[index] : 0) ^ right[index]
        }
        return difference == 0
    }

    /// Where a running daemon listens, as its address file says.
    public struct Address: Sendable, Equatable {
        /// The daemon's base URL, e.g. `http://127.0.0.1:8090`.
        public var url: String
        /// The daemon's process ID.
        public var processID: Int32

        /// An address.
        public init(url: String, processID: Int32) {
            self.url = url
            self.processID = processID
        }
    }

    /// The address of the daemon that runs on `stateDirectory`, if one does: the address file must
    /// exist and its lock must be held.
    public static func runningDaemon(in stateDirectory: String) -> Address? {
        guard let address = readAddress(stateDirectory) else { return nil }
        let lockPath = stateDirectory + "/" + lockName
        guard let descriptor = try? POSIX.open(lockPath, flags: O_RDWR | O_NOFOLLOW) else { return nil }
        defer { POSIX.close(descriptor) }
        // Read who holds it rather than try it, where the platform tells: a daemon starting now must
        // not find it taken.
        switch Platform.lockHolder(descriptor) {
        case .process: return address
        case .nobody: return nil
        case .unknown: break
        }
        if flock(descriptor, LOCK_SH | LOCK_NB) == 0 {
            // Nobody holds it: the daemon that wrote the address is gone.
            flock(descriptor, LOCK_UN)
            return nil
        }
        return address
    }

    static func readAddress(_ stateDirectory: String) -> Address? {
        guard let bytes = try? POSIX.readWholeFile(stateDirectory + "/" + addressName, limit: 4096) else { return nil }
        let fields = String(decoding: bytes, as: UTF8.self).trimmingWhitespace.split(separator: " ")
        guard fields.count == 2, let processID = Int32(fields[1]) else { return nil }
        return Address(url: String(fields[0]), processID: processID)
    }

    /// The daemon's schedules and rules, set through its API.
    public static let rulesName = "rules.json"

    /// The rules stored in the state directory, if any; a file that does not hold rules that can
    /// hold is refused in one line that names it.
    static func readRules(in stateDirectory: String) throws -> QueueRules? {
        let path = stateDirectory + "/" + rulesName
        guard POSIX.exists(path) else { return nil }
        do {
            let rules = try JSONDecoder().decode(
                QueueRules.self, from: Data(try POSIX.readWholeFile(path, limit: 1 << 20)))
            try rules.check()
            return rules
        } catch let error as DecodingError {
            throw HaulError(.invalidArgument, "\(path) does not hold rules: \(error.summary)")
        } catch let error as HaulError {
            throw HaulError(error.code, "\(path): \(error.message)")
        }
    }

    /// Stores the rules, replacing the file whole (readable by its owner only).
    static func writeRules(_ rules: QueueRules, in stateDirectory: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
        try POSIX.replacePrivateFile(stateDirectory + "/" + rulesName, with: Array(try encoder.encode(rules)))
    }

    /// Writes the address file (mode 0600, replaced atomically).
    static func writeAddress(_ address: Address, in stateDirectory: String) throws {
        try POSIX.replacePrivateFile(
            stateDirectory + "/" + addressName, with: Array("\(address.url) \(address.processID)\n".utf8))
    }

    static func removeAddress(in stateDirectory: String) {
        try? POSIX.unlink(stateDirectory + "/" + addressName)
    }
}

/// The exclusive lock one daemon holds on its state directory while it runs.
final class DaemonLock: Sendable {
    private let descriptor: Int32

    /// Takes the lock, or throws naming the daemon that holds it.
    init(stateDirectory: String) throws {
        let path = stateDirectory + "/" + DaemonFiles.lockName
        do {
            descriptor = try POSIX.openLocked(path)
        } catch let error as HaulError where (error.underlying as? SystemError)?.code == EWOULDBLOCK {
            let first = DaemonFiles.readAddress(stateDirectory).map { " (pid \($0.processID), \($0.url))" } ?? ""
            throw HaulError(.locked, "another haul daemon\(first) runs on \(stateDirectory)")
        }
    }

    deinit { POSIX.close(descriptor) }
}

extension String {
    var trimmingWhitespace: String {
        let characters = Array(self)
        var start = 0
        var end = characters.count
        while start < end, characters[start].isWhitespace { start += 1 }
        while end > start, characters[end - 1].isWhitespace { end -= 1 }
        return String(characters[start..<end])
    }
}
