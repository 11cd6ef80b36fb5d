import Foundation
import HaulTestServer
import Testing

@testable import Haul

/// `.netrc` files, Basic credentials and cookies: parsed as curl reads them, sent only where they
/// belong, never written to disk.
@Suite(.timeLimit(.minutes(1)))
struct CredentialsTests {
    @Test func netrcIsReadAsCurlReadsIt() throws {
        let netrc = try Netrc(
            parsing: """
                # a comment
                machine files.example.com login alice password "se cret\\"1"
                machine other.example
                  login bob
                  password p2 account unused
                macdef init
                cd /pub
                get file

                default login anonymous password guest@example
                """)
        #expect(netrc.credentials(for: "FILES.example.com") == BasicCredentials(user: "alice", password: "se cret\"1"))
        #expect(netrc.credentials(for: "other.example") == BasicCredentials(user: "bob", password: "p2"))
        #expect(
            netrc.credentials(for: "unknown.example") == BasicCredentials(user: "anonymous", password: "guest@example"))
        #expect(try Netrc(parsing: "machine a login x").credentials(for: "b") == nil)
        #expect(try Netrc(parsing: "machine a password only").credentials(for: "a") == nil, "no login, no credentials")
        for bad in ["machine", "login x", "machine a login", "machine a frobnicate x"] {
            #expect(throws: HaulError.self, "\(bad)") { try Netrc(parsing: bad) }
        }
    }

    @Test func credentialsAreTheAuthorizationHeader() {
        var request = DownloadRequest(url: "http://h/x", destination: .file("/tmp/x"), headers: [("X-A", "1")])
        request.credentials = BasicCredentials(parsing: "user:pa:ss")
        #expect(request.credentials == BasicCredentials(user: "user", password: "pa:ss"))
        #expect(request.headers.map(\.name) == ["X-A", "Authorization"])
        #expect(request.headers.last?.value == "Basic dXNlcjpwYTpzcw==")
        request.credentials = nil
        #expect(request.headers.map(\.name) == ["X-A"])
        #expect(BasicCredentials(parsing: "solo") == BasicCredentials(user: "solo", password: ""))
    }

    @Test func basicCredentialsReachTheOriginAndNotAnother() async throws {
        try await HaulTestServer.withRunning { origin in
            try await HaulTestServer.withRunning { other in
                let secure = TestResource(name: "secure", size: 20_000)
                var guarded = secure
                guarded.requiredAuthorization = BasicCredentials(user: "u", password: "p4ss").authorization
                origin.add("/secure", guarded)
                origin.add("/away", .redirect(to: other.url("/file")))
                other.add("/file", TestResource(name: "file", size: 1000))
                try await withTemporaryDirectory { directory in
                    var request = DownloadRequest(url: origin.url("/secure"), destination: .file(directory + "/s"))
                    // Without credentials: 401, nothing kept under the final name.
                    let refused = await expectHaulError(.httpStatus) {
                        try await withDownloader { try await $0.download(request) }
                    }
                    #expect(refused?.status == 401)
                    #expect(!POSIX.exists(directory + "/s"))
                    request.credentials = BasicCredentials(user: "u", password: "p4ss")
                    try await withDownloader { try await $0.download(request) }
                    #expect(try readFile(directory + "/s") == secure.content)
                    var away = DownloadRequest(url: origin.url("/away"), destination: .file(directory + "/a"))
                    away.credentials = BasicCredentials(user: "u", password: "p4ss")
                    try await withDownloader { try await $0.download(away) }
                    #expect(origin.requests(for: "/away").first?.header("authorization") != nil)
                    #expect(other.requests.first?.header("authorization") == nil, "credentials stay with their origin")
                    for name in listDirectory(directory) {
                        #expect(!String(decoding: try readFile(directory + "/" + name), as: UTF8.self).contains("p4ss"))
                    }
                }
            }
        }
    }

    @Test(
        "a cookie goes where its domain, path, scheme and expiry allow",
        arguments: [
            ("http://files.example.com/dl/a", true), ("http://files.example.com/dl", true),
            ("http://files.example.com/dlx", false), ("http://files.example.com/", false),
            ("http://sub.files.example.com/dl/a", false), ("http://example.com/dl/a", false),
        ])
    func cookieMatching(url: String, sent: Bool) throws {
        let jar = CookieJar(cookies: [CookieJar.Cookie(domain: "files.example.com", path: "/dl", name: "s", value: "1")]
        )
        #expect((jar.header(for: try #require(URL(string: url)), now: 100) != nil) == sent)
    }

    @Test func cookieRulesForSubdomainsSecureAndExpiry() throws {
        let jar = CookieJar(cookies: [
            CookieJar.Cookie(domain: "example.com", includeSubdomains: true, name: "wide", value: "1"),
            CookieJar.Cookie(domain: "example.com", secure: true, name: "tls", value: "2"),
            CookieJar.Cookie(domain: "example.com", expires: 50, name: "old", value: "3"),
        ])
        #expect(jar.header(for: try #require(URL(string: "http://a.example.com/x")), now: 100) == "wide=1")
        #expect(jar.header(for: try #require(URL(string: "https://example.com/x")), now: 100) == "wide=1; tls=2")
        #expect(jar.header(for: try #require(URL(string: "http://example.com/x")), now: 10) == "wide=1; old=3")
        #expect(jar.header(for: try #require(URL(string: "http://badexample.com/x")), now: 10) == nil)
    }

    @Test func setCookieIsStoredAsRFC6265Says() throws {
        let jar = CookieJar()
        let url = try #require(URL(string: "https://www.example.com/files/report.pdf"))
        jar.store(
            setCookie: [
                "session=abc; Path=/; Secure; HttpOnly", "pref=x", "wide=1; Domain=.example.com; Max-Age=60",
                "foreign=1; Domain=evil.example", "dated=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT",
            ], from: url, now: 1_795_000_000)
        let names = Set(jar.cookies.map(\.name))
        #expect(names == ["session", "pref", "wide"], "a foreign domain and an expired date are refused")
        let pref = try #require(jar.cookies.first { $0.name == "pref" })
        #expect(pref.path == "/files" && pref.domain == "www.example.com" && !pref.includeSubdomains)
        #expect(jar.cookies.first { $0.name == "wide" }?.expires == 1_795_000_060)
        jar.store(setCookie: ["session=gone; Path=/; Max-Age=0"], from: url, now: 1_795_000_001)
        #expect(!jar.cookies.contains { $0.name == "session" })
    }

    @Test func netscapeFilesRoundTrip() throws {
        let text = """
            # Netscape HTTP Cookie File
            .example.com\tTRUE\t/\tFALSE\t0\twide\t1
            #HttpOnly_files.example.com\tFALSE\t/dl\tTRUE\t4102444800\tsid\tabc

            old.example\tFALSE\t/\tFALSE\t5\tgone\tx
            """
        let jar = try CookieJar(netscape: text, now: 100)
        #expect(jar.cookies.map(\.name) == ["wide", "sid"], "expired cookies are not read")
        let sid = try #require(jar.cookies.last)
        #expect(sid.httpOnly && sid.secure && sid.path == "/dl" && sid.expires == 4_102_444_800)
        let again = try CookieJar(netscape: jar.netscapeText(now: 100), now: 100)
        #expect(again.cookies == jar.cookies)
        #expect(throws: HaulError.self) { try CookieJar(netscape: "not a cookie line", now: 0) }
    }

    @Test func cookiesFollowSameSiteRedirectsAndLearnFromSetCookie() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "members", size: 30_000)
            var guarded = resource
            guarded.requiredCookie = "login=ok"
            server.add("/members", guarded)
            // The sign-in page sets the cookie and sends the client on, as a login flow does.
            var signIn = TestResource.redirect(to: "/members")
            signIn.setCookies = ["login=ok; Path=/"]
            server.add("/sign-in", signIn)
            // On the same host under another name, the cookie is not sent.
            server.add("/elsewhere", .redirect(to: server.url("/members", host: "localhost")))
            try await withTemporaryDirectory { directory in
                let jar = CookieJar(cookies: [CookieJar.Cookie(domain: "127.0.0.1", name: "theme", value: "dark")])
                let request = DownloadRequest(
                    url: server.url("/sign-in"), destination: .file(directory + "/m"), cookies: jar)
                try await withDownloader { try await $0.download(request) }
                #expect(try readFile(directory + "/m") == resource.content)
                #expect(server.requests(for: "/sign-in").first?.header("cookie") == "theme=dark")
                let members = try #require(server.requests(for: "/members").first?.header("cookie"))
                #expect(
                    Set(members.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }) == [
                        "theme=dark", "login=ok",
                    ])
                let elsewhere = DownloadRequest(
                    url: server.url("/elsewhere"), destination: .file(directory + "/e"), cookies: jar)
                await expectHaulError(.httpStatus) { try await withDownloader { try await $0.download(elsewhere) } }
                #expect(server.requests(for: "/members").last?.header("cookie") == nil)
                for name in listDirectory(directory) {
                    let text = String(decoding: try readFile(directory + "/" + name), as: UTF8.self)
                    #expect(!text.contains("login=ok") && !text.contains("dark"))
                }
            }
        }
    }

    @Test func secretHeadersStayWithTheirOriginAndOutOfTheStateDirectory() async throws {
        try await HaulTestServer.withRunning { origin in
            try await HaulTestServer.withRunning { other in
                let resource = TestResource(name: "elsewhere", size: 20_000)
                other.add("/file", resource)
                origin.add("/away", .redirect(to: other.url("/file")))
                let secrets = [
                    ("X-Api-Key", "k-3141"), ("Proxy-Authorization", "Basic cHJveHk6cA=="),
                    ("X-Upload-Signature", "sig-2718"), ("Private-Token", "t-1618"), ("X-Custom", "c-1414"),
                ]
                try await withTemporaryDirectory { directory in
                    var request = DownloadRequest(
                        url: origin.url("/away"), destination: .file(directory + "/f"),
                        headers: secrets + [("X-Plain", "plain-value")])
                    request.secretHeaders = ["x-custom"]
                    try await withManager(directory + "/state") { manager in
                        let id = try await manager.enqueue(request)
                        await manager.runUntilIdle()
                        #expect(await manager.download(id)?.state == .completed)
                    }
                    #expect(try readFile(directory + "/f") == resource.content)
                    // The origin got every header; the other origin only the plain one.
                    let first = try #require(origin.requests(for: "/away").first)
                    for (name, value) in secrets { #expect(first.header(name) == value, "\(name) to its origin") }
                    let second = try #require(other.requests(for: "/file").first)
                    for (name, _) in secrets { #expect(second.header(name) == nil, "\(name) left its origin") }
                    #expect(second.header("x-plain") == "plain-value")
                    // Nothing secret in the state directory, which only its owner may enter.
                    let state = directory + "/state"
                    var status = stat()
                    #expect(stat(state, &status) == 0 && status.st_mode & 0o777 == 0o700)
                    // Every file, read in one pass that none went away from: the database's journal
                    // goes when its connection closes, a moment after the manager's close.
                    var texts: [(name: String, text: String)] = []
                    func listed() -> [String] { listDirectory(state).filter { !$0.hasPrefix("owners") } }
                    for _ in 0..<100 {
                        let names = listed()
                        texts = names.compactMap { name in
                            guard stat(state + "/" + name, &status) == 0, let bytes = try? readFile(state + "/" + name)
                            else { return nil }
                            #expect(status.st_mode & 0o077 == 0, "\(name)")
                            return (name, String(decoding: bytes, as: UTF8.self))
                        }
                        if texts.count == names.count && listed() == names { break }
                        try await Task.sleep(for: .milliseconds(20))
                    }
                    for (name, text) in texts {
                        for (_, value) in secrets { #expect(!text.contains(value), "\(value) in \(name)") }
                    }
                    #expect(texts.contains { $0.text.contains("plain-value") }, "the plain header is stored")
                }
            }
        }
    }

    @Test func credentialsInAURLAreBasicCredentialsForItsOriginAndLeaveTheURL() async throws {
        var request = DownloadRequest(url: "https://us%40er:p%3Ass@example.com:8443/a?b=c", destination: .file("/x"))
        #expect(request.url == "https://example.com:8443/a?b=c")
        #expect(request.credentials == BasicCredentials(user: "us@er", password: "p:ss"))
        request.url = "http://only@example.com/f"
        #expect(request.url == "http://example.com/f")
        #expect(request.credentials == BasicCredentials(user: "us@er", password: "p:ss"), "given ones win")
        #expect(
            DownloadRequest(url: "http://example.com/a@b", destination: .file("/x")).url == "http://example.com/a@b")
        var mirrored = DownloadRequest(url: "http://example.com/f", destination: .file("/x"))
        mirrored.mirrors = ["http://u:p@mirror.example/f"]
        #expect(throws: HaulError.self) { try mirrored.check() }

        try await HaulTestServer.withRunning { origin in
            try await HaulTestServer.withRunning { other in
                let resource = TestResource(name: "guarded", size: 20_000)
                var guarded = resource
                guarded.requiredAuthorization = BasicCredentials(user: "u", password: "p4ss").authorization
                origin.add("/guarded", guarded)
                origin.add("/away", .redirect(to: other.url("/file")))
                other.add("/file", TestResource(name: "file", size: 1000))
                try await withTemporaryDirectory { directory in
                    let url = origin.url("/guarded").replacingOccurrences(of: "http://", with: "http://u:p4ss@")
                    let away = origin.url("/away").replacingOccurrences(of: "http://", with: "http://u:p4ss@")
                    try await withManager(directory + "/state") { manager in
                        let id = try await manager.enqueue(
                            DownloadRequest(url: url, destination: .file(directory + "/g")))
                        let moved = try await manager.enqueue(
                            DownloadRequest(url: away, destination: .file(directory + "/a")))
                        await manager.runUntilIdle()
                        #expect(await manager.download(id)?.state == .completed)
                        #expect(await manager.download(id)?.url == origin.url("/guarded"))
                        #expect(await manager.download(moved)?.state == .completed)
                    }
                    #expect(try readFile(directory + "/g") == resource.content)
                    #expect(other.requests(for: "/file").first?.header("authorization") == nil)
                    for name in listDirectory(directory + "/state") where !name.hasPrefix("owners") {
                        // The database's write-ahead log may go as its last connection closes.
                        let path = directory + "/state/" + name
                        guard let bytes = try? readFile(path) else {
                            #expect(!POSIX.exists(path), "\(name) cannot be read")
                            continue
                        }
                        let text = String(decoding: bytes, as: UTF8.self)
                        #expect(!text.contains("p4ss") && !text.contains("u:p4ss"), "\(name)")
                    }
                }
            }
        }
    }

    @Test(arguments: [
        ("Authorization", true), ("proxy-authorization", true), ("Cookie", true), ("X-Api-Key", true),
        ("X-Auth-Token", true), ("Private-Token", true), ("X-Client-Secret", true), ("Ocp-Apim-Subscription-Key", true),
        ("X-Session-Id", true), ("Accept", false), ("User-Agent", false), ("X-Request-Id", false), ("Referer", false),
    ])
    func headersThatLookLikeCredentialsAreSecret(name: String, secret: Bool) {
        #expect(DownloadRequest.looksSecret(name) == secret)
    }
}
