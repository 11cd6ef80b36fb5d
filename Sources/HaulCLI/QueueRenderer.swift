import Haul
import Synchronization

/// Shows several downloads at once: on a terminal one line per download still transferring (as many
/// as the terminal has rows for) plus a total line, redrawn in place; when piped, a line per start
/// and end and a total line every few seconds; JSON lines for scripts; or nothing but errors.
final class QueueRenderer: Sendable {
    private struct State {
        var downloads: [DownloadID: DownloadInfo] = [:]
        var removed: Set<DownloadID> = []
        var drawnLines = 0
        var lastDraw: ContinuousClock.Instant?
        var lastTotalLine: ContinuousClock.Instant = .now
    }

    let style: ProgressRenderer.Style
    private let ids: [DownloadID]
    private let state: Mutex<State>
    private let started = ContinuousClock.now

    init(style: ProgressRenderer.Style, downloads: [DownloadInfo]) {
        self.style = style
        self.ids = downloads.map(\.id)
        self.state = Mutex(State(downloads: Dictionary(downloads.map { ($0.id, $0) }, uniquingKeysWith: { $1 })))
    }

    /// The events the quiet style shows: a download's failure, by kind and the download's state
    /// after the event.
    static let quietlyShown: @Sendable (DownloadManagerEvent.Kind, DownloadState) -> Bool = { kind, state in
        guard case .stateChanged = kind else { return false }
        return state == .failed
    }

    func handle(_ event: DownloadManagerEvent) {
        let info = event.download
        let known = state.withLock { state -> Bool in
            guard state.downloads[info.id] != nil else { return false }
            state.downloads[info.id] = info
            if case .removed = event.kind { state.removed.insert(info.id) }
            return true
        }
        guard known else { return }
        switch style {
        case .quiet:
            if Self.quietlyShown(event.kind, info.state), let error = info.error {
                Output.standardError("haul: error: \(info.name): \(error.messageWithHint)\n")
            }
        case .json:
            printJSON(event)
        case .terminal, .lines:
            render(event)
        }
    }

    /// The last line: how many downloads were saved and how many did not finish.
    func finish(interrupted: Bool) {
        guard style == .terminal || style == .lines else { return }
        let (downloads, removed) = state.withLock { state in (ids.compactMap { state.downloads[$0] }, state.removed) }
        let kept = downloads.filter { !removed.contains($0.id) }
        let saved = kept.filter { $0.state == .completed }.count
        let failed = kept.filter { $0.state == .failed }.count
        let paused = kept.filter { $0.state == .paused }.count
        let bytes = downloads.filter { $0.state == .completed }.reduce(Int64(0)) { $0 + $1.bytes }
        let elapsed = (ContinuousClock.now - started).seconds
        var line =
            "haul: \(saved) of \(downloads.count) saved (\(ByteCount.format(bytes)) in \(ProgressRenderer.duration(elapsed)))"
        if failed > 0 { line += ", \(failed) failed" }
        if paused > 0 { line += ", \(paused) paused" }
        if !removed.isEmpty { line += ", \(removed.count) removed" }
        if interrupted {
            line += "; interrupted: `haul resume` continues the rest"
        }
        permanent(line)
    }

    // MARK: Human output

    private func render(_ event: DownloadManagerEvent) {
        let info = event.download
        switch event.kind {
        case .stateChanged:
            switch info.state {
            case .running:
                if style == .lines { permanent("haul: [\(info.id)] \(info.url)") }
            case .completed:
                permanent("haul: [\(info.id)] saved \(info.destination ?? info.name) (\(ByteCount.format(info.bytes)))")
            case .failed:
                permanent("haul: [\(info.id)] error: \(info.error?.message ?? "failed")")
            case .paused where info.isWaitingForSpace:
                permanent(
                    "haul: [\(info.id)] paused: \(info.error?.message ?? "disk full"); continues once there is room")
            case .paused:
                permanent("haul: [\(info.id)] paused; `haul resume \(info.id)` continues it")
            case .cancelled:
                permanent("haul: [\(info.id)] cancelled")
            default:
                break
            }
            redraw(force: true)
        case .removed:
            permanent("haul: [\(info.id)] removed")
            redraw(force: true)
        case .transfer(.restarted(let reason)):
            permanent("haul: [\(info.id)] starting over: \(reason.descriptionWithHint)")
        case .transfer(.retrying(let attempt, let delay, let error)):
            permanent(
                "haul: [\(info.id)] \(error.message); retry \(attempt) in \(ProgressRenderer.duration(delay.seconds))")
        case .transfer(.progress):
            redraw(force: false)
        default:
            break
        }
    }

    /// Prints a line that stays, above the progress block.
    private func permanent(_ line: String) {
        state.withLock { state in
            Output.standardError(erase(&state) + line + "\n")
        }
    }

    /// Takes the progress block off the screen, so that a line can be printed in its place.
    func clear() {
        state.withLock { state in Output.standardError(erase(&state)) }
    }

    private func erase(_ state: inout State) -> String {
        guard style == .terminal, state.drawnLines > 0 else { return "" }
        defer { state.drawnLines = 0 }
        return "\u{1B}[\(state.drawnLines)A\r\u{1B}[J"
    }

    private func redraw(force: Bool) {
        state.withLock { state in
            let now = ContinuousClock.now
            switch style {
            case .terminal:
                if !force, let last = state.lastDraw, now - last < .milliseconds(200) { return }
                state.lastDraw = now
                let (columns, rows) = ProgressRenderer.terminalSize()
                let lines = Self.progressBlock(
                    ids.compactMap { state.downloads[$0] }, total: totalLine(state), columns: columns - 1, rows: rows)
                Output.standardError(erase(&state) + lines.joined(separator: "\n") + "\n")
                state.drawnLines = lines.count
            case .lines:
                guard now - state.lastTotalLine >= .seconds(5) else { return }
                state.lastTotalLine = now
                Output.standardError("haul: " + totalLine(state) + "\n")
            case .json, .quiet:
                return
            }
        }
    }

    /// The lines drawn on a terminal of `columns` × `rows`: one per running download that still
    /// transfers, those whose bytes are all written (being flushed and renamed) counted on the total
    /// line, and never more lines than leave the block's top on the screen (it is redrawn by moving
    /// the cursor up over it). A download of unknown length keeps its line until it ends; one
    /// checking its checksum already counts as finishing.
    static func progressBlock(_ downloads: [DownloadInfo], total: String, columns: Int, rows: Int) -> [String] {
        let running = downloads.filter { $0.state == .running }
        let transferring = running.filter { info in info.totalBytes.map { info.bytes < $0 } ?? true }
        let finishing = running.count - transferring.count
        // The total line, and the row the cursor is left on.
        let room = max(0, rows - 2)
        var lines = transferring.prefix(transferring.count > room ? max(0, room - 1) : room).map { info in
            "\(ProgressRenderer.fit(info.name, 24)) " + summary(info)
        }
        if transferring.count > lines.count, room > 0 { lines.append("… and \(transferring.count - lines.count) more") }
        lines.append(finishing > 0 ? total + "  \(finishing) finishing" : total)
        return lines.map { String($0.prefix(max(1, columns))) }
    }

    private func totalLine(_ state: State) -> String {
        let downloads = ids.compactMap { state.downloads[$0] }
        let done = downloads.filter { $0.state == .completed }.count
        let bytes = downloads.reduce(Int64(0)) { $0 + $1.bytes }
        let known = downloads.compactMap(\.totalBytes).reduce(Int64(0), +)
        let rate = downloads.compactMap(\.bytesPerSecond).reduce(0, +)
        var parts = ["total \(done)/\(downloads.count) done"]
        if known > 0, !downloads.contains(where: { $0.totalBytes == nil }) {
            parts.append("\(Int(Double(bytes) / Double(known) * 100))%")
            parts.append("\(ByteCount.format(bytes)) / \(ByteCount.format(known))")
        } else {
            parts.append(ByteCount.format(bytes))
        }
        parts.append(ByteCount.formatRate(rate))
        return parts.joined(separator: "  ")
    }

    /// `45%  12.0 MiB / 100.0 MiB  5.2 MiB/s  ETA 17s`, or the parts of it that are known.
    static func summary(_ info: DownloadInfo) -> String {
        var parts: [String] = []
        if let fraction = info.fraction { parts.append("\(Int(fraction * 100))%") }
        parts.append(sizes(info))
        if let rate = info.bytesPerSecond { parts.append(ByteCount.formatRate(rate)) }
        if let remaining = info.secondsRemaining { parts.append("ETA \(ProgressRenderer.duration(remaining))") }
        return parts.joined(separator: "  ")
    }

    /// `12.0 MiB / 100.0 MiB`, or only the bytes when the total is unknown.
    static func sizes(_ info: DownloadInfo) -> String {
        guard let total = info.totalBytes else { return ByteCount.format(info.bytes) }
        return "\(ByteCount.format(info.bytes)) / \(ByteCount.format(total))"
    }

    // MARK: JSON output

    private func printJSON(_ event: DownloadManagerEvent) {
        let info = event.download
        var fields: [(String, JSONValue)] = [("id", .integer(info.id.rawValue))]
        switch event.kind {
        case .stateChanged, .added, .removed:
            fields.insert(("event", "state"), at: 0)
            fields += Self.jsonFields(info)
        case .transfer(.progress(let progress)):
            fields.insert(("event", "progress"), at: 0)
            fields += [
                ("bytes", .integer(progress.bytes)),
                ("totalBytes", progress.totalBytes.map(JSONValue.integer) ?? .null),
                ("bytesPerSecond", .integer(Int64(progress.bytesPerSecond))),
            ]
        case .transfer(.restarted(let reason)):
            fields.insert(("event", "restarted"), at: 0)
            fields.append(("reason", .string(reason.description)))
        case .transfer(.retrying(let attempt, _, let error)):
            fields.insert(("event", "retrying"), at: 0)
            fields += [("attempt", .integer(Int64(attempt))), ("message", .string(error.message))]
        case .transfer:
            return
        }
        Output.standardOutput(JSONValue.object(fields) + "\n")
    }

    /// The downloads as `haul ls` shows them: one line each under a header, columns lined up.
    static func table(_ downloads: [DownloadInfo]) -> String {
        var layout = TableLayout()
        for info in downloads { layout.measure(info) }
        return layout.line(layout.header) + downloads.map { layout.line(layout.cells($0)) }.joined()
    }

    /// How `haul ls` lines its columns up: the widest cell of each column over the rows measured
    /// (every row of a short listing, the first page of a long one, whose bounded columns are then
    /// widened by ``allowForAnyValue(largestID:)``), and whether a download has a label (a label
    /// column only then).
    struct TableLayout {
        /// The widest cell of each padded column (every column but the name).
        private var widths: [Int] = []
        /// Whether some download has a label.
        private(set) var labels = false
        /// Whether the table has a column of the worker running each download (a fleet's queue).
        let workers: Bool
        /// The header row.
        var header: [String] {
            ["ID", "STATE", "PROGRESS", "SIZE", "SPEED"] + (workers ? ["WORKER"] : []) + (labels ? ["LABEL"] : [])
                + ["NAME"]
        }

        /// A table with a worker column when `workers`.
        init(workers: Bool = false) { self.workers = workers }

        /// Takes one row's cells into the widths.
        mutating func measure(_ info: DownloadInfo) {
            if info.request.label != nil { labels = true }
            let cells = Self.cells(info, labels: true, workers: workers)
            if widths.isEmpty { widths = Array(repeating: 0, count: cells.count - 1) }
            for column in 0..<cells.count - 1 { widths[column] = max(widths[column], cells[column].count) }
        }

        /// Widens the columns whose cells have a bounded width to the widest they can be, for rows not
        /// measured: IDs up to `largestID`, every state, sizes and speeds up to 1023.9 PiB.
        mutating func allowForAnyValue(largestID: DownloadID) {
            guard !widths.isEmpty else { return }
            let widest = [
                String(largestID.rawValue).count, DownloadState.allCases.map(\.rawValue.count).max() ?? 0, 4,
                "1023.9 PiB / 1023.9 PiB".count, "1023.9 PiB/s".count,
            ]
            for (column, width) in widest.enumerated() { widths[column] = max(widths[column], width) }
        }

        /// A download's cells, as ``header`` names them.
        func cells(_ info: DownloadInfo) -> [String] { Self.cells(info, labels: labels, workers: workers) }

        private static func cells(_ info: DownloadInfo, labels: Bool, workers: Bool) -> [String] {
            var name = info.name
            if let error = info.error { name += "  (\(error.message))" }
            if let hook = info.hook { name += "  [\(hook)]" }
            return [
                String(info.id.rawValue), info.state.rawValue,
                info.fraction.map { "\(Int($0 * 100))%" } ?? "-", sizes(info),
                info.bytesPerSecond.map(ByteCount.formatRate) ?? "-",
            ] + (workers ? [info.worker ?? "-"] : []) + (labels ? [info.request.label ?? "-"] : []) + [name]
        }

        /// One line of the table: every cell but the last padded to its column (numbers on the
        /// right, words on the left), the name last.
        func line(_ row: [String]) -> String {
            let padded = row.count - 1
            var line = ""
            for column in 0..<padded {
                let cell = row[column]
                // The label column, when shown, comes after the worker column, as measured.
                let width = max(widths[safe: column], header[column].count)
                let padding = String(repeating: " ", count: max(0, width - cell.count))
                line += (column == 0 || column == 2 ? padding + cell : cell + padding) + "  "
            }
            return line + row[padded] + "\n"
        }
    }

    /// The downloads as `haul ls --json` prints them: a JSON array, one object per line.
    static func jsonList(_ downloads: [DownloadInfo]) -> String {
        let objects = downloads.map { JSONValue.object([("id", .integer($0.id.rawValue))] + jsonFields($0)) }
        return "[" + objects.joined(separator: ",\n") + "]\n"
    }

    /// A download as JSON fields, shared with `haul ls --json`.
    static func jsonFields(_ info: DownloadInfo) -> [(String, JSONValue)] {
        [
            ("state", .string(info.state.rawValue)), ("url", .string(info.url)),
            ("destination", info.destination.map(JSONValue.string) ?? .null), ("name", .string(info.name)),
            ("bytes", .integer(info.bytes)), ("totalBytes", info.totalBytes.map(JSONValue.integer) ?? .null),
            ("bytesPerSecond", info.bytesPerSecond.map { .integer(Int64($0)) } ?? .null),
            ("priority", .integer(Int64(info.priority.rawValue))),
            ("errorCode", info.error.map { .string($0.code.name) } ?? .null),
            ("error", info.error.map { .string($0.message) } ?? .null),
            ("createdAt", .integer(Int64(info.createdAt.timeIntervalSince1970))),
            ("finishedAt", info.finishedAt.map { .integer(Int64($0.timeIntervalSince1970)) } ?? .null),
            ("hook", info.hook.map(JSONValue.string) ?? .null),
            ("label", info.request.label.map(JSONValue.string) ?? .null),
            ("worker", info.worker.map(JSONValue.string) ?? .null),
        ]
    }
}

extension JSONValue {
    /// `{"name":value,…}` on one line.
    static func object(_ fields: [(String, JSONValue)]) -> String {
        "{" + fields.map { "\(JSONValue.string($0.0).encoded):\($0.1.encoded)" }.joined(separator: ",") + "}"
    }
}

extension Array where Element == Int {
    /// The element at `index`, or 0 past the end.
    fileprivate subscript(safe index: Int) -> Int { index < count ? self[index] : 0 }
}
