/// Turns names suggested by servers and URLs into safe file names.
///
/// A safe name has no path separator, no `..`, no control or invisible formatting character (a
/// bidirectional override could disguise its extension), does not start with a dot
/// (no hidden files, no `.`/`..`), and fits in 200 UTF-8 bytes so that Haul's suffixes still fit
/// in the file system's 255-byte limit. Nothing named this way can leave the target directory.
package enum FileNaming {
    /// The longest name Haul gives a file, in UTF-8 bytes.
    package static let maximumNameBytes = 200

    /// Returns a safe version of `suggestion`, or `nil` when nothing usable is left.
    package static func sanitize(_ suggestion: String) -> String? {
        isPlain(suggestion) ? suggestion : sanitizedScalarByScalar(suggestion)
    }

    /// Whether `name` is printable ASCII with no path separator, neither starts nor ends with a
    /// dot or a space, and fits in ``maximumNameBytes``: such a name (the usual name from a URL) is
    /// safe as it is, and ``sanitizedScalarByScalar(_:)`` would return it unchanged.
    static func isPlain(_ name: String) -> Bool {
        let bytes = name.utf8
        guard let first = bytes.first, let last = bytes.last, bytes.count <= maximumNameBytes,
            first != UInt8(ascii: "."), first != UInt8(ascii: " "), last != UInt8(ascii: "."),
            last != UInt8(ascii: " ")
        else { return false }
        return bytes.allSatisfy { byte in
            byte >= 0x20 && byte < 0x7F && byte != UInt8(ascii: "/") && byte != UInt8(ascii: "\\")
        }
    }

    /// ``sanitize(_:)`` for any name, one Unicode scalar at a time.
    static func sanitizedScalarByScalar(_ suggestion: String) -> String? {
        // Keep only the last path component, whichever separator the server used. Separators and the
        // characters taken out are found scalar by scalar: a prepended mark (U+0600) joins the "/"
        // after it into one character, and taking the mark out would leave the "/" behind.
        var components = [String.UnicodeScalarView()]
        for scalar in suggestion.unicodeScalars {
            if scalar == "/" || scalar == "\\" {
                components.append(String.UnicodeScalarView())
            } else if isKept(scalar) {
                components[components.count - 1].append(scalar)
            }
        }
        var scalars = Substring.UnicodeScalarView(components.last { !$0.isEmpty } ?? String.UnicodeScalarView())
        while let first = scalars.first, first == "." || first == " " { scalars.removeFirst() }
        while let last = scalars.last, last == "." || last == " " { scalars.removeLast() }
        guard !scalars.isEmpty else { return nil }
        return truncate(String(scalars))
    }

    /// Whether a character may stay in a name: no control character, and no invisible formatting
    /// (bidirectional overrides and isolates, zero-width characters, line and paragraph separators),
    /// which would make `evil\u{202E}gpj.exe` show as `evilexe.jpg`. The zero-width joiner and
    /// non-joiner stay: they only join or part the letters beside them (Persian and Indic words,
    /// emoji sequences such as a family), and cannot move an extension.
    private static func isKept(_ scalar: Unicode.Scalar) -> Bool {
        if scalar == "\u{200C}" || scalar == "\u{200D}" { return true }
        return switch scalar.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator: false
        default: true
        }
    }

    /// The name for a download of `url` when the server suggests none: the last path segment,
    /// percent-decoded and sanitized, or `index.html`.
    package static func name(fromURLPath path: String) -> String {
        let segment = POSIX.pathComponents(path).last ?? ""
        let decoded =
            ContentDisposition.percentDecode(segment).flatMap { String(validating: $0, as: UTF8.self) } ?? segment
        return sanitize(decoded) ?? "index.html"
    }

    /// Shortens a name to ``maximumNameBytes`` on a character boundary, keeping a short extension.
    static func truncate(_ name: String) -> String {
        guard name.utf8.count > maximumNameBytes else { return name }
        var stem = Substring(name)
        var suffix = ""
        if let dot = name.lastIndex(of: "."), name.distance(from: dot, to: name.endIndex) <= 16 {
            stem = name[..<dot]
            suffix = String(name[dot...])
        }
        var result = ""
        for character in stem {
            if result.utf8.count + character.utf8.count + suffix.utf8.count > maximumNameBytes { break }
            result.append(character)
        }
        guard result.isEmpty else { return result + suffix }
        // The first character alone leaves no room for the extension (a letter with hundreds of
        // marks): the name is cut scalar by scalar instead, so it never becomes the hidden ".ext".
        var scalars = String.UnicodeScalarView()
        for scalar in name.unicodeScalars {
            if String(scalars).utf8.count + String(scalar).utf8.count > maximumNameBytes { break }
            scalars.append(scalar)
        }
        return String(scalars)
    }
}
