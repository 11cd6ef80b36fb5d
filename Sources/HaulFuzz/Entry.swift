#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

#if FUZZING
/// libFuzzer's entry point; the target is chosen with `HAUL_FUZZ_TARGET`.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>, _ count: Int) -> CInt {
    FuzzTarget.selected.run(Array(UnsafeBufferPointer(start: data, count: count)))
    return 0
}
#else
/// Without the fuzzer: `haul-fuzz TARGET FILE...` replays inputs (a corpus, or a crash to reproduce).
@main
struct Replay {
    static func main() {
        let arguments = CommandLine.arguments.dropFirst()
        guard let name = arguments.first, let target = FuzzTarget(rawValue: name) else {
            print("usage: haul-fuzz TARGET FILE...  (targets: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")))")
            exit(64)
        }
        var count = 0
        for path in arguments.dropFirst() {
            guard let file = fopen(path, "rb") else { continue }
            var bytes: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let read = fread(&buffer, 1, buffer.count, file)
                if read <= 0 { break }
                bytes += buffer[0..<read]
            }
            fclose(file)
            target.run(bytes)
            count += 1
        }
        print("haul-fuzz: \(target.rawValue): \(count) inputs replayed without a failure")
    }
}
#endif
