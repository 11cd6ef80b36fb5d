import Foundation
import Testing

/// Runs the built `haul` executable as a child process.
///
/// `Process` and `Pipe` are not `Sendable`; one test owns each instance and only reads it after the
/// child exits, so sharing the reference across awaits is safe.
final class HaulProcess: @unchecked Sendable {
    /// The `haul` binary next to the test bundle, or `HAUL_BINARY` when set.
    static var executable: String {
        if let path = ProcessInfo.processInfo.environment["HAUL_BINARY"] { return path }
        let bundle = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        return bundle.appendingPathComponent("haul").path
    }

    let process = Process()
    private let output = Pipe()
    private let errors = Pipe()

    /// The state home every test's `haul` shares unless it asks for its own: the database is
    /// built for several processes at once.
    static let sharedStateHome: String = {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("haul-cli-state-\(getpid())").path
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }()

    /// - Parameter stateDirectory: `XDG_STATE_HOME` for the child (the database goes in its `haul` folder).
    /// - Parameter environment: variables set for the child, over this process's; an empty value
    ///   removes one.
    init(
        _ arguments: [String], directory: String? = nil, stateDirectory: String? = nil,
        environment extra: [String: String] = [:]
    ) throws {
        process.executableURL = URL(fileURLWithPath: Self.executable)
        process.arguments = arguments
        if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
        process.standardOutput = output
        process.standardError = errors
        process.standardInput = FileHandle.nullDevice
        var environment = ProcessInfo.processInfo.environment
        environment["XDG_STATE_HOME"] = stateDirectory ?? Self.sharedStateHome
        // The tests decide which proxies the child sees.
        for name in [
            "http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy",
            "NO_PROXY",
        ] {
            environment[name] = nil
        }
        for (name, value) in extra { environment[name] = value.isEmpty ? nil : value }
        process.environment = environment
        try process.run()
    }

    var pid: Int32 { process.processIdentifier }

    func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// Waits for the process to exit and returns its status and output.
    func finish(timeout: Duration = .seconds(60)) async throws -> (status: Int32, output: String, errors: String) {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning {
            if ContinuousClock.now > deadline {
                signal(SIGKILL)
                throw CLITestFailure("haul did not exit within \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        let out = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let err = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        return (process.terminationStatus, out, err)
    }

    /// Runs `haul` to completion.
    static func run(
        _ arguments: [String], directory: String? = nil, stateDirectory: String? = nil,
        environment: [String: String] = [:]
    ) async throws -> (status: Int32, output: String, errors: String) {
        try await HaulProcess(arguments, directory: directory, stateDirectory: stateDirectory, environment: environment)
            .finish()
    }
}

struct CLITestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func makeTemporaryDirectory() throws -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("haul-cli-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

func contents(_ path: String) -> [UInt8]? {
    FileManager.default.contents(atPath: path).map { [UInt8]($0) }
}

func size(_ path: String) -> Int64? {
    (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.int64Value
}
