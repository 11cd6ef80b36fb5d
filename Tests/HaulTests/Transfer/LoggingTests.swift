import HaulTestServer
import Logging
import Synchronization
import Testing

@testable import Haul

/// Collects log messages, for tests: each message with its level, and each line whole (level,
/// message and metadata) for checks that a secret appears nowhere in a log.
final class LogRecorder: Sendable {
    private let lines = Mutex<[(level: Logger.Level, message: String, whole: String)]>([])
    private let level: Logger.Level

    init(level: Logger.Level = .debug) { self.level = level }

    var all: [(Logger.Level, String)] { lines.withLock { $0.map { ($0.level, $0.message) } } }

    /// Every line with its level and metadata.
    var wholeLines: [String] { lines.withLock { $0.map(\.whole) } }

    var logger: Logger {
        var logger = Logger(label: "haul-test") { _ in RecordingHandler(recorder: self) }
        logger.logLevel = level
        return logger
    }

    struct RecordingHandler: LogHandler {
        let recorder: LogRecorder
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let merged = metadata.merging(event.metadata ?? [:]) { $1 }
            recorder.lines.withLock {
                $0.append((event.level, "\(event.message)", "\(event.level) \(event.message) \(merged)"))
            }
        }
    }
}

@Suite(.timeLimit(.minutes(1)))
struct LoggingTests {
    /// Redirects and retries are logged at debug level through the logger the caller gives.
    @Test func redirectsAndRetriesAreLogged() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "logged", size: 100_000)
            server.add("/f", resource)
            server.add("/moved", .redirect(to: server.url("/f")))
            server.script("/f", [[.status(503, retryAfter: "0")]])
            try await withTemporaryDirectory { directory in
                let recorder = LogRecorder()
                try await withDownloader(testConfiguration(), logger: recorder.logger) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/moved"), destination: .file(directory + "/f")))
                }
                #expect(try readFile(directory + "/f") == resource.content)
                let messages = recorder.all.filter { $0.0 == .debug }.map(\.1)
                #expect(messages.contains { $0.hasPrefix("redirected") }, "\(messages)")
                #expect(messages.contains { $0.contains("503") && $0.contains("retry 1") }, "\(messages)")
            }
        }
    }

    /// Connections that leave, and the first answer going on through their ranges, are logged.
    @Test func connectionsThatLeaveAndTheFallbackToOneAreLogged() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "fallback", size: 3 * 1024 * 1024)
            server.add("/f", resource)
            server.setStandingFaults(
                "/f",
                [
                    .throttle(bytesPerSecond: 8 << 20),
                    .refuseRanges(status: 503, retryAfter: "86400", sparingFromStart: true),
                ])
            try await withTemporaryDirectory { directory in
                let recorder = LogRecorder()
                var configuration = testConfiguration()
                configuration.segmentation.connections = 3
                configuration.segmentation.minimumSplit = 256 * 1024
                try await withDownloader(configuration, logger: recorder.logger) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")))
                }
                #expect(try readFile(directory + "/f") == resource.content)
                let messages = recorder.all.filter { $0.0 == .debug }.map(\.1)
                #expect(
                    messages.contains { $0.contains("retires") && $0.contains("longer than allowed") }, "\(messages)")
                #expect(messages.contains { $0.contains("goes on into bytes") }, "\(messages)")
            }
        }
    }

    @Test func aRestartIsLoggedWithItsReason() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "restarted", size: 300_000)
            server.add("/f", resource)
            try await withTemporaryDirectory { directory in
                _ = try await interruptedSession(server, destination: directory + "/f", bytes: 100_000)
                server.script("/f", [[.ignoreRange]])
                let recorder = LogRecorder()
                try await withDownloader(testConfiguration(), logger: recorder.logger) { downloader in
                    try await downloader.download(
                        DownloadRequest(url: server.url("/f"), destination: .file(directory + "/f")))
                }
                #expect(
                    recorder.all.contains { $0.0 == .debug && $0.1 == "starting over: \(RestartReason.rangeIgnored)" })
            }
        }
    }
}
