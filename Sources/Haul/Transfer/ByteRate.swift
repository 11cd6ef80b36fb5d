/// Reads rates and sizes the way curl and wget write them: `500k`, `2M`, `1.5G`, `2MiB/s`, `65536`.
/// Suffixes count in powers of 1024, as in curl's and wget's `--limit-rate`.
package enum ByteRate {
    package static func parse(_ text: String) throws -> Int64 {
        var rest = Substring(text.lowercased().filter { $0 != " " })
        if rest.hasSuffix("/s") { rest = rest.dropLast(2) }
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
            let value = Double(rest), value > 0, value * multiplier < 1e15
        else {
            throw HaulError(
                .invalidArgument, "\"\(text)\" is not a rate: use a number of bytes with k, M or G, e.g. 2M")
        }
        return Int64(value * multiplier)
    }
}
