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

    /// Reads a size the way curl and wget write them: `0`, `500k`, `64M`, `1.5G`, `2MiB`, `65536`
    /// (suffixes in powers of 1024).
    package static func parse(_ text: String) throws -> Int64 {
        guard let bytes = number(text, allowingRate: false), bytes >= 0 else {
            throw HaulError(
                .invalidArgument, "\"\(text)\" is not a size: use a number of bytes with k, M or G, e.g. 64M")
        }
        return bytes
    }

    /// The bytes `text` writes (a number with k, M or G, optionally `B`/`iB`, and `/s` when
    /// `allowingRate`); `nil` for anything else, or past a petabyte.
    static func number(_ text: String, allowingRate: Bool) -> Int64? {
        var rest = Substring(text.lowercased().filter { $0 != " " })
        if allowingRate && rest.hasSuffix("/s") { rest = rest.dropLast(2) }
        if rest.hasSuffix("ib") { rest = rest.dropLast(2) } else if rest.hasSuffix("b") { rest = rest.dropLast(1) }
        var multiplier: Double = 1
        switch rest.last {
        case "k": multiplier = 1024
        case "m": multiplier = 1024 * 1024
        case "g": multiplier = 1024 * 1024 * 1024
        default: break
        }
        if multiplier > 1 { rest = rest.dropLast() }
        guard !rest.isEmpty, rest.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }),
            let value = Double(rest), value * multiplier < 1e15
        else { return nil }
        return Int64(value * multiplier)
    }

    /// Formats a rate in bytes per second, e.g. `3.2 MiB/s`.
    package static func formatRate(_ bytesPerSecond: Double) -> String {
        format(Int64(bytesPerSecond.isFinite ? max(0, bytesPerSecond) : 0)) + "/s"
    }
}
