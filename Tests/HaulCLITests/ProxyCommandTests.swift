import Foundation
import Haul
import HaulTestServer
import Testing

/// The proxy variables and options with curl's rules, through the built `haul`, against an
/// in-process proxy that records what it was asked.
@Suite(.timeLimit(.minutes(2)), .serialized)
struct ProxyCommandTests {
    /// Runs `haul get` of `/file` into a new directory with `environment` and `options`; returns its
    /// result and whether the proxy saw the request.
    func get(
        _ server: HaulTestServer, _ proxy: TestProxy, environment: [String: String], _ options: [String] = []
    ) async throws -> (status: Int32, errors: String, proxied: Bool) {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let before = proxy.seen.count
        let result = try await HaulProcess.run(
            [
                "get", server.url("/file"), "-o", directory + "/file", "-q", "--state-dir", directory + "/state",
                "--retries", "0",
            ] + options, environment: environment)
        if result.status == 0 {
            #expect(contents(directory + "/file")?.count == 50_000)
        }
        return (result.status, result.errors, proxy.seen.count > before)
    }

    @Test func theVariablesAndOptionsChooseAsCurlDoes() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/file", TestResource(name: "file", size: 50_000))
            try await TestProxy.withRunning(.http) { proxy in
                let url = proxy.url
                let cases: [([String: String], [String], Bool)] = [
                    (["http_proxy": url], [], true),
                    // Upper-case HTTP_PROXY is ignored: a CGI program gets it from a request header.
                    (["HTTP_PROXY": url], [], false),
                    (["all_proxy": url], [], true),
                    (["ALL_PROXY": url], [], true),
                    (["https_proxy": url], [], false),
                    (["http_proxy": url, "no_proxy": "example.com, 127.0.0.1"], [], false),
                    (["http_proxy": url, "NO_PROXY": "*"], [], false),
                    (["http_proxy": url, "no_proxy": "127.0.0.1"], ["--no-proxy", "example.com"], true),
                    (["http_proxy": url], ["--proxy", ""], false),
                    ([:], ["--proxy", url], true),
                ]
                for (environment, options, proxied) in cases {
                    let result = try await get(server, proxy, environment: environment, options)
                    #expect(result.status == 0, "\(environment) \(options): \(result.errors)")
                    #expect(result.proxied == proxied, "\(environment) \(options)")
                }
            }
        }
    }

    @Test func aBadProxyVariableIsNamedAndItsCredentialsAreNeverWritten() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/file", TestResource(name: "file", size: 50_000))
            let secret = "pr0xy-pa55"
            let authorization = BasicCredentials(user: "me", password: secret).authorization
            try await TestProxy.withRunning(.http, requiredAuthorization: authorization) { proxy in
                let bad = try await get(server, proxy, environment: ["http_proxy": "ftp://me:\(secret)@proxy"])
                #expect(bad.status == 2, "\(bad.errors)")
                #expect(bad.errors.contains("http_proxy") && !bad.errors.contains(secret), "\(bad.errors)")
                let directory = try makeTemporaryDirectory()
                defer { try? FileManager.default.removeItem(atPath: directory) }
                let environment = ["http_proxy": "http://me:\(secret)@127.0.0.1:\(proxy.port)"]
                let result = try await HaulProcess.run(
                    [
                        "get", "--json", server.url("/file"), "-o", directory + "/file", "--state-dir",
                        directory + "/state",
                    ],
                    environment: environment)
                #expect(result.status == 0, "\(result.errors)")
                #expect(proxy.seen.last?.header("proxy-authorization") == authorization)
                let listed = try await HaulProcess.run(["ls", "--json", "--state-dir", directory + "/state"])
                for text in [result.output, result.errors, listed.output] { #expect(!text.contains(secret)) }
                let files = FileManager.default.enumerator(atPath: directory)?.allObjects as? [String] ?? []
                for file in files {
                    let data = FileManager.default.contents(atPath: directory + "/" + file) ?? Data()
                    #expect(!String(decoding: data, as: UTF8.self).contains(secret), "\(file)")
                }
            }
        }
    }
}
