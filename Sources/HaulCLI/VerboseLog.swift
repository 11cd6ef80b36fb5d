import Haul
import Logging

/// Prints the library's debug messages on standard error for `--verbose`, one line each:
/// `haul: debug: MESSAGE (key=value, …)`, the metadata naming the download's URL.
struct VerboseLogHandler: LogHandler {
    var logLevel: Logger.Level = .debug
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let merged = metadata.merging(event.metadata ?? [:]) { _, new in new }
        let details = merged.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ", ")
        Output.standardError("haul: \(event.level): \(event.message)\(details.isEmpty ? "" : " (\(details))")\n")
    }

    /// The logger `haul` gives the library: debug messages with `--verbose`, none otherwise.
    static func logger(verbose: Bool) -> Logger? {
        verbose ? Logger(label: "haul", factory: { _ in VerboseLogHandler() }) : nil
    }
}
