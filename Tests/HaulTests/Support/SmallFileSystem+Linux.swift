#if os(Linux)
    import Glibc

    /// Whether a test may mount a small file system (root with the right to mount: a container's root
    /// may lack it), found by mounting one. Tests that need one are skipped, not failed, without it.
    let canMountSmallFileSystem: Bool = {
        guard geteuid() == 0 else { return false }
        var template = Array("/tmp/haul-mount-probe-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { return false }
        let path = String(cString: made)
        defer { rmdir(path) }
        guard mount("tmpfs", path, "tmpfs", 0, "size=65536") == 0 else { return false }
        umount2(path, Int32(MNT_DETACH))
        return true
    }()

    /// Mounts a tmpfs of `size` bytes at `path` for `body`: a real small file system that fills up.
    func withSmallFileSystem<Result>(at path: String, size: Int, _ body: () async throws -> Result) async throws
        -> Result
    {
        guard mkdir(path, 0o755) == 0 else { throw TestFailure("mkdir \(path) failed") }
        guard mount("tmpfs", path, "tmpfs", 0, "size=\(size)") == 0 else {
            throw TestFailure("mounting a tmpfs at \(path) failed (errno \(errno)); these tests need root")
        }
        defer { umount2(path, Int32(MNT_DETACH)) }
        return try await body()
    }

    /// Fills the file system holding `directory` with a file until no byte is free; returns the file's path.
    func fillFileSystem(_ directory: String) throws -> String {
        let path = directory + "/filler"
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        guard descriptor >= 0 else { throw TestFailure("cannot create \(path)") }
        defer { close(descriptor) }
        let chunk = [UInt8](repeating: 0xAB, count: 64 * 1024)
        var size = chunk.count
        while size > 0 {
            let written = chunk.withUnsafeBytes { write(descriptor, $0.baseAddress, size) }
            if written < 0 {
                guard errno == ENOSPC else { throw TestFailure("filling failed with errno \(errno)") }
                size /= 2
            }
        }
        return path
    }
#endif
