/// A parsed `Content-Range` header value for byte ranges (RFC 9110 §14.4).
///
/// Either a satisfied range `bytes first-last/complete` (where `complete` may be `*`),
/// or an unsatisfied range `bytes */complete` as sent with `416`.
package struct ContentRange: Equatable, Sendable {
    /// The first byte position, or `nil` for an unsatisfied range.
    package let first: Int64?
    /// The last byte position (inclusive), or `nil` for an unsatisfied range.
    package let last: Int64?
    /// The complete length of the representation, or `nil` when the server sent `*`.
    package let completeLength: Int64?

    package init(first: Int64?, last: Int64?, completeLength: Int64?) {
        self.first = first
        self.last = last
        self.completeLength = completeLength
    }

    /// Parses a header value; returns `nil` for anything that is not a well-formed byte range.
    package init?(_ value: String) {
        let trimmed = value.trimmingHTTPWhitespace()
        guard trimmed.count > 6, trimmed.lowercased().hasPrefix("bytes ") else { return nil }
        let rest = trimmed.dropFirst(6).trimmingHTTPWhitespace()
        guard let slash = rest.firstIndex(of: "/") else { return nil }
        let rangePart = rest[..<slash]
        let lengthPart = rest[rest.index(after: slash)...]

        let completeLength: Int64?
        if lengthPart == "*" {
            completeLength = nil
        } else {
            guard let length = Int64(decimalDigits: lengthPart) else { return nil }
            completeLength = length
        }

        if rangePart == "*" {
            guard let completeLength else { return nil }
            self.init(first: nil, last: nil, completeLength: completeLength)
            return
        }
        guard let dash = rangePart.firstIndex(of: "-"),
            let first = Int64(decimalDigits: rangePart[..<dash]),
            let last = Int64(decimalDigits: rangePart[rangePart.index(after: dash)...]),
            first <= last
        else { return nil }
        if let completeLength, last >= completeLength { return nil }
        self.init(first: first, last: last, completeLength: completeLength)
    }

    /// The number of bytes in a satisfied range.
    package var length: Int64? {
        guard let first, let last else { return nil }
        return last - first + 1
    }
}

extension Int64 {
    /// Parses ASCII decimal digits only: no sign, no spaces, no overflow.
    init?<S: StringProtocol>(decimalDigits text: S) {
        guard !text.isEmpty, text.utf8.count <= 19, text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else {
            return nil
        }
        self.init(text, radix: 10)
    }
}

extension StringProtocol {
    /// Removes the spaces and tabs HTTP allows around field values.
    func trimmingHTTPWhitespace() -> Substring {
        var slice = Substring(self)
        while let first = slice.first, first == " " || first == "\t" { slice.removeFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice.removeLast() }
        return slice
    }
}
