#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

#if FUZZING
    import CLibFuzzer
#endif

/// Built with `-sanitize=fuzzer -D FUZZING` (see `scripts/fuzz.sh`), this runs libFuzzer on the target
/// named by `HAUL_FUZZ_TARGET`. Built normally, `haul-fuzz TARGET FILE...` replays inputs: a corpus,
/// or a crash to reproduce.
@main
struct FuzzEntry {
    static func main() {
        #if FUZZING
            guard getenv("HAUL_FUZZ_TARGET") != nil else {
                print("set HAUL_FUZZ_TARGET to one of: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", "))")
                exit(64)
            }
            var argc = CommandLine.argc
            var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
            exit(LLVMFuzzerRunDriver(&argc, &argv, fuzzOneInput))
        #else
            replay(Array(CommandLine.arguments.dropFirst()))
        #endif
    }

    static func replay(_ arguments: [String]) {
        guard let name = arguments.first, let target = FuzzTarget(rawValue: name) else {
            print(
                "usage: haul-fuzz TARGET FILE...  (targets: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")))"
            )
            exit(64)
        }
        var count = 0
        for path in arguments.dropFirst() {
            guard let file = fopen(path, "rb") else {
                print("haul-fuzz: cannot open \(path)")
                exit(66)
            }
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

/// Called by libFuzzer with each input.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let data else { return 0 }
    FuzzTarget.selected.run(Array(UnsafeBufferPointer(start: data, count: count)))
    return 0
}
