import Foundation
import Testing

@testable import Haul

/// A store keeps each request as the JSON ``DefinitionJSON`` writes: the same bytes as
/// `JSONEncoder` writes with ``DownloadRequest``'s encoder and sorted keys.
@Suite("The JSON a store keeps of a request")
struct DefinitionJSONTests {
    /// Requests with every field, none, secret headers, and text JSON must escape.
    static func requests() throws -> [DownloadRequest] {
        let every = DownloadRequest(
            url: "http://127.0.0.1:9/a?b=c&d=%20", destination: .file("/d/a"),
            headers: [("X-Trace", "1"), ("Authorization", "Bearer t"), ("X-Marked", "m"), ("Accept", "*/*")],
            overwrite: true, checksum: try Checksum(parsing: "sha256=" + String(repeating: "0", count: 64)),
            bytesPerSecondLimit: 5_000_000_000, connections: 16, mirrors: ["http://127.0.0.1:9/b", "https://m/c"],
            label: "a label")
        var marked = every
        marked.secretHeaders = ["x-marked"]
        var intoDirectory = every
        intoDirectory.destination = .directory("/d")
        let awkward = DownloadRequest(
            url: "http://h/\u{1}\u{8}\u{9}\u{A}\u{C}\u{D}\u{1F}\u{7F}\"\\/é\u{301}🦀",
            destination: .file("/d/quote\"back\\slash/ctl\u{0}"), headers: [("X-Odd", "\"\\\u{2}")],
            label: "")
        let onlySecrets = DownloadRequest(
            url: "http://h/x", destination: .directory("."), headers: [("Cookie", "a=b"), ("X-Api-Token", "t")])
        return [
            DownloadRequest(url: "http://h/x", destination: .file("/x")), every, marked, intoDirectory, awkward,
            onlySecrets,
        ]
    }

    @Test("the JSON is the bytes JSONEncoder writes, and reads back as the request without its secrets")
    func theSameBytesAsTheEncoder() throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        for request in try Self.requests() {
            let written = StoredDownload.encodeDefinition(request)
            #expect(written == String(decoding: try encoder.encode(request), as: UTF8.self))
            let read = try StoredDownload.decodeDefinition(written)
            var expected = request
            expected.headers = request.headers.filter { !request.isSecret($0.name) }
            expected.secretHeaders = []
            #expect(read == expected)
        }
    }

    @Test("the requests compared hold every field a request has")
    func everyFieldIsCompared() throws {
        var written: Set<String> = []
        for request in try Self.requests() {
            let object = try JSONSerialization.jsonObject(with: Data(StoredDownload.encodeDefinition(request).utf8))
            written.formUnion(try #require(object as? [String: Any]).keys)
        }
        #expect(written == Set(DownloadRequest.fieldSchemas.map(\.name)))
    }
}
