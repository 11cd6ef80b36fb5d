#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// A queue's schedules and rules: when downloads may start, the total limit by the time of day
/// ("turtle mode"), and what downloads of a site or of a kind of file get when they are added.
///
/// Times are the machine's local time (``DownloadManager/Configuration/timeZone``). The manager
/// looks at them on each of its ticks, so crossing a window's edge changes the limit, or starts and
/// stops downloads, within a second and without a restart.
public struct QueueRules: Sendable, Codable, Equatable {
    /// A time of the week that repeats: on `days` (every day when empty), from `from` to `to`
    /// (minutes after midnight; a window whose end is not after its start runs past midnight into
    /// the next day, and one whose ends are equal lasts the whole day).
    public struct Window: Sendable, Codable, Equatable {
        /// Days of the week, 1 for Sunday to 7 for Saturday (the calendar's numbering); empty for every day.
        public var days: Set<Int>
        /// Minutes after midnight when the window opens, 0 to 1439.
        public var from: Int
        /// Minutes after midnight when it closes, 0 to 1439.
        public var to: Int

        /// A window on `days` (every day when empty) between two times of day, in minutes.
        public init(days: Set<Int> = [], from: Int, to: Int) {
            self.days = days
            self.from = from
            self.to = to
        }

        /// Whether the window holds the moment that is `minute` minutes into `weekday`.
        func contains(weekday: Int, minute: Int) -> Bool {
            let previous = weekday == 1 ? 7 : weekday - 1
            func on(_ day: Int) -> Bool { days.isEmpty || days.contains(day) }
            if from == to { return on(weekday) }
            if from < to { return on(weekday) && minute >= from && minute < to }
            // Past midnight: the evening part belongs to the day it opens, the morning part to the day before.
            return (on(weekday) && minute >= from) || (on(previous) && minute < to)
        }
    }

    /// A total limit that holds inside its window.
    public struct SpeedLimit: Sendable, Codable, Equatable {
        /// When it holds.
        public var window: Window
        /// Bytes per second all downloads together may receive then.
        public var bytesPerSecond: Int64

        /// A limit of `bytesPerSecond` inside `window`.
        public init(window: Window, bytesPerSecond: Int64) {
            self.window = window
            self.bytesPerSecond = bytesPerSecond
        }
    }

    /// What the downloads of matching hosts get when added: each part only where the request has
    /// none of its own.
    public struct SiteRule: Sendable, Codable, Equatable {
        /// A host name (`example.com`), or `*.example.com` for it and every name beneath it.
        public var host: String
        /// Connections per download.
        public var connections: Int?
        /// A limit of each download, in bytes per second.
        public var bytesPerSecond: Int64?
        /// Headers added when the request has none of the same name.
        public var headers: [Header]
        /// A folder for a download headed to a directory: relative ones go beneath that directory.
        public var directory: String?

        /// A rule for `host`.
        public init(
            host: String, connections: Int? = nil, bytesPerSecond: Int64? = nil, headers: [Header] = [],
            directory: String? = nil
        ) {
            self.host = host
            self.connections = connections
            self.bytesPerSecond = bytesPerSecond
            self.headers = headers
            self.directory = directory
        }

        /// Whether the rule is for `host` (lower case).
        func matches(_ host: String) -> Bool {
            let pattern = self.host.lowercased()
            guard pattern.hasPrefix("*.") else { return host == pattern }
            let domain = pattern.dropFirst(2)
            return host == domain || host.hasSuffix("." + domain)
        }
    }

    /// A header a rule adds.
    public struct Header: Sendable, Codable, Equatable {
        /// Its name.
        public var name: String
        /// Its value.
        public var value: String

        /// A header `name: value`.
        public init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// A folder for the files of some extensions, for downloads headed to a directory.
    public struct Category: Sendable, Codable, Equatable {
        /// A name for people (`Disk images`).
        public var name: String
        /// Extensions without the dot, compared without regard to case (`iso`, `img`).
        public var extensions: [String]
        /// The folder: relative ones go beneath the directory the download was headed to.
        public var directory: String

        /// A category `name` of files ending in `extensions`, into `directory`.
        public init(name: String, extensions: [String], directory: String) {
            self.name = name
            self.extensions = extensions
            self.directory = directory
        }
    }

    /// Total limits by the time of the week; where several hold, the lowest.
    public var speedLimits: [SpeedLimit]
    /// When any is given, downloads run only inside one of them: none starts outside, and one
    /// running when the last closes stops with a checkpoint and waits, queued, for the next.
    public var startWindows: [Window]
    /// Rules by host; the first that matches applies.
    public var sites: [SiteRule]
    /// Folders by file extension; the first that matches applies, after a site's folder.
    public var categories: [Category]

    /// Rules as given (none by default).
    public init(
        speedLimits: [SpeedLimit] = [], startWindows: [Window] = [], sites: [SiteRule] = [],
        categories: [Category] = []
    ) {
        self.speedLimits = speedLimits
        self.startWindows = startWindows
        self.sites = sites
        self.categories = categories
    }

    /// Throws for a rule that cannot hold: a time or day out of range, a limit or connection count
    /// below 1, an empty host, extension or folder, a folder with `..`, a header Haul manages.
    public func check() throws {
        for window in speedLimits.map(\.window) + startWindows {
            guard (0..<1440).contains(window.from), (0..<1440).contains(window.to),
                window.days.allSatisfy({ (1...7).contains($0) })
            else {
                throw HaulError(
                    .invalidArgument, "a window's times are 00:00 to 23:59 and its days 1 (Sunday) to 7 (Saturday)")
            }
        }
        for limit in speedLimits where limit.bytesPerSecond < 1 {
            throw HaulError(.invalidArgument, "a scheduled limit is at least 1 byte per second")
        }
        for site in sites {
            let name = site.host.hasPrefix("*.") ? String(site.host.dropFirst(2)) : site.host
            guard !name.isEmpty, !name.contains("*"), !name.contains("/"), !name.contains(" ") else {
                throw HaulError(.invalidArgument, "a site rule's host is a name or *.name, got \"\(site.host)\"")
            }
            if let connections = site.connections, !(1...DownloadRequest.maximumConnections).contains(connections) {
                throw HaulError(
                    .invalidArgument, "a site rule's connections are 1 to \(DownloadRequest.maximumConnections)")
            }
            if let limit = site.bytesPerSecond, limit < 1 {
                throw HaulError(.invalidArgument, "a site rule's limit is at least 1 byte per second")
            }
            try DownloadRequest.check(headers: site.headers.map { ($0.name, $0.value) })
            // Rules are stored and shown: a secret would be too.
            if let secret = site.headers.first(where: { DownloadRequest.looksSecret($0.name) }) {
                throw HaulError(
                    .invalidArgument, "a site rule cannot hold \(secret.name): rules are stored, and secrets never are")
            }
        }
        for category in categories
        where category.extensions.isEmpty || category.extensions.contains(where: \.isEmpty) {
            throw HaulError(.invalidArgument, "the category \"\(category.name)\" needs one or more extensions")
        }
        for folder in sites.compactMap(\.directory) + categories.map(\.directory) {
            guard !folder.isEmpty, !folder.contains("\0"), !POSIX.pathComponents(folder).contains("..") else {
                throw HaulError(.invalidArgument, "a rule's folder is a path without \"..\", got \"\(folder)\"")
            }
        }
    }

    /// Whether any rule changes what is added.
    var changesRequests: Bool { !sites.isEmpty || !categories.isEmpty }

    /// `requests` with what the rules give each: the same array, not copied, when no rule changes
    /// what is added (a long list added without rules pays nothing).
    public func applied(to requests: [DownloadRequest]) -> [DownloadRequest] {
        changesRequests ? requests.map(applied) : requests
    }

    /// `request` with what the rules give its host and its kind of file.
    public func applied(to request: DownloadRequest) -> DownloadRequest {
        guard changesRequests else { return request }
        var request = request
        let parsed = URL(string: request.url)
        let host = parsed?.host?.lowercased() ?? ""
        var folder: String?
        if let site = sites.first(where: { $0.matches(host) }) {
            if request.connections == nil { request.connections = site.connections }
            if request.bytesPerSecondLimit == nil { request.bytesPerSecondLimit = site.bytesPerSecond }
            for header in site.headers
            where !request.headers.contains(where: { $0.name.lowercased() == header.name.lowercased() }) {
                request.headers.append((header.name, header.value))
            }
            folder = site.directory
        }
        if folder == nil, let name = parsed?.lastPathComponent, let dot = name.lastIndex(of: ".") {
            let found = name[name.index(after: dot)...].lowercased()
            folder = categories.first { $0.extensions.contains { $0.lowercased() == found } }?.directory
        }
        if let folder, case .directory(let directory) = request.destination {
            request.destination = .directory(folder.hasPrefix("/") ? folder : directory + "/" + folder)
        }
        return request
    }

    /// Where the rules stand at one moment.
    public struct Now: Sendable, Equatable {
        /// The total limit a speed window sets now (the lowest, where several hold); `nil` when none holds.
        public var bytesPerSecond: Int64?
        /// Whether downloads may start now.
        public var startsDownloads: Bool
    }

    /// Where the rules stand at `date`, in `timeZone`.
    public func now(at date: Date, in timeZone: TimeZone) -> Now {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        let parts = calendar.dateComponents([.weekday, .hour, .minute], from: date)
        let weekday = parts.weekday ?? 1
        let minute = (parts.hour ?? 0) * 60 + (parts.minute ?? 0)
        let limit = speedLimits.filter { $0.window.contains(weekday: weekday, minute: minute) }
            .map(\.bytesPerSecond).min()
        let starts = startWindows.isEmpty || startWindows.contains { $0.contains(weekday: weekday, minute: minute) }
        return Now(bytesPerSecond: limit, startsDownloads: starts)
    }
}

// MARK: JSON (the daemon's API and its rules file)

extension QueueRules.Window {
    private enum CodingKeys: String, CodingKey { case days, from, to }

    /// Days as `sun` … `sat`.
    static let dayNames = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]

    /// Reads `{"days": ["mon", "tue"], "from": "09:00", "to": "18:00"}`; `days` may be left out.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        var days = Set<Int>()
        for name in try container.decodeIfGiven([String].self, forKey: .days) ?? [] {
            guard let index = Self.dayNames.firstIndex(of: name) else {
                throw DecodingError.dataCorruptedError(
                    forKey: .days, in: container, debugDescription: "a day is one of \(Self.dayNames), got \(name)")
            }
            days.insert(index + 1)
        }
        self.days = days
        from = try Self.minutes(container, .from)
        to = try Self.minutes(container, .to)
    }

    /// Writes the days as names and the times as `HH:MM`.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        if !days.isEmpty { try container.encode(days.sorted().map { Self.dayNames[$0 - 1] }, forKey: .days) }
        try container.encode(Self.text(from), forKey: .from)
        try container.encode(Self.text(to), forKey: .to)
    }

    private static func minutes(_ container: KeyedDecodingContainer<CodingKeys>, _ key: CodingKeys) throws -> Int {
        let text = try container.decode(String.self, forKey: key)
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, parts[1].count == 2, let hours = Int(parts[0]), let minutes = Int(parts[1]),
            (0..<24).contains(hours), (0..<60).contains(minutes)
        else {
            throw DecodingError.dataCorruptedError(
                forKey: key, in: container, debugDescription: "a time of day is HH:MM, got \(text)")
        }
        return hours * 60 + minutes
    }

    static func text(_ minutes: Int) -> String {
        let (hours, rest) = (minutes / 60, minutes % 60)
        return (hours < 10 ? "0" : "") + "\(hours):" + (rest < 10 ? "0" : "") + "\(rest)"
    }
}

extension QueueRules {
    private enum CodingKeys: String, CodingKey { case speedLimits, startWindows, sites, categories }

    /// Reads the rules; a kind left out has none.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        speedLimits = try container.decodeIfGiven([SpeedLimit].self, forKey: .speedLimits) ?? []
        startWindows = try container.decodeIfGiven([Window].self, forKey: .startWindows) ?? []
        sites = try container.decodeIfGiven([SiteRule].self, forKey: .sites) ?? []
        categories = try container.decodeIfGiven([Category].self, forKey: .categories) ?? []
    }
}

extension QueueRules.SpeedLimit {
    private enum CodingKeys: String, CodingKey { case days, from, to, limitRate }

    /// Reads `{"days": […], "from": "09:00", "to": "18:00", "limitRate": 1048576}`.
    public init(from decoder: any Decoder) throws {
        window = try QueueRules.Window(from: decoder)
        bytesPerSecond = try decoder.container(keyedBy: CodingKeys.self).decode(Int64.self, forKey: .limitRate)
    }

    /// Writes the window's fields beside `limitRate`.
    public func encode(to encoder: any Encoder) throws {
        try window.encode(to: encoder)
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(bytesPerSecond, forKey: .limitRate)
    }
}

extension QueueRules.SiteRule {
    private enum CodingKeys: String, CodingKey { case host, connections, limitRate, headers, directory }

    /// Reads a rule; everything but `host` may be left out.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        host = try container.decode(String.self, forKey: .host)
        connections = try container.decodeIfGiven(Int.self, forKey: .connections)
        bytesPerSecond = try container.decodeIfGiven(Int64.self, forKey: .limitRate)
        headers = try container.decodeIfGiven([QueueRules.Header].self, forKey: .headers) ?? []
        directory = try container.decodeIfGiven(String.self, forKey: .directory)
    }

    /// Writes the parts the rule has.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(host, forKey: .host)
        try container.encodeIfPresent(connections, forKey: .connections)
        try container.encodeIfPresent(bytesPerSecond, forKey: .limitRate)
        if !headers.isEmpty { try container.encode(headers, forKey: .headers) }
        try container.encodeIfPresent(directory, forKey: .directory)
    }
}

extension KeyedDecodingContainer {
    /// The value of `key` when given; left out is `nil`, and a `null` is refused like any other
    /// value of the wrong type (a rule written `null` is more likely a mistake than "none").
    fileprivate func decodeIfGiven<Value: Decodable>(_ type: Value.Type, forKey key: Key) throws -> Value? {
        contains(key) ? try decode(type, forKey: key) : nil
    }
}
