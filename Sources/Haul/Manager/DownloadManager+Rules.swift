#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

extension DownloadManager {
    /// Where the rules stand now: the scheduled total limit in force, whether downloads start.
    public var rulesInForce: QueueRules.Now { rulesNow }

    /// The date now: the system's, or with a start date given (a test's clock), that date moved on
    /// by the manager's clock.
    var date: Date {
        guard configuration.startDate != nil else { return Date() }
        let elapsed = (clock.now - dateAnchor.moment).components
        return dateAnchor.date.addingTimeInterval(Double(elapsed.seconds) + Double(elapsed.attoseconds) / 1e18)
    }

    /// Takes in where the rules stand now (each tick, and when they change): the total limit a
    /// window sets, and downloads stopped when the last start window closes, started when one opens.
    func lookAtRules() async {
        let was = rulesNow
        rulesNow = configuration.rules.now(at: date, in: configuration.timeZone)
        if rulesNow.bytesPerSecond != was.bytesPerSecond { applyRate() }
        if rulesNow.startsDownloads && !was.startsDownloads { schedule() }
        guard !rulesNow.startsDownloads else { return }
        // Each stops with a checkpoint and waits, queued, for the next window.
        for id in Array(jobs.keys) where jobs[id]?.reason == nil {
            // The rules may have changed while the last one stopped.
            guard !rulesNow.startsDownloads else { return }
            await stop(id, .outsideStartWindow)
        }
    }
}
