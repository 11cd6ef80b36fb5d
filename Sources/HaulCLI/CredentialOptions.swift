import ArgumentParser
import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Credentials and cookies, with curl's names: never written to the state directory or beside a
/// download, so a resume in a later run needs them again.
struct CredentialOptions: ParsableArguments {
    @Option(
        name: [.customShort("u"), .customLong("user")],
        help: ArgumentHelp(
            "Basic credentials for each URL's own site, as USER:PASSWORD (curl -u; wget --user/--password).",
            valueName: "user:password"))
    var user: String?

    @Flag(help: "Take each URL's credentials from ~/.netrc (curl --netrc; wget and aria2 read it by default).")
    var netrc = false

    @Option(help: ArgumentHelp("Take credentials from this netrc file (curl --netrc-file).", valueName: "file"))
    var netrcFile: String?

    @Option(
        help: ArgumentHelp(
            "Send the cookies of this Netscape cookie file where they match (curl -b FILE; wget and aria2 "
                + "--load-cookies).", valueName: "file"))
    var loadCookies: String?

    @Option(
        help: ArgumentHelp(
            "Write the cookies (loaded and set by the servers) to this file at the end (curl -c; wget and aria2 "
                + "--save-cookies).", valueName: "file"))
    var saveCookies: String?

    func validate() throws {
        if netrc && netrcFile != nil { throw ValidationError("give --netrc or --netrc-file, not both") }
        if user?.isEmpty == true { throw ValidationError("--user needs USER:PASSWORD") }
    }

    /// Whether any cookie option is given.
    var usesCookies: Bool { loadCookies != nil || saveCookies != nil }

    /// Checks the options against the request headers given with them.
    func validate(headers: [(name: String, value: String)]) throws {
        if user != nil, headers.contains(where: { $0.name.lowercased() == "authorization" }) {
            throw ValidationError("give --user or an Authorization header, not both")
        }
    }

    /// Why these options cannot go with downloads a haul daemon runs, when they cannot.
    var daemonRefusals: [String] {
        usesCookies
            ? ["cookies stay in the process that downloads: add --no-daemon to use --load-cookies or --save-cookies"]
            : []
    }

    /// The netrc file asked for, checked and read; `nil` when none is.
    func netrcEntries() throws -> Netrc? {
        try Self.readNetrc(home: netrc, file: netrcFile)
    }

    /// The netrc file `file`, or `~/.netrc` when `home`, checked and read; `nil` when neither.
    static func readNetrc(home useHome: Bool, file netrcFile: String?) throws -> Netrc? {
        guard useHome || netrcFile != nil else { return nil }
        let home = getenv("HOME").map { String(cString: $0) } ?? ""
        let path = netrcFile ?? (home.isEmpty ? "." : home) + "/.netrc"
        guard let status = POSIX.fileStatus(path) else {
            throw HaulError(.invalidArgument, "cannot read the netrc file \(path): it does not exist")
        }
        // Passwords others can read are not passwords: curl warns, haul refuses.
        if status.st_mode & 0o077 != 0 {
            throw HaulError(
                .invalidArgument, "\(path) can be read by others; make it private (chmod 600 \(path)) and try again")
        }
        let text = try InputFile.read(path)
        do {
            return try Netrc(parsing: text)
        } catch let error as HaulError {
            throw HaulError(.invalidArgument, "\(path): \(error.message)")
        }
    }

    /// The credentials for `url`: `--user`'s, else the netrc's entry for its host.
    func credentials(for url: String, netrc: Netrc?) -> BasicCredentials? {
        if let user { return BasicCredentials(parsing: user) }
        guard let host = (try? DownloadURL(url))?.url.host else { return nil }
        return netrc?.credentials(for: host)
    }

    /// The cookie jar asked for: the file's cookies, or an empty jar to save; `nil` when none is.
    func cookieJar() throws -> CookieJar? {
        guard usesCookies else { return nil }
        guard let loadCookies else { return CookieJar() }
        do {
            return try CookieJar(netscape: try InputFile.read(loadCookies), now: Int64(time(nil)))
        } catch let error as HaulError {
            throw HaulError(error.code, "\(loadCookies): \(error.message)")
        }
    }

    /// Writes the jar to `--save-cookies` (mode 0600, replaced atomically), when given.
    func save(_ jar: CookieJar?) throws {
        guard let saveCookies, let jar else { return }
        try POSIX.replacePrivateFile(saveCookies, with: Array(jar.netscapeText(now: Int64(time(nil))).utf8))
    }
}

/// Request headers the user marks secret, beside those Haul knows by name.
struct SecretHeaderOptions: ParsableArguments {
    @Option(
        name: .customLong("secret-header"),
        help: ArgumentHelp(
            "Hold this -H header as secret: never stored, sent to the URL's own site only; repeatable. "
                + "Authorization, Proxy-Authorization, Cookie and names with auth, token, secret, password, "
                + "session, credential or signature in them, or ending in key, are secret already.",
            valueName: "name"))
    var secretHeaders: [String] = []

    var names: Set<String> { Set(secretHeaders) }

    /// Refuses a name no header carries (a typo would leave the header to be stored); with `more`
    /// headers to come (an input file), only an empty name is refused.
    func validate(headers: [(name: String, value: String)], more: Bool) throws {
        for name in secretHeaders {
            if name.isEmpty { throw ValidationError("--secret-header needs a header name") }
            if !more && !headers.contains(where: { $0.name.lowercased() == name.lowercased() }) {
                throw ValidationError("--secret-header \(name) names no header given with -H")
            }
        }
    }
}
