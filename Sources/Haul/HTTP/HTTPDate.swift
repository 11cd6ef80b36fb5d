/// HTTP dates (RFC 9110 §5.6.7), as seconds since the Unix epoch.
///
/// Parsing accepts the preferred IMF-fixdate and the two obsolete forms recipients must accept
/// (RFC 850 and asctime). Formatting always produces IMF-fixdate.
package enum HTTPDate {
    private static let monthNames = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    private static let dayNames = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]

    /// Parses an HTTP date; returns `nil` for anything else.
    package static func parse(_ value: String) -> Int64? {
        if let seconds = value.utf8.withContiguousStorageIfAvailable(parseIMFFixdate), let seconds {
            return seconds
        }
        return parseFields(value)
    }

    /// An IMF-fixdate exactly as servers send it (`Sun, 06 Nov 1994 08:49:37 GMT`: 29 bytes, one
    /// space between fields), read byte by byte; `nil` for any other text, which
    /// ``parseFields(_:)`` reads (and for a date out of range, which it refuses too).
    static func parseIMFFixdate(_ bytes: UnsafeBufferPointer<UInt8>) -> Int64? {
        guard bytes.count == 29, bytes[3] == UInt8(ascii: ","), bytes[4] == UInt8(ascii: " "),
            bytes[7] == UInt8(ascii: " "), bytes[11] == UInt8(ascii: " "), bytes[16] == UInt8(ascii: " "),
            bytes[19] == UInt8(ascii: ":"), bytes[22] == UInt8(ascii: ":"), bytes[25] == UInt8(ascii: " "),
            bytes[26] == UInt8(ascii: "G"), bytes[27] == UInt8(ascii: "M"), bytes[28] == UInt8(ascii: "T"),
            (0..<3).allSatisfy({ bytes[$0] != UInt8(ascii: " ") && bytes[$0] != UInt8(ascii: "\t") })
        else { return nil }
        /// The number the ASCII digits at `range` spell; `nil` when one is not a digit.
        func number(_ range: Range<Int>) -> Int? {
            var value = 0
            for index in range {
                let digit = Int(bytes[index]) - Int(UInt8(ascii: "0"))
                guard (0...9).contains(digit) else { return nil }
                value = value * 10 + digit
            }
            return value
        }
        let name = UnsafeBufferPointer(rebasing: bytes[8..<11])
        guard let day = number(5..<7), let year = number(12..<16), let hour = number(17..<19),
            let minute = number(20..<22), let second = number(23..<25),
            let month = monthNames.firstIndex(where: { $0.utf8.elementsEqual(name) }).map({ $0 + 1 })
        else { return nil }
        return epochSeconds(year: year, month: month, day: day, hour: hour, minute: minute, second: second)
    }

    /// Parses an HTTP date in any of its three forms, field by field.
    static func parseFields(_ value: String) -> Int64? {
        let fields = value.trimmingHTTPWhitespace().split(separator: " ", omittingEmptySubsequences: true)
        switch fields.count {
        case 6 where fields[5] == "GMT":
            // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
            guard let day = Int(decimal: fields[1]), let month = month(fields[2]), let year = Int(decimal: fields[3])
            else { return nil }
            return epochSeconds(year: year, month: month, day: day, time: fields[4])
        case 4 where fields[3] == "GMT":
            // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
            let parts = fields[1].split(separator: "-")
            guard parts.count == 3, let day = Int(decimal: parts[0]), let month = month(parts[1]),
                let shortYear = Int(decimal: parts[2]), parts[2].count == 2
            else { return nil }
            return epochSeconds(
                year: shortYear < 70 ? 2000 + shortYear : 1900 + shortYear, month: month, day: day, time: fields[2])
        case 5:
            // asctime: Sun Nov  6 08:49:37 1994
            guard let month = month(fields[1]), let day = Int(decimal: fields[2]), let year = Int(decimal: fields[4])
            else { return nil }
            return epochSeconds(year: year, month: month, day: day, time: fields[3])
        default:
            return nil
        }
    }

    /// Formats seconds since the epoch as an IMF-fixdate.
    package static func format(_ seconds: Int64) -> String {
        let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let secondsOfDay = seconds - days * 86_400
        let (year, month, day) = civilDate(fromDays: days)
        let weekday = dayNames[Int(((days % 7) + 7) % 7)]
        func twoDigits(_ value: Int64) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(weekday), \(twoDigits(day)) \(monthNames[Int(month) - 1]) \(year) "
            + "\(twoDigits(secondsOfDay / 3600)):\(twoDigits(secondsOfDay / 60 % 60)):\(twoDigits(secondsOfDay % 60)) GMT"
    }

    private static func month<S: StringProtocol>(_ name: S) -> Int? {
        monthNames.firstIndex(where: { $0 == name }).map { $0 + 1 }
    }

    private static func epochSeconds(year: Int, month: Int, day: Int, time: Substring) -> Int64? {
        let parts = time.split(separator: ":")
        guard parts.count == 3, parts.allSatisfy({ $0.count == 2 }),
            let hour = Int(decimal: parts[0]), let minute = Int(decimal: parts[1]), let second = Int(decimal: parts[2])
        else { return nil }
        return epochSeconds(year: year, month: month, day: day, hour: hour, minute: minute, second: second)
    }

    /// Seconds since the epoch of a date and time in range; `nil` for one out of range.
    private static func epochSeconds(year: Int, month: Int, day: Int, hour: Int, minute: Int, second: Int) -> Int64? {
        guard hour < 24, minute < 60, second < 61, (1...31).contains(day), (1...12).contains(month),
            (1900...9999).contains(year)
        else { return nil }
        let days = daysFromCivil(year: Int64(year), month: Int64(month), day: Int64(day))
        return days * 86_400 + Int64(hour * 3600 + minute * 60 + second)
    }

    // Howard Hinnant's days-from-civil algorithm (proleptic Gregorian calendar).
    private static func daysFromCivil(year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    private static func civilDate(fromDays days: Int64) -> (Int64, Int64, Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let mp = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }
}

extension Int {
    init?<S: StringProtocol>(decimal text: S) {
        guard let value = Int64(decimalDigits: text), value <= Int64(Int.max) else { return nil }
        self.init(value)
    }
}
