import Crypto

/// A file the test server serves. Its bytes come from ``TestContent``; changing `version` changes
/// both the content and the validators, like a file replaced on a real server.
public struct TestResource: Sendable {
    public enum EntityTagStyle: Sendable {
        case strong, weak, none
    }

    public struct Redirect: Sendable {
        public var status: Int
        public var location: String
        public init(status: Int = 302, location: String) {
            self.status = status
            self.location = location
        }
    }

    public var name: String
    public var size: Int64
    public var version: Int
    public var entityTag: EntityTagStyle
    public var lastModified: Bool
    public var acceptRanges: Bool
    public var contentDisposition: String?
    public var redirect: Redirect?
    /// Send `Repr-Digest: sha-256=…` of the whole current version.
    public var reprDigest: Bool
    /// Send `Content-Digest: sha-256=…` of each response body.
    public var contentDigest: Bool
    /// An entity tag that stays the same across versions, like a server that forgets to change it.
    public var fixedEntityTag: String?
    /// The `Authorization` value a request must carry; others get 401 with a Basic challenge.
    public var requiredAuthorization: String?
    /// A `name=value` the request's `Cookie` must hold; others get 403.
    public var requiredCookie: String?
    /// `Set-Cookie` values sent with every answer (redirects too).
    public var setCookies: [String] = []

    public init(
        name: String, size: Int64, version: Int = 1, entityTag: EntityTagStyle = .strong, lastModified: Bool = true,
        acceptRanges: Bool = true, contentDisposition: String? = nil, redirect: Redirect? = nil,
        reprDigest: Bool = false, contentDigest: Bool = false, fixedEntityTag: String? = nil
    ) {
        self.name = name
        self.size = size
        self.version = version
        self.entityTag = entityTag
        self.lastModified = lastModified
        self.acceptRanges = acceptRanges
        self.contentDisposition = contentDisposition
        self.redirect = redirect
        self.reprDigest = reprDigest
        self.contentDigest = contentDigest
        self.fixedEntityTag = fixedEntityTag
    }

    /// A resource that only redirects.
    public static func redirect(to location: String, status: Int = 302) -> TestResource {
        TestResource(name: "redirect", size: 0, redirect: Redirect(status: status, location: location))
    }

    public var seed: UInt64 { TestContent.seed(name: name, version: version) }

    /// The `ETag` header value, if this resource sends one.
    public var entityTagValue: String? {
        if let fixedEntityTag { return fixedEntityTag }
        return switch entityTag {
        case .strong: "\"\(name)-v\(version)\""
        case .weak: "W/\"\(name)-v\(version)\""
        case .none: nil
        }
    }

    /// Seconds since the epoch of the last change: a fixed date moved by the version, well in the past.
    public var lastModifiedSeconds: Int64 { 1_767_225_600 + Int64(version) * 86_400 }

    /// The bytes in `range` of the current version.
    public func bytes(_ range: Range<Int64>) -> [UInt8] { TestContent.bytes(seed: seed, range: range) }

    /// The whole current version.
    public var content: [UInt8] { bytes(0..<size) }

    /// The SHA-256 of `range` of the current version.
    public func sha256(_ range: Range<Int64>) -> [UInt8] {
        var hasher = SHA256()
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var offset = range.lowerBound
        while offset < range.upperBound {
            let count = Int(min(Int64(buffer.count), range.upperBound - offset))
            buffer.withUnsafeMutableBytes { pointer in
                TestContent.fill(
                    UnsafeMutableRawBufferPointer(rebasing: pointer[0..<count]), seed: seed, offset: offset)
            }
            buffer.withUnsafeBytes { hasher.update(bufferPointer: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
            offset += Int64(count)
        }
        return Array(hasher.finalize())
    }
}
