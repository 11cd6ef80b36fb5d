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
struct InputFile: Sendable {
    static let options = ["out", "dir", "checksum", "header", "secret-header", "limit-rate", "user", "mirror"]

    /// What messages call the list: its path, or "standard input".
    let name: String
    private let source: InputSource
    private let base: DownloadRequest
    private let directory: String?

    /// Opens the list at `path` (`-`: standard input, kept in an unnamed temporary file so that it
    /// can be read again). Each URL's request starts as `base` (the command line's headers, limit
    /// and the like) with the URL, into `directory` (the command's `-d`, which a `dir=` line's
    /// relative directory is taken from).
    init(path: String, base: DownloadRequest, directory: String?) throws {
        self.name = path == "-" ? "standard input" : path
        self.source = try InputSource(path)
        self.base = base
        self.directory = directory
    }

    /// Reads the list from its start, passing its requests to `chunk`, `size` at a time, in order;
    /// throws at the first line that is not right, naming the file and the line.
    func read(by size: Int, _ chunk: ([DownloadRequest]) throws -> Void) throws {
        var parser = Parser(name: name, base: base, directory: directory)
        var requests: [DownloadRequest] = []
        requests.reserveCapacity(size)
        func take(_ request: DownloadRequest?) throws {
            guard let request else { return }
            requests.append(request)
            if requests.count >= size {
                try chunk(requests)
                requests.removeAll(keepingCapacity: true)
            }
        }
        try source.forEachLine(name: name) { number, line in try take(try parser.read(line, number: number)) }
        try take(try parser.finish())
        if !requests.isEmpty { try chunk(requests) }
    }

    /// The lines of a list, one at a time: a request is given once the option lines below its URL
    /// are read.
    private struct Parser {
        let name: String
        let base: DownloadRequest
        let directory: String?
        /// The request of the last URL line, its `out=` and `dir=`, and its line number.
        var request: DownloadRequest?
        var output: String?
        var folder: String?
        var line = 0

        init(name: String, base: DownloadRequest, directory: String?) {
            self.name = name
            self.base = base
            self.directory = directory
        }

        /// Reads line `number`; returns the request of the URL line before it when this line starts
        /// another.
        mutating func read(_ text: Substring, number: Int) throws -> DownloadRequest? {
            // The line is cut in its bytes: the blanks, `\r`, `#` and `=` it is cut at are ASCII, and
            // a list of a million lines spent a third of its reading comparing characters.
            let bytes = text.utf8
            var start = bytes.startIndex
            var end = bytes.endIndex
            if start < end, bytes[bytes.index(before: end)] == UInt8(ascii: "\r") { bytes.formIndex(before: &end) }
            let indented = start < end && Self.isBlank(bytes[start])
            while start < end, Self.isBlank(bytes[start]) { bytes.formIndex(after: &start) }
            while start < end, Self.isBlank(bytes[bytes.index(before: end)]) { bytes.formIndex(before: &end) }
            if start == end || bytes[start] == UInt8(ascii: "#") { return nil }
            let trimmed = bytes[start..<end]
            func fail(_ message: String) -> HaulError { HaulError(.invalidArgument, "\(name):\(number): \(message)") }
            guard indented else {
                guard !trimmed.contains(where: Self.isBlank) else {
                    throw fail("one URL per line; options go on the indented lines below it (e.g. '  out=NAME')")
                }
                let finished = try finish()
                request = base
                request?.url = String(Substring(trimmed))
                (output, folder, line) = (nil, nil, number)
                return finished
            }
            guard request != nil else { throw fail("an option line must follow a URL line") }
            guard let equals = trimmed.firstIndex(of: UInt8(ascii: "=")) else {
                throw fail("expected name=value, one of: \(InputFile.options.joined(separator: ", "))")
            }
            let option = String(Substring(trimmed[..<equals]))
            let value = String(Substring(trimmed[trimmed.index(after: equals)...]))
            guard !value.isEmpty else { throw fail("\(option)= needs a value") }
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
                    request?.checksum = try Checksum(parsing: value)
                case "header":
                    guard let colon = value.firstIndex(of: ":"), colon != value.startIndex else {
                        throw fail("header= must look like 'Name: value'")
                    }
                    let headerName = value[..<colon].trimmingCharacters(in: " \t")
                    let headerValue = value[value.index(after: colon)...].trimmingCharacters(in: " \t")
                    request?.headers.append((headerName, headerValue))
                case "secret-header":
                    request?.secretHeaders.insert(value)
                case "user":
                    request?.credentials = BasicCredentials(parsing: value)
                case "mirror":
                    do { _ = try DownloadURL(value) } catch let error as HaulError {
                        throw fail("mirror=: \(error.message)")
                    }
                    request?.mirrors.append(value)
                case "limit-rate":
                    request?.bytesPerSecondLimit = try ByteRate.parse(value)
                default:
                    throw fail("unknown option '\(option)'; known: \(InputFile.options.joined(separator: ", "))")
                }
            } catch let error as HaulError where !error.message.hasPrefix(name + ":") {
                throw fail(error.message)
            }
            return nil
        }

        /// Whether `byte` is a space or a tab.
        private static func isBlank(_ byte: UInt8) -> Bool {
            byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t")
        }

        /// The request of the last URL line with its destination, once its options are read.
        mutating func finish() throws -> DownloadRequest? {
            guard var request else { return nil }
            self.request = nil
            let joined = folder.map { dir in directory.map { $0 + "/" + dir } ?? dir } ?? directory
            request.destination = RequestOptions.destination(output: output, directory: joined)
            if let unknown = request.secretHeaders.first(where: { name in
                !request.headers.contains { $0.name.lowercased() == name.lowercased() }
            }), !base.secretHeaders.contains(unknown) {
                throw HaulError(
                    .invalidArgument, "\(name):\(line): secret-header=\(unknown) names no header of this URL")
            }
            return request
        }
    }
}

/// The open file of an input list, read from its start as often as needed. Standard input is read
/// once into an unnamed temporary file (it cannot be read twice).
private final class InputSource: Sendable {
    private let descriptor: Int32
    private let path: String

    init(_ path: String) throws {
        guard path == "-" else {
            self.path = path
            descriptor = try POSIX.open(path, flags: O_RDONLY)
            return
        }
        let directory = getenv("TMPDIR").map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
        var template = Array((directory + "/haul-input-XXXXXX").utf8CString)
        let descriptor = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        guard descriptor >= 0 else { throw POSIX.error("keep standard input in", path: directory) }
        let kept = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
        unlink(kept)
        self.descriptor = descriptor
        self.path = "standard input"
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var size: Int64 = 0
        while true {
            let count = buffer.withUnsafeMutableBytes { systemRead(STDIN_FILENO, $0.baseAddress!, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count < 0 { throw POSIX.error("read", path: "standard input") }
            if count == 0 { break }
            try buffer.withUnsafeBytes {
                try POSIX.write(descriptor, UnsafeRawBufferPointer(rebasing: $0[0..<count]), at: size, path: kept)
            }
            size += Int64(count)
        }
    }

    deinit { POSIX.close(descriptor) }

    /// Passes each line (without its line feed) and its number, from the first, to `body`; throws
    /// for a line that is not UTF-8 (naming the list `name`).
    func forEachLine(name: String, _ body: (Int, Substring) throws -> Void) throws {
        var offset: Int64 = 0
        var number = 0
        var carried: [UInt8] = []
        var block = [UInt8](repeating: 0, count: 1 << 20)
        func line(_ bytes: UnsafeBufferPointer<UInt8>) throws {
            number += 1
            guard let text = String(validating: bytes, as: UTF8.self) else {
                throw HaulError(.invalidArgument, "\(name):\(number): not UTF-8 text")
            }
            try body(number, text[...])
        }
        while true {
            let count = try block.withUnsafeMutableBytes {
                try POSIX.readInto(descriptor, $0, count: $0.count, at: offset, path: path)
            }
            if count == 0 { break }
            offset += Int64(count)
            try block.withUnsafeBufferPointer { read in
                var start = 0
                let bytes = UnsafeBufferPointer(rebasing: read[0..<count])
                while let end = bytes[start...].firstIndex(of: UInt8(ascii: "\n")) {
                    if carried.isEmpty {
                        try line(UnsafeBufferPointer(rebasing: bytes[start..<end]))
                    } else {
                        carried += bytes[start..<end]
                        try carried.withUnsafeBufferPointer { try line($0) }
                        carried.removeAll(keepingCapacity: true)
                    }
                    start = end + 1
                }
                carried += bytes[start...]
            }
        }
        if !carried.isEmpty { try carried.withUnsafeBufferPointer { try line($0) } }
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
