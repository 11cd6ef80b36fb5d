import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A list of downloads for `haul get -i`, in the style of aria2's input files: one URL per line,
/// optionally followed by indented `name=value` lines that apply to it.
///
/// ```
/// https://example.com/a.iso
///   out=debian.iso
///   checksum=sha-256=9f86d0…
/// # a comment
/// https://example.com/b.tar.gz
///   dir=archives
///   header=Authorization: Bearer …
/// ```
///
/// Options: `out` (file name), `dir` (directory), `checksum` (ALG=HEX), `header` (repeatable),
/// `secret-header` (a header name to hold as secret; repeatable),
/// `limit-rate`, `user` (USER:PASSWORD, Basic credentials for that URL's site), `mirror` (another
/// URL of the same file; repeatable). Blank lines and lines starting with `#` are ignored. Any
/// other line is an error naming the file and line.
struct InputFile {
    struct Entry {
        var url: String
        var line: Int
        var output: String?
        var directory: String?
        var checksum: Checksum?
        var headers: [(name: String, value: String)] = []
        var secretHeaders: Set<String> = []
        var limitRate: Int64?
        var credentials: BasicCredentials?
        var mirrors: [String] = []
    }

    static let options = ["out", "dir", "checksum", "header", "secret-header", "limit-rate", "user", "mirror"]

    let entries: [Entry]

    init(text: String, name: String) throws {
        var entries: [Entry] = []
        for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let number = index + 1
            let line = rawLine.hasSuffix("\r") ? rawLine.dropLast() : rawLine
            let trimmed = line.trimmingCharacters(in: " \t")
            if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
            func fail(_ message: String) -> HaulError { HaulError(.invalidArgument, "\(name):\(number): \(message)") }
            guard line.first == " " || line.first == "\t" else {
                guard !trimmed.contains(where: { $0 == " " || $0 == "\t" }) else {
                    throw fail("one URL per line; options go on the indented lines below it (e.g. '  out=NAME')")
                }
                entries.append(Entry(url: trimmed, line: number))
                continue
            }
            guard !entries.isEmpty else { throw fail("an option line must follow a URL line") }
            guard let equals = trimmed.firstIndex(of: "=") else {
                throw fail("expected name=value, one of: \(Self.options.joined(separator: ", "))")
            }
            let option = String(trimmed[..<equals])
            let value = String(trimmed[trimmed.index(after: equals)...])
            guard !value.isEmpty else { throw fail("\(option)= needs a value") }
            switch option {
            case "out":
                guard !value.contains("/") || !value.hasPrefix("/") || entries[entries.count - 1].directory == nil
                else { throw fail("out= cannot be an absolute path together with dir=") }
                entries[entries.count - 1].output = value
            case "dir":
                entries[entries.count - 1].directory = value
            case "checksum":
                do {
                    entries[entries.count - 1].checksum = try Checksum(parsing: value)
                } catch let error as HaulError {
                    throw fail(error.message)
                }
            case "header":
                guard let colon = value.firstIndex(of: ":"), colon != value.startIndex else {
                    throw fail("header= must look like 'Name: value'")
                }
                let headerName = value[..<colon].trimmingCharacters(in: " \t")
                let headerValue = value[value.index(after: colon)...].trimmingCharacters(in: " \t")
                entries[entries.count - 1].headers.append((headerName, headerValue))
            case "secret-header":
                entries[entries.count - 1].secretHeaders.insert(value)
            case "user":
                entries[entries.count - 1].credentials = BasicCredentials(parsing: value)
            case "mirror":
                do { _ = try DownloadURL(value) } catch let error as HaulError {
                    throw fail("mirror=: \(error.message)")
                }
                entries[entries.count - 1].mirrors.append(value)
            case "limit-rate":
                do {
                    entries[entries.count - 1].limitRate = try ByteRate.parse(value)
                } catch let error as HaulError {
                    throw fail(error.message)
                }
            default:
                throw fail("unknown option '\(option)'; known: \(Self.options.joined(separator: ", "))")
            }
        }
        self.entries = entries
    }
}

extension InputFile {
    /// The whole file (or standard input for `-`) as UTF-8 text.
    static func read(_ path: String) throws -> String {
        let descriptor = path == "-" ? STDIN_FILENO : open(path, O_RDONLY)
        guard descriptor >= 0 else {
            throw HaulError(.fileSystem, "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        defer { if descriptor != STDIN_FILENO { close(descriptor) } }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = buffer.withUnsafeMutableBytes { systemRead(descriptor, $0.baseAddress!, $0.count) }
            if count < 0 {
                throw HaulError(.fileSystem, "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            if count == 0 { break }
            bytes += buffer[0..<count]
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw HaulError(.invalidArgument, "\(path) is not UTF-8 text")
        }
        return text
    }
}

#if canImport(Glibc)
    private let systemRead: @Sendable (Int32, UnsafeMutableRawPointer, Int) -> Int = { Glibc.read($0, $1, $2) }
#elseif canImport(Musl)
    private let systemRead: @Sendable (Int32, UnsafeMutableRawPointer, Int) -> Int = { Musl.read($0, $1, $2) }
#elseif canImport(Darwin)
    private let systemRead: @Sendable (Int32, UnsafeMutableRawPointer, Int) -> Int = { Darwin.read($0, $1, $2) }
#endif
