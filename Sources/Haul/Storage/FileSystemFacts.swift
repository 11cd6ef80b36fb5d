/// What Haul reads from the kernel's text files to tell whether one flush of a whole file system
/// may stand for the flushes of the files written there (see
/// ``Platform/fileSystemFlushSuits(_:device:)``): plain parsers, the files themselves are read by the
/// platform layer.
enum FileSystemFacts {
    /// Whether a kernel of release `release` (`uname -r`, "6.1.0-13-amd64") reports write errors to
    /// a flush of a whole file system: Linux from 5.8 on.
    static func kernelReportsFileSystemFlushErrors(release: String) -> Bool {
        let numbers = release.split(whereSeparator: { !$0.isNumber }).prefix(2).compactMap { Int($0) }
        guard numbers.count == 2 else { return false }
        return (numbers[0], numbers[1]) >= (5, 8)
    }

    /// The bytes waiting to be written in the page cache, from `/proc/meminfo`'s text: `Dirty` plus
    /// `Writeback`; nil when either is missing or not in kB.
    static func pendingWriteBytes(meminfo: String) -> Int64? {
        var total: Int64 = 0
        var found = 0
        for line in meminfo.split(separator: "\n") {
            guard line.hasPrefix("Dirty:") || line.hasPrefix("Writeback:") else { continue }
            // "Dirty:              1234 kB"
            let fields = line.split(separator: " ")
            guard fields.count == 3, fields[2] == "kB", let kibibytes = Int64(fields[1]) else { return nil }
            total += kibibytes * 1024
            found += 1
        }
        return found == 2 ? total : nil
    }

    /// The type of the file system mounted from device `major`:`minor`, from
    /// `/proc/self/mountinfo`'s text ("36 35 98:0 / /mnt rw,noatime - ext4 /dev/vda rw" gives
    /// "ext4"); nil when no mount of it is listed.
    static func mountType(mountinfo: String, major: UInt64, minor: UInt64) -> String? {
        let device = "\(major):\(minor)"
        for line in mountinfo.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 2, fields[2] == device, let separator = fields.firstIndex(of: "-"),
                separator + 1 < fields.count
            else { continue }
            return String(fields[separator + 1])
        }
        return nil
    }
}
