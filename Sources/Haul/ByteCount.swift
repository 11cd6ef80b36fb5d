/// Formats byte counts the way Haul shows them: binary units with one decimal, e.g. `12.0 MiB`.
package enum ByteCount {
    package static func format(_ bytes: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
        guard bytes >= 1024 else { return "\(bytes) B" }
        var value = Double(bytes)
        var unit = 0
        while value >= 1024 && unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        let tenths = Int((value * 10).rounded())
        return "\(tenths / 10).\(tenths % 10) \(units[unit])"
    }

    /// Formats a rate in bytes per second, e.g. `3.2 MiB/s`.
    package static func formatRate(_ bytesPerSecond: Double) -> String {
        format(Int64(bytesPerSecond.isFinite ? max(0, bytesPerSecond) : 0)) + "/s"
    }
}
