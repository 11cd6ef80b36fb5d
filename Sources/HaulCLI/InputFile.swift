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
    static let options = ["out", "dir", "checksum", "header", "secret-header", "limit-rate", "user", "mirror"]

    /// The requests, one per URL line, in order.
    let requests: [DownloadRequest]

    /// Reads the list `text` (called `name` in messages). Each URL's request starts as `base` (the
    /// command line's headers, limit and the like) with the URL, into `directory` (the command's
    /// `-d`, which a `dir=` line's relative directory is taken from).
    init(text: String, name: String, base: DownloadRequest, directory: String?) throws {
        var requests: [DownloadRequest] = []
        var output: String?
        var folder: String?
        var line = 0
        /// Gives the request of the URL line before its destination, once its options are read.
        func finish() throws {
            guard var request = requests.popLast() else { return }
            let joined = folder.map { dir in directory.map { $0 + "/" + dir } ?? dir } ?? directory
            request.destination = RequestOptions.destination(output: output, directory: joined)
            if let unknown = request.secretHeaders.first(where: { name in
                !request.headers.contains { $0.name.lowercased() == name.lowercased() }
            }), !base.secretHeaders.contains(unknown) {
                throw HaulError(
                    .invalidArgument, "\(name):\(line): secret-header=\(unknown) names no header of this URL")
            }
            requests.append(request)
        }
        for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let number = index + 1
            let text = rawLine.hasSuffix("\r") ? rawLine.dropLast() : rawLine
            let trimmed = text.trimmingCharacters(in: " \t")
            if trimmed.isEmpty || trimmed.hasPrefix("#") { continue }
            func fail(_ message: String) -> HaulError { HaulError(.invalidArgument, "\(name):\(number): \(message)") }
            guard text.first == " " || text.first == "\t" else {
                guard !trimmed.contains(where: { $0 == " " || $0 == "\t" }) else {
                    throw fail("one URL per line; options go on the indented lines below it (e.g. '  out=NAME')")
                }
                try finish()
                var request = base
                request.url = trimmed
                requests.append(request)
                (output, folder, line) = (nil, nil, number)
                continue
            }
            guard !requests.isEmpty else { throw fail("an option line must follow a URL line") }
            guard let equals = trimmed.firstIndex(of: "=") else {
                throw fail("expected name=value, one of: \(Self.options.joined(separator: ", "))")
            }
            let option = String(trimmed[..<equals])
            let value = String(trimmed[trimmed.index(after: equals)...])
            guard !value.isEmpty else { throw fail("\(option)= needs a value") }
            let last = requests.count - 1
            do {
                switch option {
                case "out":
                    guard !value.hasPrefix("/") || folder == nil else {
                        throw fail("out= cannot be an absolute path together with dir=")
                    }
                    output = value
                case "dir":
                    folder = value
                case "checksum":
                    requests[last].checksum = try Checksum(parsing: value)
                case "header":
                    guard let colon = value.firstIndex(of: ":"), colon != value.startIndex else {
                        throw fail("header= must look like 'Name: value'")
                    }
                    let headerName = value[..<colon].trimmingCharacters(in: " \t")
                    let headerValue = value[value.index(after: colon)...].trimmingCharacters(in: " \t")
                    requests[last].headers.append((headerName, headerValue))
                case "secret-header":
                    requests[last].secretHeaders.insert(value)
                case "user":
                    requests[last].credentials = BasicCredentials(parsing: value)
                case "mirror":
                    do { _ = try DownloadURL(value) } catch let error as HaulError {
                        throw fail("mirror=: \(error.message)")
                    }
                    requests[last].mirrors.append(value)
                case "limit-rate":
                    requests[last].bytesPerSecondLimit = try ByteRate.parse(value)
                default:
                    throw fail("unknown option '\(option)'; known: \(Self.options.joined(separator: ", "))")
                }
            } catch let error as HaulError where !error.message.hasPrefix(name + ":") {
                throw fail(error.message)
            }
        }
        try finish()
        self.requests = requests
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
