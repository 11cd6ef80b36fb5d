import Foundation
import HaulTestServer
import Testing

@testable import Haul

/// Proxies as curl users know them: URLs, `no_proxy` rules, and downloads through an in-process
/// HTTP proxy (forwarding and CONNECT) and SOCKS5 proxy that record what they were asked.
@Suite(.timeLimit(.minutes(1)))
struct ProxyTests {
    @Test func proxyURLsAreReadAsCurlReadsThem() throws {
        let full = try Proxy(parsing: "http://user:p%40ss@proxy.example:3128")
        #expect(full.kind == .http && full.host == "proxy.example" && full.port == 3128)
        #expect(full.credentials == BasicCredentials(user: "user", password: "p@ss"))
        #expect(full.description == "http://proxy.example:3128", "no password shown")
        #expect(try Proxy(parsing: "proxy.example") == Proxy(kind: .http, host: "proxy.example", port: 1080))
        #expect(try Proxy(parsing: "socks5h://127.0.0.1:1081").kind == .socks5h)
        for bad in ["ftp://proxy", "socks5://u:secret@proxy", "http://", "http://proxy:0"] {
            let error = #expect(throws: HaulError.self, "\(bad)") { try Proxy(parsing: bad) }
            #expect(error?.message.contains("secret") == false, "the password is not shown: \(error?.message ?? "")")
        }
    }

    @Test(
        "no_proxy matches host names, their subdomains, addresses, ranges and *",
        arguments: [
            ("example.com", "example.com", true), ("files.example.com", "example.com", true),
            ("files.example.com", ".example.com", true), ("badexample.com", "example.com", false),
            ("example.com.evil", "example.com", false), ("10.1.2.3", "10.0.0.0/8", true),
            ("11.1.2.3", "10.0.0.0/8", false), ("192.168.1.7", "192.168.1.7", true), ("::1", "::1", true),
            ("[::1]", "::1", true), ("fd00::5", "fd00::/8", true), ("fe80::5", "fd00::/8", false),
            ("anything.example", "*", true), ("127.0.0.1", "localhost", false),
            ("EXAMPLE.COM", "Example.Com", true),
        ])
    func noProxyMatching(host: String, pattern: String, bypasses: Bool) {
        #expect(ProxySettings.bypasses(host, ["unrelated.test", pattern]) == bypasses)
    }

    @Test func httpDownloadsGoThroughTheProxyAndCredentialsOnlyToIt() async throws {
        try await HaulTestServer.withRunning { server in
            let authorization = BasicCredentials(user: "proxy-user", password: "proxy-s3cret").authorization
            try await TestProxy.withRunning(.http, requiredAuthorization: authorization) { proxy in
                try await withTemporaryDirectory { directory in
                    let resource = TestResource(name: "through", size: 400_000)
                    server.add("/through", resource)
                    var configuration = testConfiguration(retries: 0)
                    configuration.proxy.http = try Proxy(
                        parsing: "http://proxy-user:proxy-s3cret@127.0.0.1:\(proxy.port)")
                    try await withDownloader(configuration) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/through"), destination: .file(directory + "/t")))
                    }
                    let identical = try readFile(directory + "/t") == resource.content
                    #expect(identical)
                    let seen = try #require(proxy.seen.first)
                    // An http target is forwarded, as curl forwards it: the proxy gets the absolute URL.
                    #expect(
                        seen.method == "GET" && seen.target == server.url("/through"), "\(seen.method) \(seen.target)")
                    #expect(seen.header("proxy-authorization") == authorization)
                    // The origin got the request from the proxy, without the proxy's credentials.
                    let origin = server.requests(for: "/through")
                    #expect(!origin.isEmpty && origin.allSatisfy { $0.header("via") == "1.1 haul-test-proxy" })
                    #expect(origin.allSatisfy { $0.header("proxy-authorization") == nil })
                    // Wrong credentials: one clear failure, not retries.
                    configuration.proxy.http = try Proxy(parsing: "http://proxy-user:wrong@127.0.0.1:\(proxy.port)")
                    let refused = await expectHaulError(.httpStatus) {
                        try await withDownloader(configuration) { downloader in
                            try await downloader.download(
                                DownloadRequest(url: server.url("/through"), destination: .file(directory + "/w")))
                        }
                    }
                    #expect(refused?.status == 407 && refused?.message.contains("wrong") == false)
                    for name in listDirectory(directory) {
                        let text = String(decoding: try readFile(directory + "/" + name), as: UTF8.self)
                        #expect(!text.contains("proxy-s3cret"))
                    }
                }
            }
        }
    }

    @Test func httpsGoesThroughConnectWithTheTargetsCertificateChecked() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            try await TestProxy.withRunning(.http) { proxy in
                try await withTemporaryDirectory { directory in
                    let resource = TestResource(name: "tunnel", size: 300_000)
                    server.add("/tunnel", resource)
                    var configuration = testConfiguration(retries: 0)
                    configuration.proxy.https = try Proxy(parsing: proxy.url)
                    // Not trusting the test server's authority: the tunnel does not make it trusted.
                    await expectHaulError(.tls) {
                        try await withDownloader(configuration) { downloader in
                            try await downloader.download(
                                DownloadRequest(url: server.url("/tunnel"), destination: .file(directory + "/x")))
                        }
                    }
                    configuration = try trustingTestServer(configuration, in: directory)
                    try await withDownloader(configuration) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/tunnel"), destination: .file(directory + "/t")))
                    }
                    let identical = try readFile(directory + "/t") == resource.content
                    #expect(identical)
                    #expect(proxy.seen.allSatisfy { $0.method == "CONNECT" && $0.target == "127.0.0.1:\(server.port)" })
                    #expect(proxy.seen.count >= 2)
                }
            }
        }
    }

    @Test func aResumeThroughTheProxyKeepsRangeAndIfRange() async throws {
        try await HaulTestServer.withRunning { server in
            try await TestProxy.withRunning(.http) { proxy in
                try await withTemporaryDirectory { directory in
                    let resource = TestResource(name: "resumed", size: 2_000_000)
                    server.add("/resumed", resource)
                    server.setStandingFaults("/resumed", [.throttle(bytesPerSecond: 1_000_000)])
                    var configuration = testConfiguration()
                    configuration.proxy.http = try Proxy(parsing: proxy.url)
                    let destination = directory + "/r"
                    let request = DownloadRequest(url: server.url("/resumed"), destination: .file(destination))
                    try await downloadUntil(request, configuration) {
                        (fileSize(destination + ".haul.part") ?? 0) > 200_000
                    }
                    server.setStandingFaults("/resumed", [])
                    let stored = try #require(try ManifestStore.load(DownloadPaths.open(destination)))
                    try await withDownloader(configuration) { try await $0.download(request) }
                    let identical = try readFile(destination) == resource.content
                    #expect(identical)
                    let resume = try #require(server.requests(for: "/resumed").last)
                    #expect(resume.header("range") == "bytes=\(stored.segments.first?.written ?? -1)-")
                    #expect(resume.header("if-range") == resource.entityTagValue)
                    #expect(proxy.seen.count == server.requests(for: "/resumed").count, "every request went through it")
                    // The proxy saw the resume's Range and If-Range on their way.
                    let forwarded = try #require(proxy.seen.last)
                    #expect(forwarded.header("range") == resume.header("range"))
                    #expect(forwarded.header("if-range") == resource.entityTagValue)
                }
            }
        }
    }

    @Test func aDownloadInRangesIsForwardedRequestByRequest() async throws {
        try await HaulTestServer.withRunning { server in
            try await TestProxy.withRunning(.http) { proxy in
                try await withTemporaryDirectory { directory in
                    let resource = TestResource(name: "ranges", size: 3 << 20)
                    server.add("/ranges", resource)
                    server.setStandingFaults("/ranges", [.throttle(bytesPerSecond: 3 << 20)])
                    var configuration = segmentedConfiguration(connections: 3)
                    configuration.proxy.http = try Proxy(parsing: proxy.url)
                    try await withDownloader(configuration) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/ranges"), destination: .file(directory + "/r")))
                    }
                    let identical = try readFile(directory + "/r") == resource.content
                    #expect(identical)
                    let ranges = proxy.seen.compactMap { $0.header("range") }
                    #expect(ranges.count >= 3, "\(ranges)")
                    #expect(proxy.seen.allSatisfy { $0.method == "GET" && $0.target == server.url("/ranges") })
                    #expect(server.requests(for: "/ranges").allSatisfy { $0.header("via") != nil })
                }
            }
        }
    }

    @Test func socksProxiesAreHandedNamesOrAddressesAsTheURLHasThem() async throws {
        try await HaulTestServer.withRunning { server in
            try await TestProxy.withRunning(.socks5) { proxy in
                try await withTemporaryDirectory { directory in
                    let resource = TestResource(name: "socks", size: 100_000)
                    server.add("/socks", resource)
                    var configuration = testConfiguration(retries: 0)
                    configuration.proxy.http = try Proxy(parsing: proxy.url)
                    for (host, type) in [("localhost", "domain"), ("127.0.0.1", "ipv4")] {
                        try await withDownloader(configuration) { downloader in
                            try await downloader.download(
                                DownloadRequest(
                                    url: server.url("/socks", host: host), destination: .file(directory + "/" + host)))
                        }
                        let identical = try readFile(directory + "/" + host) == resource.content
                        #expect(identical)
                        let seen = try #require(proxy.seen.last)
                        #expect(seen.addressType == type && seen.target == "\(host):\(server.port)", "\(seen)")
                    }
                }
            }
        }
    }

    @Test func aSocks5ProxyIsGivenTheAddressHaulResolvedAndTheCertificateIsCheckedForTheName() async throws {
        try await HaulTestServer.withRunning(transport: .tls) { server in
            try await TestProxy.withRunning(.socks5) { proxy in
                try await withTemporaryDirectory { directory in
                    let resource = TestResource(name: "local", size: 200_000)
                    server.add("/local", resource)
                    var configuration = try trustingTestServer(testConfiguration(retries: 0), in: directory)
                    // socks5:// (not socks5h://): names are resolved here, as curl does.
                    configuration.proxy.https = try Proxy(parsing: "socks5://127.0.0.1:\(proxy.port)")
                    try await withDownloader(configuration) { downloader in
                        try await downloader.download(
                            DownloadRequest(
                                url: server.url("/local", host: "localhost"), destination: .file(directory + "/l")))
                    }
                    let identical = try readFile(directory + "/l") == resource.content
                    #expect(identical)
                    let seen = try #require(proxy.seen.last)
                    #expect(seen.addressType == "ipv4" && seen.target == "127.0.0.1:\(server.port)", "\(seen)")
                    // A name that does not resolve fails at once, naming it, before the proxy is asked.
                    let before = proxy.seen.count
                    let unknown = await expectHaulError(.network) {
                        try await withDownloader(configuration) { downloader in
                            try await downloader.download(
                                DownloadRequest(
                                    url: "https://no-such-host.invalid/x", destination: .file(directory + "/u")))
                        }
                    }
                    #expect(unknown?.message.contains("cannot resolve no-such-host.invalid") == true)
                    #expect(proxy.seen.count == before)
                }
            }
        }
    }

    @Test func noProxyHostsAreReachedDirectly() async throws {
        try await HaulTestServer.withRunning { server in
            try await TestProxy.withRunning(.http) { proxy in
                try await withTemporaryDirectory { directory in
                    server.add("/direct", TestResource(name: "direct", size: 10_000))
                    var configuration = testConfiguration(retries: 0)
                    configuration.proxy = ProxySettings(http: try Proxy(parsing: proxy.url), noProxy: ["127.0.0.0/8"])
                    try await withDownloader(configuration) { downloader in
                        try await downloader.download(
                            DownloadRequest(url: server.url("/direct"), destination: .file(directory + "/d")))
                    }
                    #expect(proxy.seen.isEmpty)
                    #expect(server.requests(for: "/direct").count == 1)
                }
            }
        }
    }
}
