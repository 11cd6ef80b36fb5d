#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A user name and password for HTTP Basic authentication.
public struct BasicCredentials: Sendable, Hashable {
    /// The user name.
    public var user: String
    /// The password.
    public var password: String

    /// Credentials of `user` with `password`.
    public init(user: String, password: String) {
        self.user = user
        self.password = password
    }

    /// `user:password`, as `-u` takes it; a missing colon means an empty password.
    public init(parsing text: String) {
        if let colon = text.firstIndex(of: ":") {
            self.init(user: String(text[..<colon]), password: String(text[text.index(after: colon)...]))
        } else {
            self.init(user: text, password: "")
        }
    }

    /// The value of an `Authorization` header carrying them.
    public var authorization: String { "Basic " + Data("\(user):\(password)".utf8).base64EncodedString() }

    /// The credentials an `Authorization: Basic …` value carries; `nil` for any other value.
    init?(authorization value: String) {
        let parts = value.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "basic", let bytes = Data(base64Encoded: String(parts[1])),
            let text = String(validating: bytes, as: UTF8.self)
        else { return nil }
        self.init(parsing: text)
    }
}

/// A `.netrc` file, read as curl reads it: `machine NAME` entries with `login` and `password`, a
/// `default` entry for every other host, `account` ignored, `macdef` bodies skipped up to the next
/// blank line, `#` comments, and double-quoted values with `\"`, `\\`, `\n`, `\r` and `\t` escapes.
public struct Netrc: Sendable, Equatable {
    /// One entry: a host's (or the default) login.
    public struct Entry: Sendable, Equatable {
        /// The host name; `nil` for the `default` entry.
        public var machine: String?
        /// The user name.
        public var login: String?
        /// The password.
        public var password: String?
    }

    /// The entries, in the file's order.
    public let entries: [Entry]

    /// Reads a `.netrc` file's text.
    /// - Throws: ``HaulError/Code/invalidArgument`` naming the token a keyword is missing.
    public init(parsing text: String) throws {
        var tokens = Self.tokens(text)[...]
        var entries: [Entry] = []
        while let token = tokens.popFirst() {
            switch token {
            case "machine":
                guard let name = tokens.popFirst() else { throw Self.missing("a host name after 'machine'") }
                entries.append(Entry(machine: name.lowercased()))
            case "default":
                entries.append(Entry(machine: nil))
            case "login", "password", "account":
                guard let value = tokens.popFirst() else { throw Self.missing("a value after '\(token)'") }
                guard !entries.isEmpty else { throw Self.missing("'machine' or 'default' before '\(token)'") }
                if token == "login" { entries[entries.count - 1].login = value }
                if token == "password" { entries[entries.count - 1].password = value }
            case Self.macroBodyMarker:
                continue
            default:
                throw HaulError(.invalidArgument, "the .netrc file has an unknown word '\(token)'")
            }
        }
        self.entries = entries
    }

    /// The credentials for `host`: its own entry's, else the `default` entry's; `nil` when neither
    /// has a login.
    public func credentials(for host: String) -> BasicCredentials? {
        credentials(for: host, orDefault: true)
    }

    /// The credentials of `host`'s own entry; with `orDefault`, else the `default` entry's. A
    /// daemon, which runs URLs its clients name, never sends the `default` entry's anywhere.
    public func credentials(for host: String, orDefault: Bool) -> BasicCredentials? {
        let host = host.lowercased()
        let entry = entries.first { $0.machine == host } ?? (orDefault ? entries.first { $0.machine == nil } : nil)
        guard let entry, let login = entry.login else { return nil }
        return BasicCredentials(user: login, password: entry.password ?? "")
    }

    private static let macroBodyMarker = "\u{0}macdef"

    private static func missing(_ what: String) -> HaulError {
        HaulError(.invalidArgument, "the .netrc file lacks \(what)")
    }

    /// The file's words, quoted ones unescaped; a `macdef` and its body become one marker.
    private static func tokens(_ text: String) -> [String] {
        var tokens: [String] = []
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        var index = 0
        while index < lines.count {
            let line = lines[index]
            index += 1
            var characters = Substring(line)
            while let first = characters.first {
                if first == " " || first == "\t" || first == "\r" {
                    characters.removeFirst()
                    continue
                }
                if first == "#" { break }
                var word = ""
                if first == "\"" {
                    characters.removeFirst()
                    while let character = characters.popFirst(), character != "\"" {
                        guard character == "\\", let escaped = characters.popFirst() else {
                            word.append(character)
                            continue
                        }
                        switch escaped {
                        case "n": word.append("\n")
                        case "r": word.append("\r")
                        case "t": word.append("\t")
                        default: word.append(escaped)
                        }
                    }
                } else {
                    while let character = characters.first, character != " ", character != "\t", character != "\r" {
                        word.append(character)
                        characters.removeFirst()
                    }
                }
                if word == "macdef" {
                    // A macro's name and body, up to the next blank line, are not credentials.
                    tokens.append(macroBodyMarker)
                    while index < lines.count, !lines[index].allSatisfy({ $0 == " " || $0 == "\t" || $0 == "\r" }) {
                        index += 1
                    }
                    break
                }
                tokens.append(word)
            }
        }
        return tokens
    }
}
