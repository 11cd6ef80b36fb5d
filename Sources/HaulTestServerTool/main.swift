import HaulTestServer

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

// `haul-test-server NAME:SIZE[:BYTES_PER_SECOND]...`: the in-process test server as a process, for
// tests written outside Swift (the page's browser test). Serves each file at /NAME with a strong
// ETag and ranges, prints its base URL on a line, and runs until standard input closes.

/// The files to serve, from the arguments.
struct ServedFile: Sendable {
    let name: String
    let size: Int64
    let rate: Int?
}

var parsed: [ServedFile] = []
for argument in CommandLine.arguments.dropFirst() {
    let fields = argument.split(separator: ":")
    guard (2...3).contains(fields.count), let size = Int64(fields[1]), size >= 0,
        fields.count == 2 || Int(fields[2]) != nil
    else {
        FileHandleLike.standardError("usage: haul-test-server NAME:SIZE[:BYTES_PER_SECOND]...\n")
        exit(64)
    }
    parsed.append(ServedFile(name: String(fields[0]), size: size, rate: fields.count == 3 ? Int(fields[2]) : nil))
}
let files = parsed

try await HaulTestServer.withRunning { server in
    for file in files {
        server.add("/" + file.name, TestResource(name: file.name, size: file.size))
        if let rate = file.rate { server.setStandingFaults("/" + file.name, [.throttle(bytesPerSecond: rate)]) }
    }
    FileHandleLike.standardOutput(server.url("") + "\n")
    // Until standard input closes: the process that started this one decides when it ends.
    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        Thread.detach {
            var byte: UInt8 = 0
            while read(STDIN_FILENO, &byte, 1) > 0 {}
            continuation.resume()
        }
    }
}
