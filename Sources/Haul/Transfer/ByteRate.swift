/// Reads rates the way curl and wget write them: `500k`, `2M`, `1.5G`, `2MiB/s`, `65536`.
/// Suffixes count in powers of 1024, as in curl's and wget's `--limit-rate`.
package enum ByteRate {
    /// The bytes per second `text` writes; throws for anything but a positive rate.
    package static func parse(_ text: String) throws -> Int64 {
        guard let rate = ByteCount.number(text, allowingRate: true), rate > 0 else {
            throw HaulError(
                .invalidArgument, "\"\(text)\" is not a rate: use a number of bytes with k, M or G, e.g. 2M")
        }
        return rate
    }
}
