/// Turns a stream of byte counts into throttled progress reports with a smoothed speed.
///
/// Speed is the slope over a sliding window of recent samples, which reacts within seconds and does
/// not jump with every chunk; the reported byte count never decreases and never passes the total.
struct ProgressMeter {
    private var samples: [(time: Moment, bytes: Int64)] = []
    private var lastReport: Moment?
    private var lastBytes: Int64
    private let window: Duration
    private let interval: Duration
    let totalBytes: Int64?

    init(startingAt bytes: Int64, totalBytes: Int64?, interval: Duration, window: Duration = .seconds(3)) {
        self.lastBytes = bytes
        self.totalBytes = totalBytes
        self.interval = interval
        self.window = window
    }

    /// Records `bytes` at `now`; returns whether a report is due (always when `force` is set): then
    /// ``report(connections:)`` makes it. Called for every block written, so it does no more.
    mutating func record(_ bytes: Int64, at now: Moment, force: Bool = false) -> Bool {
        let bytes = min(max(bytes, lastBytes), totalBytes ?? Int64.max)
        lastBytes = bytes
        if let lastReport, !force, now - lastReport < interval { return false }
        lastReport = now
        samples.append((now, bytes))
        while let first = samples.first, samples.count > 2, now - first.time > window { samples.removeFirst() }
        return true
    }

    /// The speed over the recent samples, in bytes per second (0 before there are enough).
    var bytesPerSecond: Double {
        guard let first = samples.first, let last = samples.last else { return 0 }
        let seconds = (last.time - first.time).seconds
        return seconds > 0.05 ? Double(last.bytes - first.bytes) / seconds : 0
    }

    /// The report of what was last recorded, with `connections` open.
    func report(connections: Int) -> DownloadProgress {
        let speed = bytesPerSecond
        var remaining: Double?
        if let totalBytes, speed > 0 { remaining = Double(totalBytes - lastBytes) / speed }
        return DownloadProgress(
            bytes: lastBytes, totalBytes: totalBytes, bytesPerSecond: speed, secondsRemaining: remaining,
            connections: connections)
    }
}

extension Duration {
    /// The duration as a floating-point number of seconds.
    var seconds: Double {
        let parts = components
        return Double(parts.seconds) + Double(parts.attoseconds) / 1e18
    }
}
