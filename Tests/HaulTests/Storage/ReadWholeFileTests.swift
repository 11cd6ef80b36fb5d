import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

@Suite("Reading a whole file", .timeLimit(.minutes(1)))
struct ReadWholeFileTests {
    @Test("a file is read whole, up to the limit")
    func aFileIsReadWholeUpToTheLimit() async throws {
        try await withTemporaryDirectory { path in
            let bytes = [UInt8](repeating: 7, count: 200_000)
            let descriptor = try POSIX.open(path + "/f", flags: O_RDWR | O_CREAT)
            defer { POSIX.close(descriptor) }
            try bytes.withUnsafeBytes { try POSIX.write(descriptor, $0, at: 0, path: path + "/f") }
            #expect(try POSIX.readWholeFile(path + "/f", limit: 1 << 20) == bytes)
            #expect(try POSIX.readWholeFile(path + "/f", limit: 70_000).count == 70_000)
        }
    }

    #if os(Linux)
        @Test("a kernel file whose size says 0 is read to its end")
        func aKernelFileIsReadToItsEnd() throws {
            // Mappings of alternating protections, which the kernel cannot merge: each adds an entry
            // of about 1 KiB to /proc/self/smaps.
            let page = Int(sysconf(Int32(_SC_PAGESIZE)))
            var mappings: [UnsafeMutableRawPointer] = []
            defer { for mapping in mappings { munmap(mapping, page) } }
            let region = try #require(mmap(nil, page * 400, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))
            #expect(region != MAP_FAILED)
            for index in 0..<400 {
                let mapping = region + index * page
                #expect(mprotect(mapping, page, index % 2 == 0 ? PROT_READ : PROT_READ | PROT_WRITE) == 0)
                mappings.append(mapping)
            }
            let text = String(decoding: try POSIX.readWholeFile("/proc/self/smaps", limit: 1 << 24), as: UTF8.self)
            #expect(text.utf8.count > 300_000)
            #expect(text.hasSuffix("\n"))
        }
    #endif
}
