/// Parses `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP date.
package enum RetryAfter {
    /// The delay in seconds the server asked for, measured from `now` (seconds since the epoch)
    /// when the value is a date; `nil` when the value is malformed. A date in the past gives 0.
    package static func delay(_ value: String, now: Int64) -> Int64? {
        let trimmed = value.trimmingHTTPWhitespace()
        if let seconds = Int64(decimalDigits: trimmed) { return seconds }
        guard let date = HTTPDate.parse(String(trimmed)) else { return nil }
        return max(0, date - now)
    }
}
