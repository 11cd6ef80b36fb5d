/// What one commit of a shared queue changed, as the other managers sharing it hear of it: a fleet's
/// workers tell each other through PostgreSQL (`LISTEN`/`NOTIFY`), so that each worker's event
/// streams show the downloads the others add, run and remove (see ``QueueStore/notices()``).
package struct QueueNotice: Sendable, Equatable {
    /// The manager that made the commit (the owner name its records carry); empty when unknown.
    package var sender: String
    /// Downloads the commit added.
    package var added: [DownloadID] = []
    /// Downloads the commit changed.
    package var changed: [DownloadID] = []
    /// Downloads the commit removed.
    package var removed: [DownloadID] = []

    /// A notice of `sender`'s commit.
    package init(
        sender: String, added: [DownloadID] = [], changed: [DownloadID] = [], removed: [DownloadID] = []
    ) {
        self.sender = sender
        self.added = added
        self.changed = changed
        self.removed = removed
    }

    /// How many IDs one payload carries at most: a `NOTIFY` payload holds under 8,000 bytes, and an
    /// ID takes at most 20 digits and a space.
    static let idsPerPayload = 300

    /// The notice as text payloads, each of at most ``idsPerPayload`` IDs: the sender on the first
    /// line, then a line per kind of change (`a`, `c`, `r`) with its IDs.
    package var payloads: [String] {
        var parts: [(kind: String, ids: ArraySlice<DownloadID>)] = []
        for (kind, ids) in [("a", added), ("c", changed), ("r", removed)] {
            for start in stride(from: 0, to: ids.count, by: Self.idsPerPayload) {
                parts.append((kind, ids[start..<min(ids.count, start + Self.idsPerPayload)]))
            }
        }
        return parts.map { part in
            // A name is one line: a sender that is not is left unknown.
            let sender = self.sender.contains("\n") ? "" : self.sender
            return sender + "\n" + part.kind + ":" + part.ids.map(\.description).joined(separator: " ")
        }
    }

    /// The notice one payload carries; `nil` for a payload that is not one.
    package init?(payload: String) {
        let lines = payload.split(separator: "\n", omittingEmptySubsequences: false)
        guard lines.count >= 2 else { return nil }
        self.init(sender: String(lines[0]))
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { return nil }
            var ids: [DownloadID] = []
            for number in line[line.index(after: colon)...].split(separator: " ") {
                guard let value = Int64(number), value > 0 else { return nil }
                ids.append(DownloadID(value))
            }
            switch line[..<colon] {
            case "a": added += ids
            case "c": changed += ids
            case "r": removed += ids
            default: return nil
            }
        }
    }
}
