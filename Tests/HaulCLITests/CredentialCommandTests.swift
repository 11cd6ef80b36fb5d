import Foundation
import Haul
import HaulTestServer
import Testing

/// `-u`, `--netrc`, `--load-cookies` and `--save-cookies` as users run them: credentials reach their
/// site, are never written anywhere, and a resume without them says what to do.
@Suite(.timeLimit(.minutes(3)), .serialized)
struct CredentialCommandTests {
    static let password = "pa55-w0rd-never-stored"

    /// Fails when any file under `directory` holds one of `secrets`.
    func expectNoSecret(in directory: String, _ secrets: [String]) throws {
        let files = FileManager.default.enumerator(atPath: directory)?.allObjects as? [String] ?? []
        for file in files {
            let path = directory + "/" + file
            guard let data = FileManager.default.contents(atPath: path) else { continue }
            let text = String(decoding: data, as: UTF8.self)
            for secret in secrets { #expect(!text.contains(secret), "\(file) holds a secret") }
        }
    }

    @Test func userAndNetrcCredentialsAndTheHintWhenAResumeLacksThem() async throws {
        try await HaulTestServer.withRunning { server in
            var resource = TestResource(name: "private.bin", size: 3_000_000)
            resource.requiredAuthorization = BasicCredentials(user: "alice", password: Self.password).authorization
            server.add("/private.bin", resource)
            server.setStandingFaults("/private.bin", [.throttle(bytesPerSecond: 500_000)])
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            let file = directory + "/private.bin"
            // Without credentials: one line with the hint, exit 4.
            let refused = try await HaulProcess.run(
                ["get", server.url("/private.bin"), "-o", file, "--state-dir", state, "-x", "1"])
            #expect(refused.status == 4, "\(refused.errors)")
            let line = refused.errors.split(separator: "\n").last.map(String.init) ?? ""
            #expect(line.contains("401") && line.contains("-u USER:PASSWORD or --netrc"), "\(refused.errors)")
            // With -u: interrupted part-way.
            let get = try HaulProcess([
                "get", server.url("/private.bin"), "-o", file, "--state-dir", state, "-x", "1", "-u",
                "alice:\(Self.password)",
            ])
            while (size(file + ".haul.part") ?? 0) < 300_000 { try await Task.sleep(for: .milliseconds(20)) }
            get.signal(SIGINT)
            #expect(try await get.finish().status == 130)
            let kept = try #require(size(file + ".haul.part"))
            try expectNoSecret(in: directory, [Self.password, resource.requiredAuthorization ?? ""])
            // A resume without them: refused with the hint, the partial data kept.
            let listed = try await HaulProcess.run(["ls", "--json", "--state-dir", state])
            let id = try #require(
                (try JSONSerialization.jsonObject(with: Data(listed.output.utf8)) as? [[String: Any]])?.first?["id"]
                    as? Int)
            let bare = try await HaulProcess.run(["resume", "\(id)", "--state-dir", state, "-q"])
            #expect(bare.status == 4 && bare.errors.contains("--netrc"), "\(bare.errors)")
            #expect(size(file + ".haul.part") == kept)
            // A netrc others can read is refused; a private one gives the credentials.
            let netrc = directory + "/netrc"
            try "machine 127.0.0.1\n  login alice\n  password \(Self.password)\n".write(
                toFile: netrc, atomically: true, encoding: .utf8)
            try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: netrc)
            let open = try await HaulProcess.run(["resume", "\(id)", "--netrc-file", netrc, "--state-dir", state])
            #expect(open.status == 2 && open.errors.contains("chmod 600"), "\(open.errors)")
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: netrc)
            // Credentials written into --url win over the netrc file's, as for a new download.
            let port = try #require(server.url("/private.bin").split(separator: ":").last)
            let wrong = try await HaulProcess.run([
                "resume", "\(id)", "--url", "http://alice:wrong-password@127.0.0.1:\(port)", "--netrc-file", netrc,
                "--state-dir", state, "-q",
            ])
            #expect(wrong.status == 4, "\(wrong.errors)")
            #expect(
                server.requests(for: "/private.bin").last?.header("authorization")
                    == BasicCredentials(user: "alice", password: "wrong-password").authorization)
            #expect(size(file + ".haul.part") == kept)
            server.setStandingFaults("/private.bin", [])
            let before = server.requests(for: "/private.bin").count
            let resumed = try await HaulProcess.run([
                "resume", "\(id)", "--netrc-file", netrc, "--state-dir", state, "-q",
            ])
            #expect(resumed.status == 0, "\(resumed.errors)")
            let identical = contents(file) == resource.content
            #expect(identical, "the resumed file equals the server's")
            let resume = try #require(server.requests(for: "/private.bin").dropFirst(before).first)
            #expect(resume.header("range") == "bytes=\(kept)-" && resume.header("if-range") == resource.entityTagValue)
            try expectNoSecret(in: directory + "/state", [Self.password, resource.requiredAuthorization ?? ""])
        }
    }

    @Test func secretHeadersAndAPasswordInTheURLStayWithTheirSiteAndOffDisk() async throws {
        try await HaulTestServer.withRunning { origin in
            try await HaulTestServer.withRunning { other in
                let resource = TestResource(name: "moved.bin", size: 200_000)
                other.add("/moved.bin", resource)
                origin.add("/moved.bin", .redirect(to: other.url("/moved.bin")))
                let directory = try makeTemporaryDirectory()
                defer { try? FileManager.default.removeItem(atPath: directory) }
                let state = directory + "/state"
                // A mark for a header not given is a typo: refused before anything is done.
                let typo = try await HaulProcess.run([
                    "get", origin.url("/moved.bin"), "--secret-header", "X-Tokn", "--state-dir", state,
                ])
                #expect(typo.status == 64 && typo.errors.contains("--secret-header X-Tokn"), "\(typo.errors)")
                let url = origin.url("/moved.bin").replacingOccurrences(of: "http://", with: "http://bob:pw-1123@")
                let get = try await HaulProcess.run([
                    "get", url, "-o", directory + "/f", "--state-dir", state, "--no-daemon", "-q",
                    "-H", "X-Api-Key: key-5813", "-H", "X-Team: team-2134", "--secret-header", "x-team",
                    "-H", "X-Plain: plain-3455",
                ])
                #expect(get.status == 0, "\(get.errors)")
                #expect(contents(directory + "/f") == resource.content)
                let first = try #require(origin.requests(for: "/moved.bin").first)
                #expect(first.header("x-api-key") == "key-5813" && first.header("x-team") == "team-2134")
                #expect(
                    first.header("authorization") == BasicCredentials(user: "bob", password: "pw-1123").authorization)
                let moved = try #require(other.requests(for: "/moved.bin").first)
                for name in ["x-api-key", "x-team", "authorization"] { #expect(moved.header(name) == nil, "\(name)") }
                #expect(moved.header("x-plain") == "plain-3455")
                try expectNoSecret(in: state, ["key-5813", "team-2134", "pw-1123"])
                let listed = try await HaulProcess.run(["ls", "--json", "--state-dir", state])
                #expect(!listed.output.contains("pw-1123") && listed.output.contains(origin.url("/moved.bin")))
            }
        }
    }

    @Test func cookiesAreLoadedSentAndSavedForCurl() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "members.bin", size: 200_000)
            var guarded = resource
            guarded.requiredCookie = "login=secret-cookie-value"
            server.add("/members.bin", guarded)
            var signIn = TestResource.redirect(to: "/members.bin")
            signIn.setCookies = ["login=secret-cookie-value; Path=/; Max-Age=3600"]
            server.add("/sign-in", signIn)
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let state = directory + "/state"
            let loaded = directory + "/in.txt"
            let saved = directory + "/out.txt"
            try "# Netscape HTTP Cookie File\n127.0.0.1\tFALSE\t/\tFALSE\t0\ttheme\tdark\n".write(
                toFile: loaded, atomically: true, encoding: .utf8)
            let get = try await HaulProcess.run([
                "get", server.url("/sign-in"), "-o", directory + "/members.bin", "--load-cookies", loaded,
                "--save-cookies", saved, "--state-dir", state, "-q",
            ])
            #expect(get.status == 0, "\(get.errors)")
            let identical = contents(directory + "/members.bin") == resource.content
            #expect(identical, "the file equals the server's")
            #expect(server.requests(for: "/sign-in").first?.header("cookie") == "theme=dark")
            let attributes = try FileManager.default.attributesOfItem(atPath: saved)
            #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
            let text = try String(contentsOfFile: saved, encoding: .utf8)
            #expect(text.contains("\tlogin\tsecret-cookie-value") && text.contains("\ttheme\tdark"), "\(text)")
            try expectNoSecret(in: state, ["secret-cookie-value"])
            #expect(
                !(FileManager.default.enumerator(atPath: directory)?.allObjects as? [String] ?? []).contains {
                    $0.hasSuffix(".haul.json")
                })
            // curl reads the saved file and sends its cookies.
            let curl = Process()
            curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
            curl.arguments = ["-s", "-m", "20", "-o", "/dev/null", "-b", saved, server.url("/members.bin")]
            try curl.run()
            // Waited for without holding a thread: the server that answers it runs on the same few.
            let deadline = ContinuousClock.now + .seconds(30)
            while curl.isRunning {
                guard ContinuousClock.now < deadline else {
                    kill(curl.processIdentifier, SIGKILL)
                    throw CLITestFailure("curl did not exit within 30 s")
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(curl.terminationStatus == 0)
            let sent = try #require(server.requests(for: "/members.bin").last?.header("cookie"))
            #expect(sent.contains("login=secret-cookie-value") && sent.contains("theme=dark"), "\(sent)")
        }
    }

    @Test func noSecretOfAnyKindReachesTheStateOrTheDownloadsFolder() async throws {
        try await HaulTestServer.withRunning { server in
            let proxySecret = "proxy-secret-17"
            let netrcSecret = "netrc-secret-23"
            let cookieSecret = "cookie-secret-31"
            var guarded = TestResource(name: "all.bin", size: 500_000)
            guarded.requiredAuthorization = BasicCredentials(user: "ann", password: netrcSecret).authorization
            guarded.requiredCookie = "session=\(cookieSecret)"
            guarded.setCookies = ["seen=\(cookieSecret)-2; Path=/"]
            server.add("/all.bin", guarded)
            let resource = guarded
            let proxyAuthorization = BasicCredentials(user: "p", password: proxySecret).authorization
            try await TestProxy.withRunning(.http, requiredAuthorization: proxyAuthorization) { proxy in
                let work = try makeTemporaryDirectory()
                defer { try? FileManager.default.removeItem(atPath: work) }
                // The user's own files (netrc, cookie files) live apart from what haul writes.
                let own = work + "/own"
                let downloads = work + "/downloads"
                let state = work + "/state"
                try FileManager.default.createDirectory(atPath: own, withIntermediateDirectories: true)
                try "machine 127.0.0.1 login ann password \(netrcSecret)\n".write(
                    toFile: own + "/netrc", atomically: true, encoding: .utf8)
                try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: own + "/netrc")
                try "127.0.0.1\tFALSE\t/\tFALSE\t0\tsession\t\(cookieSecret)\n".write(
                    toFile: own + "/cookies", atomically: true, encoding: .utf8)
                let get = try await HaulProcess.run(
                    [
                        "get", "--json", server.url("/all.bin"), "-d", downloads, "--state-dir", state, "--netrc-file",
                        own + "/netrc", "--load-cookies", own + "/cookies", "--save-cookies", own + "/saved",
                    ], environment: ["http_proxy": "http://p:\(proxySecret)@127.0.0.1:\(proxy.port)"])
                #expect(get.status == 0, "\(get.errors)")
                let identical = contents(downloads + "/all.bin") == resource.content
                #expect(identical)
                #expect(proxy.seen.last?.header("proxy-authorization") == proxyAuthorization)
                let secrets = [
                    proxySecret, netrcSecret, cookieSecret, proxyAuthorization,
                    resource.requiredAuthorization ?? "",
                ]
                try expectNoSecret(in: state, secrets)
                try expectNoSecret(in: downloads, secrets)
                for text in [get.output, get.errors] {
                    for secret in secrets { #expect(!text.contains(secret)) }
                }
                // What the servers set was saved where asked, for the user.
                #expect(try String(contentsOfFile: own + "/saved", encoding: .utf8).contains("\(cookieSecret)-2"))
            }
        }
    }
}
