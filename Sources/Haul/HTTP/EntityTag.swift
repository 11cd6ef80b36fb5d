/// An HTTP entity tag (RFC 9110 §8.8.3): an opaque validator, strong or weak.
public struct EntityTag: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The quoted tag without the `W/` prefix, e.g. `"abc"` including its quotes.
    public let opaqueTag: String
    /// A weak tag says two representations are equivalent, not byte-identical; it never validates a range.
    public let isWeak: Bool

    /// The tag `opaqueTag` (without quotes), weak or strong.
    public init(opaqueTag: String, isWeak: Bool) {
        self.opaqueTag = opaqueTag
        self.isWeak = isWeak
    }

    /// Parses an `ETag` header value; returns `nil` if it is not a quoted tag.
    package init?(_ value: String) {
        var text = value.trimmingHTTPWhitespace()
        var weak = false
        if text.hasPrefix("W/") {
            weak = true
            text = text.dropFirst(2)
        }
        guard text.count >= 2, text.first == "\"", text.last == "\"" else { return nil }
        let inner = text.dropFirst().dropLast()
        // etagc = %x21 / %x23-7E / obs-text: no quote, no control characters, no space.
        guard inner.utf8.allSatisfy({ $0 == 0x21 || ($0 >= 0x23 && $0 != 0x7F) }) else { return nil }
        self.init(opaqueTag: String(text), isWeak: weak)
    }

    /// The header value as it goes on the wire.
    public var description: String { isWeak ? "W/" + opaqueTag : opaqueTag }

    /// Strong comparison: both strong and identical.
    package func stronglyMatches(_ other: EntityTag) -> Bool {
        !isWeak && !other.isWeak && opaqueTag == other.opaqueTag
    }

    /// Weak comparison: identical opaque tags, whatever their strength.
    package func weaklyMatches(_ other: EntityTag) -> Bool {
        opaqueTag == other.opaqueTag
    }
}
