// Foundation's formatters (not in FoundationEssentials); Haul already links Foundation on Linux.
import Foundation

/// Sizes, speeds and times as a row of a download list shows them, in the user's language.
///
/// Sizes use Foundation's byte count format for files (decimal units: "12.3 MB", as Finder and
/// Files show sizes); times left use its duration units ("1 min, 5 sec").
extension DownloadInfo {
    /// The bytes stored and the file's size: "12.3 MB / 100 MB", or "12.3 MB" while the size is
    /// not known.
    public func formattedSize(locale: Locale = .current) -> String {
        Self.formatSize(bytes, of: totalBytes, locale: locale)
    }

    /// The speed while running: "2.5 MB/s"; `nil` when none is measured (not running).
    public func formattedSpeed(locale: Locale = .current) -> String? {
        bytesPerSecond.map { Self.formatBytes(Self.count($0), locale: locale) + "/s" }
    }

    /// The time left while running, when the size is known: "1 min, 5 sec" (at most two units,
    /// "1 hr, 2 min"); `nil` otherwise.
    public func formattedTimeRemaining(locale: Locale = .current) -> String? {
        guard let secondsRemaining, secondsRemaining.isFinite, secondsRemaining >= 0, secondsRemaining < 1e12 else {
            return nil
        }
        return Duration.seconds(Int64(secondsRemaining.rounded(.up))).formatted(
            .units(allowed: [.days, .hours, .minutes, .seconds], width: .abbreviated, maximumUnitCount: 2)
                .locale(locale))
    }

    /// `value` as a count of bytes: 0 for what is not a finite, non-negative number.
    static func count(_ value: Double) -> Int64 {
        value.isFinite && value > 0 ? Int64(min(value, Double(Int64.max / 2))) : 0
    }

    /// "`bytes` / `total`", or `bytes` alone while the total is not known.
    static func formatSize(_ bytes: Int64, of total: Int64?, locale: Locale) -> String {
        let stored = formatBytes(bytes, locale: locale)
        guard let total else { return stored }
        return "\(stored) / \(formatBytes(total, locale: locale))"
    }

    static func formatBytes(_ count: Int64, locale: Locale) -> String {
        count.formatted(.byteCount(style: .file).locale(locale))
    }
}

extension AggregateProgress {
    /// The bytes stored over every download counted and their known sizes: "120 MB / 1.2 GB".
    public func formattedSize(locale: Locale = .current) -> String {
        DownloadInfo.formatSize(bytes, of: totalBytes > 0 ? totalBytes : nil, locale: locale)
    }

    /// The running downloads' speed together: "4.1 MB/s".
    public func formattedSpeed(locale: Locale = .current) -> String {
        DownloadInfo.formatBytes(DownloadInfo.count(bytesPerSecond), locale: locale) + "/s"
    }
}
