/// A request's JSON as a store keeps it (``StoredDownload/encodeDefinition(_:)``), written
/// straight into bytes: the same bytes as `JSONEncoder` with sorted keys writes through
/// ``DownloadRequest``'s encoder, in a tenth of the time (an add of a million spent four seconds
/// of CPU encoding them). A field added to that encoder is added here too: the tests compare the
/// two on requests with every field.
struct DefinitionJSON {
    private var bytes: [UInt8] = []
    /// Whether the object or array being written has a member yet.
    private var hasMember = false

    /// The JSON of `request`, without its secret headers.
    static func encode(_ request: DownloadRequest) -> String {
        var writer = DefinitionJSON()
        writer.bytes.reserveCapacity(64 + 2 * request.url.utf8.count)
        writer.object { writer in
            // In the order of their names, as the sorted keys of `JSONEncoder`.
            if let checksum = request.checksum { writer.member("checksum") { $0.string(checksum.description) } }
            if let connections = request.connections { writer.member("connections") { $0.number(connections) } }
            switch request.destination {
            case .file(let path): writer.member("destination") { $0.string(path) }
            case .directory(let path): writer.member("directory") { $0.string(path) }
            }
            let headers = request.headers.filter { !request.isSecret($0.name) }
            if !headers.isEmpty {
                writer.member("headers") { writer in
                    writer.array(headers) { writer, header in
                        writer.object { writer in
                            writer.member("name") { $0.string(header.name) }
                            writer.member("value") { $0.string(header.value) }
                        }
                    }
                }
            }
            if let label = request.label { writer.member("label") { $0.string(label) } }
            if let limit = request.bytesPerSecondLimit { writer.member("limitRate") { $0.number(limit) } }
            if !request.mirrors.isEmpty {
                writer.member("mirrors") { writer in writer.array(request.mirrors) { $0.string($1) } }
            }
            if request.overwrite { writer.member("overwrite") { $0.append("true") } }
            writer.member("url") { $0.string(request.url) }
        }
        return String(decoding: writer.bytes, as: UTF8.self)
    }

    private mutating func append(_ text: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    private mutating func object(_ body: (inout DefinitionJSON) -> Void) {
        bytes.append(UInt8(ascii: "{"))
        hasMember = false
        body(&self)
        bytes.append(UInt8(ascii: "}"))
        hasMember = true
    }

    private mutating func array<Element>(_ elements: [Element], _ body: (inout DefinitionJSON, Element) -> Void) {
        bytes.append(UInt8(ascii: "["))
        for (index, element) in elements.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            body(&self, element)
        }
        bytes.append(UInt8(ascii: "]"))
    }

    /// `"name":` and the value `body` writes, after a comma unless it is the first member.
    private mutating func member(_ name: StaticString, _ body: (inout DefinitionJSON) -> Void) {
        if hasMember { bytes.append(UInt8(ascii: ",")) }
        bytes.append(UInt8(ascii: "\""))
        append(name)
        bytes.append(contentsOf: [UInt8(ascii: "\""), UInt8(ascii: ":")])
        body(&self)
        hasMember = true
    }

    private mutating func number(_ value: some BinaryInteger) {
        bytes.append(contentsOf: String(value).utf8)
    }

    /// A JSON string, escaped as `JSONEncoder` escapes it: the quote, the backslash and the slash,
    /// and the control characters (by their short names where JSON has one).
    private mutating func string(_ value: String) {
        bytes.append(UInt8(ascii: "\""))
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): append("\\\"")
            case UInt8(ascii: "\\"): append("\\\\")
            case UInt8(ascii: "/"): append("\\/")
            case 0x08: append("\\b")
            case 0x0C: append("\\f")
            case UInt8(ascii: "\n"): append("\\n")
            case UInt8(ascii: "\r"): append("\\r")
            case UInt8(ascii: "\t"): append("\\t")
            case 0..<0x20:
                append("\\u00")
                bytes.append(Self.hexDigits[Int(byte >> 4)])
                bytes.append(Self.hexDigits[Int(byte & 0xF)])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)
}
