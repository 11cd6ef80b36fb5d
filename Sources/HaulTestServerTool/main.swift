import HaulTestServer

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

// `haul-test-server [--bandwidth BYTES_PER_SECOND] NAME:SIZE[:BYTES_PER_SECOND]...`: the in-process
// test server as a process, for tests and benchmarks written outside Swift (the page's browser test,
// bench/mirrors.sh). Serves each file at /NAME with a strong ETag and ranges, each answer held to
// its own rate when one is given and the whole server to --bandwidth; prints its base URL on a line,
// and runs until standard input closes.

/// The files to serve, from the arguments.
struct ServedFile: Sendable {
    let name: String
    let size: Int64
    let rate: Int?
}

let usage = "usage: haul-test-server [--bandwidth BYTES_PER_SECOND] NAME:SIZE[:BYTES_PER_SECOND]...\n"
var parsed: [ServedFile] = []
var parsedBandwidth: Int?
var arguments = CommandLine.arguments.dropFirst()
while let argument = arguments.popFirst() {
    if argument == "--bandwidth" {
        guard let value = arguments.popFirst().flatMap({ Int($0) }), value > 0 else {
            FileHandleLike.standardError("haul-test-server: --bandwidth needs a positive number\n" + usage)
            exit(64)
        }
        parsedBandwidth = value
        continue
    }
    let fields = argument.split(separator: ":")
    guard (2...3).contains(fields.count), let size = Int64(fields[1]), size >= 0,
        fields.count == 2 || Int(fields[2]) != nil
    else {
        FileHandleLike.standardError(usage)
        exit(64)
    }
    parsed.append(ServedFile(name: String(fields[0]), size: size, rate: fields.count == 3 ? Int(fields[2]) : nil))
}
let files = parsed
let bandwidth = parsedBandwidth

try await HaulTestServer.withRunning { server in
    server.limitBandwidth(bytesPerSecond: bandwidth)
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
