import Foundation
import Testing

@testable import Haul

@Suite("One description of a download, as JSON")
struct DownloadRequestCodingTests {
    static func encode(_ request: DownloadRequest, secrets: Bool = false) throws -> [String: Any] {
        let encoder = JSONEncoder()
        if secrets { encoder.userInfo[DownloadRequest.includesSecrets] = true }
        return try #require(try JSONSerialization.jsonObject(with: encoder.encode(request)) as? [String: Any])
    }

    static func decode(_ json: String) throws -> DownloadRequest {
        try JSONDecoder().decode(DownloadRequest.self, from: Data(json.utf8))
    }

    static var full: DownloadRequest {
        var request = DownloadRequest(
            url: "https://user:pass@example.com/a.iso", destination: .file("/data/a.iso"),
            headers: [("X-Trace", "7"), ("X-Api-Key", "k-1"), ("X-Team", "t-2")], overwrite: true,
            checksum: try? Checksum(parsing: "sha256=" + String(repeating: "ab", count: 32)),
            bytesPerSecondLimit: 1000, connections: 4, mirrors: ["https://mirror.example.com/a.iso"],
            label: "nightly")
        request.secretHeaders = ["x-team"]
        return request
    }

    @Test("every field comes back as it was, secrets included when asked for")
    func roundTripWithSecrets() throws {
        let request = Self.full
        let encoder = JSONEncoder()
        encoder.userInfo[DownloadRequest.includesSecrets] = true
        let decoded = try JSONDecoder().decode(DownloadRequest.self, from: try encoder.encode(request))
        #expect(decoded.url == "https://example.com/a.iso")
        #expect(decoded.credentials == BasicCredentials(user: "user", password: "pass"))
        #expect(decoded.headers.map(\.name) == request.headers.map(\.name))
        #expect(decoded.headers.map(\.value) == request.headers.map(\.value))
        #expect(decoded.isSecret("X-Team"))
        var comparable = decoded
        comparable.secretHeaders = request.secretHeaders
        #expect(comparable == request)
    }

    @Test("secret headers and credentials are left out unless the encoder asks for them")
    func secretsAreLeftOut() throws {
        let plain = try Self.encode(Self.full)
        let headers = try #require(plain["headers"] as? [[String: Any]])
        #expect(headers.map { $0["name"] as? String } == ["X-Trace"])
        let text = String(decoding: try JSONEncoder().encode(Self.full), as: UTF8.self)
        for secret in ["k-1", "t-2", "pass", "Authorization", "dXNlcjpwYXNz"] { #expect(!text.contains(secret)) }

        let withSecrets = try Self.encode(Self.full, secrets: true)
        let all = try #require(withSecrets["headers"] as? [[String: Any]])
        #expect(all.count == 4)
        #expect(
            all.filter { $0["secret"] as? Bool == true }.compactMap { $0["name"] as? String }.sorted() == [
                "Authorization", "X-Api-Key", "X-Team",
            ])
    }

    @Test("fields at their defaults are left out, and missing or null ones mean the defaults")
    func defaultsAreLeftOut() throws {
        let json = try Self.encode(DownloadRequest(url: "http://example.com/a", destination: .directory("/d")))
        #expect(Set(json.keys) == ["url", "directory"])
        let decoded = try Self.decode(#"{"url": "http://example.com/a", "checksum": null, "mirrors": null}"#)
        #expect(decoded == DownloadRequest(url: "http://example.com/a", destination: .directory(".")))
    }

    @Test("a destination and a directory both, or a checksum that does not parse, is refused with where")
    func badShapesAreRefused() throws {
        for (json, key) in [
            (#"{"url": "http://e/a", "destination": "a", "directory": "b"}"#, "directory"),
            (#"{"url": "http://e/a", "checksum": "md7=00"}"#, "checksum"),
        ] {
            #expect {
                try Self.decode(json)
            } throws: { error in
                guard case .dataCorrupted(let context) = error as? DecodingError else { return false }
                return context.codingPath.last?.stringValue == key && !context.debugDescription.isEmpty
            }
        }
    }

    @Test("one header rule: a name must be a token, whichever front door it came through")
    func headerNamesAreTokens() throws {
        for name in ["X(Y)", "X Y", "X:Y", "", "Ä", "X\"Y"] {
            let request = DownloadRequest(
                url: "http://example.com/a", destination: .directory("."), headers: [(name, "1")])
            #expect(throws: HaulError.self) { try request.check() }
        }
        for name in ["X-Trace", "x_y", "A!#$%&'*+-.^_`|~9"] {
            let request = DownloadRequest(
                url: "http://example.com/a", destination: .directory("."), headers: [(name, "1")])
            #expect(throws: Never.self) { try request.check() }
        }
    }
}
