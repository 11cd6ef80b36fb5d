import Haul

#if canImport(FoundationNetworking)
    import Foundation
    import FoundationNetworking
#else
    import Foundation
#endif

/// The answers of download tasks that finished while no request waited for them (the app was not
/// running, or had let the request go), kept in the transport's directory until the download asks
/// for them again: a body file and a head file per answer.
///
/// A task is known by its description: the download it belongs to, its URL and the first byte it
/// asked for (``key(for:)``). That is what the same download asks for on the next run, whatever
/// else it sends (an `If-Range` it learnt from the answer's head, say).
struct HeldAnswers: Sendable {
    let directory: String

    /// What an answer held in a file says.
    struct Head: Codable {
        var key: String
        var status: Int
        var headers: [[String]]

        /// The answer this head describes, with `body`.
        func response(body: TransportBody) -> TransportResponse {
            let pairs = headers.compactMap { $0.count == 2 ? (name: $0[0], value: $0[1]) : nil }
            return TransportResponse(status: status, headers: pairs, body: body)
        }
    }

    /// The description of the task that sends `request`.
    static func key(for request: TransportRequest) -> String {
        "\(request.download)\n\(request.url.absoluteString)\n\(firstByte(request.header("range")))"
    }

    /// The first byte a `Range` header asks for; 0 without one.
    private static func firstByte(_ range: String?) -> Int64 {
        guard let range, range.hasPrefix("bytes="), let dash = range.firstIndex(of: "-") else { return 0 }
        return Int64(range[range.index(range.startIndex, offsetBy: 6)..<dash]) ?? 0
    }

    /// The name of the files of the answer to the task described by `key`.
    private func base(_ key: String) -> String {
        // FNV-1a: a short, stable name; the head holds the whole key, which is compared.
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in key.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return directory + "/haul-held-" + String(hash, radix: 16)
    }

    /// Keeps the body in `file` (moved, at once: it is the session's until its delegate call
    /// returns) and the head of `response` for the task described by `key`.
    func hold(_ file: URL, response: URLResponse?, key: String) throws {
        guard let http = response as? HTTPURLResponse else { return }
        let base = base(key)
        try? FileManager.default.removeItem(atPath: base + ".body")
        try FileManager.default.moveItem(atPath: file.path, toPath: base + ".body")
        let head = Head(key: key, status: http.statusCode, headers: headerPairs(http).map { [$0.name, $0.value] })
        try JSONEncoder().encode(head).write(to: URL(fileURLWithPath: base + ".head"), options: .atomic)
    }

    /// The answer held for the task `key` describes, given up by the store: its body file is the
    /// caller's to read and remove. `nil` when none is held.
    func take(_ key: String) -> (head: Head, body: String)? {
        let base = base(key)
        guard let data = FileManager.default.contents(atPath: base + ".head"),
            let head = try? JSONDecoder().decode(Head.self, from: data), head.key == key,
            FileManager.default.fileExists(atPath: base + ".body")
        else { return nil }
        try? FileManager.default.removeItem(atPath: base + ".head")
        return (head, base + ".body")
    }

    /// Removes the answers held longer than `seconds`: no download asked for them (it was removed
    /// while its task ran, say); and bodies of answers that were let go as they arrived.
    func sweep(olderThan seconds: TimeInterval) {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        let limit = Date().addingTimeInterval(-seconds)
        for name in names where name.hasPrefix("haul-held-") || name.hasPrefix("haul-body-") {
            let path = directory + "/" + name
            let modified = (try? FileManager.default.attributesOfItem(atPath: path))?[.modificationDate] as? Date
            if let modified, modified < limit { try? FileManager.default.removeItem(atPath: path) }
        }
    }
}
