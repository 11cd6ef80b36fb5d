import AsyncHTTPClient
import Haul
import Logging
import NIOCore
import NIOHTTP1

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `--webhook URL`: a JSON event POSTed to each URL when a download completes or fails.
///
/// The body has `title`, `message` and `priority`, which Gotify shows as a notification, beside
/// the event and the download (`id`, `gid`, `name`, `url`, `file`, `bytes`, `totalBytes`, `error`);
/// ntfy takes the body as the message and the `Title` header as its title. Nothing in it is a
/// credential: no header, cookie or password, and the URL without its query (a signed link's
/// signature) or fragment, also where the error's message names a URL. A delivery that fails (no
/// answer, 5xx, 429) is tried again after 1, 2, 4 and 8 s, on the daemon's clock; any other answer
/// ends it. Redirects are not followed. The log names a receiver by its scheme and host only (a
/// topic in its path, a token in its query, may be its secret). When the daemon stops, deliveries
/// under way end: a receiver that is down does not hold up the stop.
struct WebhookSender: Sendable {
    let urls: [String]
    let logger: Logger
    let clock: any Clock<Duration>

    /// Tries of one delivery, and the wait before the second (doubled before each next one).
    static let attempts = 5
    static let firstDelay: Duration = .seconds(1)
    /// How long one try may take.
    static let timeLimit: TimeAmount = .seconds(10)

    /// Whether `text` is a URL `--webhook` takes: http or https, with a host.
    static func isWebhookURL(_ text: String) -> Bool {
        (try? API.checkURL(text)) != nil
    }

    /// Sends the events of the downloads that end, until the events do; each delivery on its own, so
    /// a slow receiver holds up no other.
    func run(_ events: AsyncStream<DownloadManagerEvent>) async {
        var configuration = HTTPClient.Configuration()
        configuration.redirectConfiguration = .disallow
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        await withDiscardingTaskGroup { group in
            for await event in events {
                // Once per end, by the worker that ended it; a recorded hook's result is no new end.
                guard case .stateChanged = event.kind, !event.isFromAnotherWorker, event.download.hook == nil,
                    let body = try? Self.body(of: event.download)
                else { continue }
                for url in urls {
                    group.addTask { await deliver(body.json, title: body.title, to: url, with: client) }
                }
            }
            group.cancelAll()
        }
        try? await client.shutdown()
    }

    /// POSTs one event to one URL, tried again as the type says; logs what happened.
    func deliver(_ body: ByteBuffer, title: String, to url: String, with client: HTTPClient) async {
        let shown = Self.receiver(url)
        var delay = Self.firstDelay
        for attempt in 1...Self.attempts {
            var request = HTTPClientRequest(url: url)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.headers.add(name: "User-Agent", value: "haul/\(HaulVersion.current)")
            request.headers.add(name: "Title", value: title)
            request.body = .bytes(body)
            let outcome: String
            do {
                let response = try await client.execute(request, timeout: Self.timeLimit)
                _ = try? await response.body.collect(upTo: 1 << 16)
                let status = Int(response.status.code)
                if (200..<300).contains(status) {
                    logger.info("webhook \(shown) took the event (\(status))")
                    return
                }
                guard status >= 500 || status == 429 else {
                    logger.warning("webhook \(shown) refused the event with \(status); it is not sent again")
                    return
                }
                outcome = "answered \(status)"
            } catch {
                outcome = "could not be reached (\(error))"
            }
            guard attempt < Self.attempts else {
                logger.warning("webhook \(shown) \(outcome); gave up after \(attempt) tries")
                return
            }
            logger.info("webhook \(shown) \(outcome); trying again in \(delay)")
            do { try await clock.sleep(for: delay) } catch { return }
            delay *= 2
        }
    }

    /// The event's body and its title.
    static func body(of download: DownloadInfo) throws -> (json: ByteBuffer, title: String)? {
        let (event, title, message, priority): (String, String, String, Int)
        switch download.state {
        case .completed:
            event = "completed"
            title = "Haul: \(download.name) completed"
            let size = ByteCount.format(download.totalBytes ?? download.bytes)
            message = "\(download.name) (\(size)) is complete" + (download.destination.map { " in \($0)" } ?? "")
            priority = 5
        case .failed:
            event = "failed"
            title = "Haul: \(download.name) failed"
            message = "\(download.name) failed: \(withoutQueries(in: download.error?.message ?? "unknown error"))"
            priority = 8
        default:
            return nil
        }
        let body = WebhookEvent(
            event: event, title: title, message: message, priority: priority,
            download: .init(
                id: download.id.rawValue, gid: Aria2RPC.gid(download.id), name: download.name,
                url: withoutQuery(download.url), file: download.destination, bytes: download.bytes,
                totalBytes: download.totalBytes,
                error: download.error.map {
                    ErrorResponse.Detail(code: $0.code.name, message: withoutQueries(in: $0.message))
                },
                worker: download.worker))
        // A header's value is printable ASCII here; the body keeps the name as it is.
        let asciiTitle = String(title.unicodeScalars.map { (0x20..<0x7F).contains($0.value) ? Character($0) : "?" })
        return (try JSONBody.encode(body), asciiTitle)
    }

    /// `url` without its query and fragment (which may hold a signature or a token).
    static func withoutQuery(_ url: String) -> String {
        String(url.prefix { $0 != "?" && $0 != "#" })
    }

    /// `text` with the query and fragment of each URL in it taken out.
    static func withoutQueries(in text: String) -> String {
        text.split(separator: " ", omittingEmptySubsequences: false)
            .map { $0.contains("://") ? withoutQuery(String($0)) : String($0) }.joined(separator: " ")
    }

    /// How the log names a receiver: its scheme and host, without user, path or query.
    static func receiver(_ url: String) -> String {
        guard let separator = url.range(of: "://") else { return "(a receiver)" }
        let authority = url[separator.upperBound...].prefix { !"/?#".contains($0) }
        let host = authority.split(separator: "@").last.map(String.init) ?? ""
        return String(url[..<separator.upperBound]) + host
    }
}

/// The JSON a webhook receives.
struct WebhookEvent: Encodable {
    struct Download: Encodable {
        var id: Int64
        var gid: String
        var name: String
        var url: String
        var file: String?
        var bytes: Int64
        var totalBytes: Int64?
        var error: ErrorResponse.Detail?
        var worker: String?
    }

    var event: String
    var title: String
    var message: String
    var priority: Int
    var download: Download
}
