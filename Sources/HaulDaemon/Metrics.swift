import Haul
import Synchronization

/// The daemon's figures for Prometheus, at `/metrics` (text exposition format 0.0.4, behind the
/// token): bytes received, downloads by state, failures by code, the total speed, connections open.
///
/// Written by hand rather than through swift-metrics and swift-prometheus: four figures do not pay
/// for two more packages built in every CI run, and the format is a few lines of text.
final class DaemonMetrics: Sendable {
    private struct State {
        /// Bytes stored per running download at its last event, to count what arrives in between.
        var lastBytes: [DownloadID: Int64] = [:]
        var receivedBytes: Int64 = 0
        var failures: [String: Int] = [:]
    }

    private let state = Mutex(State())

    /// Counts what a manager event tells: bytes that arrived, a failure. In a fleet, each worker
    /// counts its own: what it hears of the other workers' downloads is theirs to count.
    func record(_ event: DownloadManagerEvent) {
        guard !event.isFromAnotherWorker else { return }
        let download = event.download
        state.withLock { state in
            switch event.kind {
            case .removed:
                state.lastBytes[download.id] = nil
                return
            case .stateChanged where download.state == .failed:
                state.failures[download.error?.code.name ?? "unknown", default: 0] += 1
            default:
                break
            }
            // Bytes only grow while a download runs; a restart from zero starts counting again.
            let before = state.lastBytes[download.id] ?? download.bytes
            if download.bytes > before { state.receivedBytes += download.bytes - before }
            state.lastBytes[download.id] =
                download.state == .running || download.state == .queued ? download.bytes : nil
        }
    }

    /// The exposition text, with the queue's current figures.
    func text(
        counts: [DownloadState: Int], running: [DownloadInfo], progress: AggregateProgress,
        connections: ConnectionLedger
    ) -> String {
        let (received, failures) = state.withLock { ($0.receivedBytes, $0.failures) }
        var lines = [
            "# HELP haul_received_bytes_total Bytes the daemon's downloads received and stored since it started.",
            "# TYPE haul_received_bytes_total counter",
            "haul_received_bytes_total \(received)",
            "# HELP haul_downloads Downloads by state.",
            "# TYPE haul_downloads gauge",
        ]
        for state in DownloadState.allCases {
            lines.append("haul_downloads{state=\"\(state.rawValue)\"} \(counts[state] ?? 0)")
        }
        lines += [
            "# HELP haul_failures_total Downloads that failed since the daemon started, by error code.",
            "# TYPE haul_failures_total counter",
        ]
        for (code, count) in failures.sorted(by: { $0.key < $1.key }) {
            lines.append("haul_failures_total{code=\"\(code)\"} \(count)")
        }
        lines += [
            "# HELP haul_download_speed_bytes_per_second The running downloads' speed together.",
            "# TYPE haul_download_speed_bytes_per_second gauge",
            "haul_download_speed_bytes_per_second \(Int64(progress.bytesPerSecond))",
            "# HELP haul_active_connections Connections the running downloads have open (a request out or an answer arriving).",
            "# TYPE haul_active_connections gauge",
            "haul_active_connections \(running.reduce(0) { $0 + ($1.openConnections ?? 0) })",
            "# HELP haul_api_connections Connections open to the daemon's API and page, event streams included.",
            "# TYPE haul_api_connections gauge",
            "haul_api_connections \(connections.openConnections)",
            "# HELP haul_api_requests_arriving Connections whose request is still arriving (cut after the request timeout).",
            "# TYPE haul_api_requests_arriving gauge",
            "haul_api_requests_arriving \(connections.receivingConnections)",
            "# HELP haul_api_event_streams Event streams open.",
            "# TYPE haul_api_event_streams gauge",
            "haul_api_event_streams \(connections.openEventStreams)",
        ]
        return lines.joined(separator: "\n") + "\n"
    }
}
