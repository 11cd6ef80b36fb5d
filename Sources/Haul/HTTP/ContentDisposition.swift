/// Extracts the file name a server suggests in `Content-Disposition` (RFC 6266).
///
/// `filename*` (RFC 8187, UTF-8 percent-encoded) wins over `filename`. The result is the raw
/// suggestion: it must go through ``FileNaming/sanitize(_:)`` before it names anything on disk.
package enum ContentDisposition {
    package static func filename(_ value: String) -> String? {
        var plain: String?
        var extended: String?
        for (name, parameterValue) in parameters(value) {
            switch name {
            case "filename*": extended = decodeExtended(parameterValue)
            case "filename": plain = parameterValue
            default: continue
            }
        }
        return extended ?? plain
    }

    /// Splits `type; a=b; c="d;e"` into lowercased names and unquoted values, skipping the type.
    static func parameters(_ value: String) -> [(String, String)] {
        var result: [(String, String)] = []
        var characters = Substring(value)
        // Skip the disposition type.
        guard let firstSemicolon = characters.firstIndex(of: ";") else { return [] }
        characters = characters[characters.index(after: firstSemicolon)...]
        while !characters.isEmpty {
            characters = characters.trimmingHTTPWhitespace()
            guard let equals = characters.firstIndex(of: "=") else { break }
            let name = characters[..<equals].trimmingHTTPWhitespace().lowercased()
            characters = characters[characters.index(after: equals)...].trimmingHTTPWhitespace()
            var parameterValue = ""
            if characters.first == "\"" {
                characters.removeFirst()
                var escaped = false
                while let character = characters.first {
                    characters.removeFirst()
                    if escaped {
                        parameterValue.append(character)
                        escaped = false
                    } else if character == "\\" {
                        escaped = true
                    } else if character == "\"" {
                        break
                    } else {
                        parameterValue.append(character)
                    }
                }
                if let semicolon = characters.firstIndex(of: ";") {
                    characters = characters[characters.index(after: semicolon)...]
                } else {
                    characters = ""
                }
            } else if let semicolon = characters.firstIndex(of: ";") {
                parameterValue = String(characters[..<semicolon].trimmingHTTPWhitespace())
                characters = characters[characters.index(after: semicolon)...]
            } else {
                parameterValue = String(characters.trimmingHTTPWhitespace())
                characters = ""
            }
            result.append((name, parameterValue))
        }
        return result
    }

    /// Decodes `UTF-8'lang'percent%20encoded`; other charsets than UTF-8 and ISO-8859-1 are refused.
    static func decodeExtended(_ value: String) -> String? {
        let parts = value.split(separator: "'", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        let charset = parts[0].lowercased()
        guard let bytes = percentDecode(parts[2]) else { return nil }
        switch charset {
        case "utf-8": return String(validating: bytes, as: UTF8.self)
        case "iso-8859-1": return String(decoding: bytes.map { UInt16($0) }, as: UTF16.self)
        default: return nil
        }
    }

    static func percentDecode<S: StringProtocol>(_ text: S) -> [UInt8]? {
        var bytes: [UInt8] = []
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            if byte == UInt8(ascii: "%") {
                guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue)
                else { return nil }
                bytes.append(high << 4 | low)
            } else {
                bytes.append(byte)
            }
        }
        return bytes
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
