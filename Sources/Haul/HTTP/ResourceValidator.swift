import NIOHTTP1

/// What identifies one version of a remote file: its entity tag, last-modified date and the digests
/// the server announced for it (`Repr-Digest`, `Digest`).
///
/// Haul stores these with a partial download and refuses to append bytes from a response
/// that does not carry the same validator.
public struct ResourceValidator: Codable, Equatable, Sendable {
    /// The `ETag` of the response, strong or weak.
    public var entityTag: EntityTag?
    /// The raw `Last-Modified` header value.
    public var lastModified: String?
    /// A `Last-Modified` date is a strong validator only if it lies at least one second before the
    /// response's `Date` (RFC 9110 §8.8.2.2); otherwise the file may change again within the same second.
    public var lastModifiedIsStrong: Bool
    /// Digests of the complete file, from `Repr-Digest` or `Digest`.
    public var digests: [Checksum]

    /// A validator with these parts (none by default).
    public init(
        entityTag: EntityTag? = nil, lastModified: String? = nil, lastModifiedIsStrong: Bool = false,
        digests: [Checksum] = []
    ) {
        self.entityTag = entityTag
        self.lastModified = lastModified
        self.lastModifiedIsStrong = lastModifiedIsStrong
        self.digests = digests
    }

    /// Reads the validators of a response.
    package init(headers: HTTPHeaders) {
        self.init(
            etag: headers.first(name: "etag"), lastModified: headers.first(name: "last-modified"),
            date: headers.first(name: "date")
        )
        self.digests = DigestFields.representationDigests(headers)
    }

    /// Reads a validator stored by an earlier version (digests were added later).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        entityTag = try container.decodeIfPresent(EntityTag.self, forKey: .entityTag)
        lastModified = try container.decodeIfPresent(String.self, forKey: .lastModified)
        lastModifiedIsStrong = try container.decode(Bool.self, forKey: .lastModifiedIsStrong)
        digests = try container.decodeIfPresent([Checksum].self, forKey: .digests) ?? []
    }

    /// Reads the validators of a response from its header values.
    package init(etag: String?, lastModified: String?, date: String?) {
        self.entityTag = etag.flatMap(EntityTag.init)
        let modified = lastModified.flatMap { HTTPDate.parse($0) != nil ? $0 : nil }
        self.lastModified = modified
        if let modified, let modifiedSeconds = HTTPDate.parse(modified), let date,
            let dateSeconds = HTTPDate.parse(date)
        {
            self.lastModifiedIsStrong = modifiedSeconds <= dateSeconds - 1
        } else {
            self.lastModifiedIsStrong = false
        }
        self.digests = []
    }

    /// True when the server sent no entity tag, no last-modified date and no digest.
    public var isEmpty: Bool { entityTag == nil && lastModified == nil && digests.isEmpty }

    /// The value for `If-Range`, when this validator may be used there (RFC 9110 §13.1.5):
    /// a strong entity tag; or, only when there is no entity tag at all, a strong date.
    package var ifRangeValue: String? {
        if let entityTag {
            return entityTag.isWeak ? nil : entityTag.description
        }
        if let lastModified, lastModifiedIsStrong { return lastModified }
        return nil
    }

    /// A short human description, e.g. `ETag "abc"` or `Last-Modified …`.
    package var summary: String {
        var parts: [String] = []
        if let entityTag { parts.append("ETag \(entityTag)") }
        if let lastModified { parts.append("Last-Modified \(lastModified)") }
        for digest in digests { parts.append("digest \(digest)") }
        return parts.isEmpty ? "none" : parts.joined(separator: ", ")
    }

    /// Compares the validators a response carries with the stored ones.
    ///
    /// Returns a reason when they contradict: a different entity tag (weak comparison, so a weak tag
    /// matches itself), a different date, or a validator that disappeared.
    package func contradiction(with response: ResourceValidator) -> String? {
        if let stored = entityTag {
            guard let received = response.entityTag else { return "the server no longer sends an ETag (was \(stored))" }
            if !stored.weaklyMatches(received) { return "ETag changed from \(stored) to \(received)" }
        }
        if let stored = lastModified, let received = response.lastModified,
            HTTPDate.parse(stored) != HTTPDate.parse(received)
        {
            return "Last-Modified changed from \(stored) to \(received)"
        }
        if entityTag == nil, lastModified != nil, response.lastModified == nil {
            return "the server no longer sends Last-Modified"
        }
        // A digest only contradicts when the same algorithm gives another value; many servers send
        // them with full answers only.
        for stored in digests {
            if let received = response.digests.first(where: { $0.algorithm == stored.algorithm }), received != stored {
                return "Repr-Digest \(stored.algorithm.rawValue) changed from \(stored.hex) to \(received.hex)"
            }
        }
        return nil
    }
}
