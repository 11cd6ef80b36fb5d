import Haul
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Shows a download's events: a progress bar redrawn in place on a terminal, a plain line every few
/// seconds when standard error is not a terminal, JSON lines for scripts, or nothing but errors.
final class ProgressRenderer: Sendable {
    enum Style: Sendable {
        case terminal, lines, json, quiet
    }

    private struct State {
        var name: String
        var lastLine: ContinuousClock.Instant?
        var barDrawn = false
        var started: ContinuousClock.Instant = .now
    }

    let style: Style
    private let state: Mutex<State>
    /// How often a plain line is printed when not on a terminal.
    private let lineInterval: Duration = .seconds(5)

    init(style: Style, url: String) {
        self.style = style
        self.state = Mutex(State(name: url))
    }

    func handle(_ event: DownloadEvent) {
        switch style {
        case .json: printJSON(event)
        case .quiet: return
        case .terminal, .lines: render(event)
        }
    }

    func finish(_ result: DownloadResult) {
        guard style == .terminal || style == .lines else { return }
        let elapsed = state.withLock { ContinuousClock.now - $0.started }
        clearBar()
        var line =
            "haul: saved \(result.destination) (\(ByteCount.format(result.bytes))) in \(Self.duration(elapsed.seconds))"
        if result.resumedFrom > 0 { line += ", resumed at \(ByteCount.format(result.resumedFrom))" }
        if result.restarts > 0 { line += ", restarted \(result.restarts)×" }
        writeError(line)
    }

    /// A one-line remark for people (not printed in JSON or quiet mode by the caller's choice).
    func note(_ text: String) { writeError("haul: note: \(text)") }

    func fail(_ error: HaulError) {
        if style == .json { return }  // the failed event was already printed
        clearBar()
        if error.code == .cancelled {
            writeError("haul: interrupted; run the same command to resume (\(error.message))")
        } else {
            writeError("haul: error: \(error.messageWithHint)")
        }
    }

    // MARK: Human output

    private func render(_ event: DownloadEvent) {
        switch event {
        case .started(let start):
            let name = String(start.destination.split(separator: "/").last ?? Substring(start.destination))
            // The first plain progress line comes one interval after the start, with a real speed.
            state.withLock { state in
                state.name = name
                state.lastLine = .now
            }
            clearBar()
            var line = "haul: \(start.destination)"
            if let total = start.totalBytes { line += " (\(ByteCount.format(total)))" }
            if start.resumedFrom > 0 { line += ", resuming at \(ByteCount.format(start.resumedFrom))" }
            if !start.resumable { line += ", not resumable: the server does not support checked ranges" }
            writeError(line)
        case .progress(let progress):
            if style == .terminal {
                drawBar(progress)
            } else {
                let due = state.withLock { state -> Bool in
                    let now = ContinuousClock.now
                    if let last = state.lastLine, now - last < lineInterval { return false }
                    state.lastLine = now
                    return true
                }
                if due { writeError("haul: \(state.withLock { $0.name }) \(Self.summary(progress))") }
            }
        case .restarted(let reason):
            clearBar()
            writeError("haul: starting over: \(reason.descriptionWithHint)")
        case .retrying(let attempt, let delay, let error):
            clearBar()
            writeError("haul: \(error.message); retry \(attempt) in \(Self.duration(delay.seconds))")
        case .mirror(let report):
            clearBar()
            writeError("haul: \(report)")
        case .completed, .failed:
            return
        }
    }

    private func drawBar(_ progress: DownloadProgress) {
        let name = state.withLock { state -> String in
            state.barDrawn = true
            return state.name
        }
        let summary = Self.summary(progress)
        let columns = Self.terminalColumns()
        var line: String
        if let fraction = progress.fraction {
            let barWidth = max(10, min(40, columns - summary.count - 28))
            let filled = Int(Double(barWidth) * fraction)
            let bar =
                "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: barWidth - filled) + "]"
            line = "\(Self.fit(name, 20)) \(bar) \(summary)"
        } else {
            line = "\(Self.fit(name, 20)) \(summary)"
        }
        // Leave room for the terminal's "^C" echo, so erasing the line erases the echo too.
        if line.count > columns - 4 { line = String(line.prefix(max(0, columns - 4))) }
        writeRaw("\r" + line + "\u{1B}[K")
    }

    /// Takes the bar off the screen, so that a line can be printed in its place.
    func clearBar() {
        let drawn = state.withLock { state -> Bool in
            defer { state.barDrawn = false }
            return state.barDrawn
        }
        if drawn { writeRaw("\r\u{1B}[K") }
    }

    static func summary(_ progress: DownloadProgress) -> String {
        var parts: [String] = []
        if let fraction = progress.fraction {
            parts.append("\(Int(fraction * 100))%")
            parts.append("\(ByteCount.format(progress.bytes)) / \(ByteCount.format(progress.totalBytes ?? 0))")
        } else {
            parts.append(ByteCount.format(progress.bytes))
        }
        parts.append(ByteCount.formatRate(progress.bytesPerSecond))
        if let remaining = progress.secondsRemaining { parts.append("ETA \(duration(remaining))") }
        return parts.joined(separator: "  ")
    }

    static func duration(_ seconds: Double) -> String {
        guard seconds.isFinite else { return "?" }
        if seconds < 10 { return "\(Int((seconds * 10).rounded()) / 10).\(Int((seconds * 10).rounded()) % 10)s" }
        let whole = Int(seconds.rounded())
        if whole < 60 { return "\(whole)s" }
        if whole < 3600 { return "\(whole / 60)m\(whole % 60 < 10 ? "0" : "")\(whole % 60)s" }
        return "\(whole / 3600)h\(whole / 60 % 60 < 10 ? "0" : "")\(whole / 60 % 60)m"
    }

    static func fit(_ text: String, _ width: Int) -> String {
        text.count <= width
            ? text + String(repeating: " ", count: width - text.count) : String(text.prefix(width - 1)) + "…"
    }

    static func terminalColumns() -> Int { terminalSize().columns }

    /// The terminal's width and height in characters (80 × 24 when it does not tell).
    static func terminalSize() -> (columns: Int, rows: Int) {
        var size = winsize()
        guard ioctl(STDERR_FILENO, UInt(TIOCGWINSZ), &size) == 0 else { return (80, 24) }
        return (size.ws_col > 0 ? Int(size.ws_col) : 80, size.ws_row > 0 ? Int(size.ws_row) : 24)
    }

    // MARK: JSON output

    private func printJSON(_ event: DownloadEvent) {
        var fields: [(String, JSONValue)]
        switch event {
        case .started(let start):
            fields = [
                ("event", "started"), ("destination", .string(start.destination)), ("url", .string(start.url)),
                ("totalBytes", start.totalBytes.map(JSONValue.integer) ?? .null),
                ("resumedFrom", .integer(start.resumedFrom)), ("resumable", .bool(start.resumable)),
                ("etag", start.validator.entityTag.map { .string($0.description) } ?? .null),
                ("lastModified", start.validator.lastModified.map(JSONValue.string) ?? .null),
            ]
        case .progress(let progress):
            fields = [
                ("event", "progress"), ("bytes", .integer(progress.bytes)),
                ("totalBytes", progress.totalBytes.map(JSONValue.integer) ?? .null),
                ("bytesPerSecond", .integer(Int64(progress.bytesPerSecond))),
                ("secondsRemaining", progress.secondsRemaining.map { .integer(Int64($0.rounded())) } ?? .null),
            ]
        case .restarted(let reason):
            fields = [("event", "restarted"), ("reason", .string(reason.description))]
        case .retrying(let attempt, let delay, let error):
            fields = [
                ("event", "retrying"), ("attempt", .integer(Int64(attempt))),
                ("delayMilliseconds", .integer(Int64(delay.seconds * 1000))), ("code", .string(error.code.name)),
                ("message", .string(error.message)),
            ]
        case .mirror(let report):
            switch report {
            case .mixed(let proof): fields = [("event", "mirrors"), ("use", "mixed"), ("detail", .string(proof))]
            case .inTurn(let reason): fields = [("event", "mirrors"), ("use", "inTurn"), ("detail", .string(reason))]
            case .dropped(let url, let reason):
                fields = [("event", "mirrorDropped"), ("url", .string(url)), ("reason", .string(reason))]
            }
        case .completed(let result):
            fields = [
                ("event", "completed"), ("destination", .string(result.destination)), ("bytes", .integer(result.bytes)),
                ("bytesFetched", .integer(result.bytesFetched)), ("resumedFrom", .integer(result.resumedFrom)),
                ("restarts", .integer(Int64(result.restarts))),
            ]
        case .failed(let error):
            fields = [
                ("event", "failed"), ("code", .string(error.code.name)), ("message", .string(error.message)),
                ("exitCode", .integer(Int64(ExitCodes.code(for: error.code)))),
            ]
        }
        let line =
            "{" + fields.map { "\(JSONValue.string($0.0).encoded):\($0.1.encoded)" }.joined(separator: ",") + "}\n"
        writeOutput(line)
    }

    // MARK: Writing

    private func writeError(_ line: String) { writeRaw(line + "\n") }

    private func writeRaw(_ text: String) { Output.standardError(text) }

    private func writeOutput(_ text: String) { Output.standardOutput(text) }
}

/// Just enough JSON for one-line events.
enum JSONValue: ExpressibleByStringLiteral {
    case string(String)
    case integer(Int64)
    case bool(Bool)
    case null

    init(stringLiteral value: String) { self = .string(value) }

    var encoded: String {
        switch self {
        case .integer(let value): return String(value)
        case .bool(let value): return value ? "true" : "false"
        case .null: return "null"
        case .string(let value):
            var result = "\""
            for scalar in value.unicodeScalars {
                switch scalar {
                case "\"": result += "\\\""
                case "\\": result += "\\\\"
                case "\n": result += "\\n"
                case "\r": result += "\\r"
                case "\t": result += "\\t"
                default:
                    if scalar.value < 0x20 {
                        let hex = String(scalar.value, radix: 16)
                        result += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                    } else {
                        result.unicodeScalars.append(scalar)
                    }
                }
            }
            return result + "\""
        }
    }
}

extension Duration {
    var seconds: Double {
        let parts = components
        return Double(parts.seconds) + Double(parts.attoseconds) / 1e18
    }
}
