/// A parsed `Range: bytes=…` request header (RFC 9110 §14.1.2), as the test server understands it.
public struct ByteRangeSet: Equatable, Sendable {
    public enum Spec: Equatable, Sendable {
        /// `first-last` or, with `last == nil`, `first-`.
        case from(first: Int64, last: Int64?)
        /// `-count`: the last `count` bytes.
        case suffix(count: Int64)
    }

    public let specs: [Spec]

    /// Parses the header value; `nil` when it is malformed (the server then ignores it, as RFC 9110 allows).
    public init?(_ value: String) {
        let trimmed = value.trimmingCharacters(in: " \t")
        guard trimmed.lowercased().hasPrefix("bytes=") else { return nil }
        var specs: [Spec] = []
        for part in trimmed.dropFirst(6).split(separator: ",", omittingEmptySubsequences: false) {
            let item = String(part).trimmingCharacters(in: " \t")
            guard let dash = item.firstIndex(of: "-") else { return nil }
            let first = item[..<dash]
            let last = item[item.index(after: dash)...]
            if first.isEmpty {
                guard let count = Self.number(last) else { return nil }
                specs.append(.suffix(count: count))
            } else {
                guard let start = Self.number(first) else { return nil }
                if last.isEmpty {
                    specs.append(.from(first: start, last: nil))
                } else {
                    guard let end = Self.number(last), end >= start else { return nil }
                    specs.append(.from(first: start, last: end))
                }
            }
        }
        guard !specs.isEmpty else { return nil }
        self.specs = specs
    }

    /// The satisfiable ranges for a representation of `length` bytes, as half-open ranges.
    public func resolve(length: Int64) -> [Range<Int64>] {
        specs.compactMap { spec in
            switch spec {
            case .from(let first, let last):
                guard first < length else { return nil }
                return first..<min(last.map { $0 + 1 } ?? length, length)
            case .suffix(let count):
                guard count > 0, length > 0 else { return nil }
                return max(0, length - count)..<length
            }
        }
    }

    private static func number<S: StringProtocol>(_ text: S) -> Int64? {
        guard !text.isEmpty, text.count <= 18, text.utf8.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { return nil }
        return Int64(text)
    }
}

extension String {
    func trimmingCharacters(in set: String) -> String {
        var slice = Substring(self)
        while let first = slice.first, set.contains(first) { slice.removeFirst() }
        while let last = slice.last, set.contains(last) { slice.removeLast() }
        return String(slice)
    }
}
