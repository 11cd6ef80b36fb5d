import Dispatch
import NIOPosix
import Synchronization
import Testing

@testable import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

@Suite("Finished files made durable and renamed in batches", .timeLimit(.minutes(1)))
struct FileFinisherTests {
    /// Flushes for real, holding the first directory flush until `release()`, failing the data
    /// flushes of the files named in `failing`, and recording whether any file had its final name
    /// before its data was flushed.
    final class Flushes: Sendable {
        let gate = DispatchSemaphore(value: 0)
        let dataCalls = Atomic<Int>(0)
        let fileSystemCalls = Atomic<Int>(0)
        /// The directories the flushes of a file system went through, in order, and the final names
        /// in each at the time.
        let fileSystemFolders = Mutex<[String]>([])
        let namedAtFileSystemFlush = Mutex<[[String]]>([])
        let directoryCalls = Atomic<Int>(0)
        let namedBeforeFlush = Atomic<Int>(0)
        let failing: Set<String>
        /// What each flush of a file system does after its real flush, by call number from 1:
        /// `true` (it stands for the files' flushes), `false` (it should not now), or nil (it
        /// throws). Nil: each file is flushed on its own.
        let fileSystem: (@Sendable (Int) -> Bool?)?
        /// Whether a flush of the file system may stand for the files' own, as each is handed over.
        let suits: Bool
        /// The directories whose final names each flush of a file system notes (the one it goes
        /// through when empty).
        let watching: [String]

        init(
            failing: Set<String> = [], suits: Bool = true, fileSystem: (@Sendable (Int) -> Bool?)? = nil,
            watching: [String] = []
        ) {
            self.failing = failing
            self.suits = suits
            self.fileSystem = fileSystem
            self.watching = watching
        }

        func flushData(_ file: PartialFile) throws {
            dataCalls.add(1, ordering: .relaxed)
            let name = String(file.path.dropLast(".part".count))
            if POSIX.exists(name) { namedBeforeFlush.add(1, ordering: .relaxed) }
            if failing.contains(String(name.split(separator: "/").last ?? "")) {
                throw HaulError(.fileSystem, "data flush of \(name) failed")
            }
            try file.syncDataNow()
        }

        /// Flushes `folder`'s file system (for real on Linux), noting the final names there.
        func flushFileSystem(_ folder: DirectoryHandle, answer: (Int) -> Bool?) throws -> Bool {
            let call = fileSystemCalls.add(1, ordering: .relaxed).newValue
            fileSystemFolders.withLock { $0.append(folder.path) }
            let named = (watching.isEmpty ? [folder.path] : watching).flatMap { directory in
                ((try? DirectoryHandle.open(directory))?.list() ?? [])
                    .filter { $0.hasPrefix("file") && !$0.hasSuffix(".part") }
            }.sorted()
            namedAtFileSystemFlush.withLock { $0.append(named) }
            #if os(Linux)
                try folder.syncFileSystem()
            #endif
            guard let suits = answer(call) else { throw HaulError(.fileSystem, "flush of the file system failed") }
            return suits
        }

        func flushDirectory(_ folder: DirectoryHandle) throws {
            // Never forever: a test that fails or runs out of time still ends, and the pool's thread
            // it holds is let go.
            if directoryCalls.add(1, ordering: .relaxed).newValue == 1 {
                _ = gate.wait(timeout: .now() + .seconds(30))
            }
            try folder.sync()
        }

        func release() { gate.signal() }

        /// A finisher that flushes through these flushes: each file on its own unless `fileSystem`
        /// was given.
        func finisher() -> FileFinisher {
            var fileSystemFlush: FileFinisher.FileSystemFlush?
            if let answer = fileSystem {
                fileSystemFlush = FileFinisher.FileSystemFlush(
                    suits: { _ in self.suits }, flush: { try self.flushFileSystem($0, answer: answer) })
            }
            return FileFinisher(
                flushData: { try self.flushData($0) }, fileSystemFlush: fileSystemFlush,
                flushDirectory: { try self.flushDirectory($0) })
        }
    }

    /// A partial file `NAME.part` in `folder` holding `NAME`'s own bytes, handed over as `NAME`: a
    /// file written since `folder` was opened, unless `earlier`.
    static func handover(_ name: String, in folder: DirectoryHandle, earlier: Bool = false) throws
        -> FileFinisher.Handover
    {
        let descriptor = try folder.openFile(name + ".part", flags: O_RDWR | O_CREAT)
        let bytes = Array(name.utf8)
        #expect(pwrite(descriptor, bytes, bytes.count, 0) == bytes.count)
        let file = PartialFile(in: folder, name: name + ".part", descriptor: descriptor, io: Self.io)
        return FileFinisher.Handover(
            file: file, folder: folder, partialName: name + ".part", fileName: name,
            confinement: DownloadConfinement(roots: []), writtenSinceOpened: !earlier)
    }

    /// The finishers' thread pool in these tests, not the process's shared one: a held directory
    /// flush holds one of its threads, and the shared pool has as many as the machine has cores,
    /// which every other test running beside these writes its files with.
    static let io: BlockingIO = {
        let pool = NIOThreadPool(numberOfThreads: 8)
        pool.start()
        return BlockingIO(threadPool: pool)
    }()

    /// Finishes `first` while its directory flush is held, hands over `others` behind it (one after
    /// another, in order), then lets it go; returns each of the others' outcome (`nil`: finished).
    static func finishBehindAHeldBatch(
        _ finisher: FileFinisher, _ flushes: Flushes, first: FileFinisher.Handover, others: [FileFinisher.Handover]
    ) async throws -> [String?] {
        let leader = Task { try await finisher.finish(first, io: Self.io) }
        while flushes.directoryCalls.load(ordering: .relaxed) == 0 { try await Task.sleep(for: .milliseconds(1)) }
        return try await withThrowingTaskGroup(of: (Int, String?).self) { group in
            // Let go on a failure too, before the group waits for the others, which wait for the
            // held batch.
            defer { flushes.release() }
            for (index, handover) in others.enumerated() {
                // The one handed over first runs the next batch.
                while index == 1 && finisher.waitingCount == 0 { try await Task.sleep(for: .milliseconds(1)) }
                group.addTask {
                    do {
                        try await finisher.finish(handover, io: Self.io)
                        return (index, nil)
                    } catch let error as HaulError {
                        return (index, error.message)
                    }
                }
            }
            while finisher.waitingCount < others.count { try await Task.sleep(for: .milliseconds(1)) }
            flushes.release()
            try await leader.value
            var outcomes = [String?](repeating: nil, count: others.count)
            for try await (index, outcome) in group { outcomes[index] = outcome }
            return outcomes
        }
    }

    static func contents(_ path: String) throws -> String {
        String(decoding: try POSIX.readWholeFile(path, limit: 1 << 20), as: UTF8.self)
    }

    @Test("files handed over during a batch share the next one; data is flushed before the name changes")
    func filesHandedOverDuringABatchShareTheNext() async throws {
        try await withTemporaryDirectory { path in
            let folder = try DirectoryHandle.open(path)
            let flushes = Flushes()
            let finisher = flushes.finisher()
            let names = (0..<7).map { "file\($0)" }
            let outcomes = try await Self.finishBehindAHeldBatch(
                finisher, flushes, first: try Self.handover(names[0], in: folder),
                others: try names.dropFirst().map { try Self.handover($0, in: folder) })
            #expect(outcomes.allSatisfy { $0 == nil })
            #expect(flushes.dataCalls.load(ordering: .relaxed) == 7)
            // The first file's batch, then one for the six handed over while it ran.
            #expect(flushes.directoryCalls.load(ordering: .relaxed) == 2)
            #expect(flushes.namedBeforeFlush.load(ordering: .relaxed) == 0)
            for name in names {
                #expect(try Self.contents(path + "/" + name) == name)
                #expect(!POSIX.exists(path + "/" + name + ".part"))
            }

            // Nothing running: a lone file is finished on the spot, in a batch of its own.
            try await finisher.finish(try Self.handover("lone", in: folder), io: Self.io)
            #expect(flushes.directoryCalls.load(ordering: .relaxed) == 3)
            #expect(try Self.contents(path + "/lone") == "lone")
        }
    }

    @Test("every file of a batch runs its hook before the batch renames; a permit that says no keeps its file's name")
    func everyHookOfABatchRunsBeforeItsRenames() async throws {
        try await withTemporaryDirectory { path in
            let folder = try DirectoryHandle.open(path)
            let flushes = Flushes()
            let finisher = flushes.finisher()
            let names = (1..<5).map { "file\($0)" }
            // What each hook of the second batch saw of the batch's final names, in the order they ran.
            let seen = Mutex<[String: Int]>([:])
            var others: [FileFinisher.Handover] = []
            for name in names {
                var handover = try Self.handover(name, in: folder)
                handover.beforeRename = {
                    let named = names.filter { POSIX.exists(path + "/" + $0) }.count
                    // Every file of the batch, and the first batch's, has its data flushed by now.
                    #expect(flushes.dataCalls.load(ordering: .relaxed) == 5)
                    seen.withLock { $0[name] = named }
                }
                // Asked after every hook of the batch: a lease that ran out meanwhile stops the rename.
                handover.permit = {
                    #expect(seen.withLock { $0.count } == names.count)
                    return name != "file3"
                }
                others.append(handover)
            }
            let outcomes = try await Self.finishBehindAHeldBatch(
                finisher, flushes, first: try Self.handover("file0", in: folder), others: others)
            #expect(outcomes == [nil, nil, DownloaderConfiguration.writeRefused.message, nil])
            // Every hook ran, and none of them saw a file of its batch renamed yet.
            #expect(seen.withLock { $0 } == ["file1": 0, "file2": 0, "file3": 0, "file4": 0])
            #expect(flushes.directoryCalls.load(ordering: .relaxed) == 2)
            for name in ["file0", "file1", "file2", "file4"] { #expect(try Self.contents(path + "/" + name) == name) }
            #expect(!POSIX.exists(path + "/file3"))
            #expect(try Self.contents(path + "/file3.part") == "file3")
        }
    }

    @Test("a failed data flush fails its own file, which keeps its partial name")
    func aFailedDataFlushFailsItsFile() async throws {
        try await withTemporaryDirectory { path in
            let folder = try DirectoryHandle.open(path)
            let flushes = Flushes(failing: ["file2"])
            let finisher = flushes.finisher()
            let outcomes = try await Self.finishBehindAHeldBatch(
                finisher, flushes, first: try Self.handover("file0", in: folder),
                others: [try Self.handover("file1", in: folder)])
            #expect(outcomes == [nil])
            let failed = await #expect(throws: HaulError.self) {
                try await finisher.finish(try Self.handover("file2", in: folder), io: Self.io)
            }
            #expect(failed?.message == "data flush of \(path)/file2 failed")
            #expect(!POSIX.exists(path + "/file2"))
            #expect(try Self.contents(path + "/file2.part") == "file2")
            for name in ["file0", "file1"] { #expect(try Self.contents(path + "/" + name) == name) }
        }
    }

    @Test("a rename that fails fails its own file only")
    func aFailedRenameFailsItsFileOnly() async throws {
        try await withTemporaryDirectory { path in
            let folder = try DirectoryHandle.open(path)
            let flushes = Flushes()
            let finisher = flushes.finisher()
            // A directory with a file in it stands where one file's final name would go.
            #expect(mkdir(path + "/blocked", 0o755) == 0)
            #expect(close(try POSIX.open(path + "/blocked/inside", flags: O_RDWR | O_CREAT)) == 0)
            let outcomes = try await Self.finishBehindAHeldBatch(
                finisher, flushes, first: try Self.handover("file0", in: folder),
                others: [try Self.handover("blocked", in: folder), try Self.handover("file2", in: folder)])
            #expect(outcomes[0]?.contains("rename") == true)
            #expect(outcomes[1] == nil)
            #expect(try Self.contents(path + "/file2") == "file2")
            #expect(try Self.contents(path + "/blocked.part") == "blocked")
        }
    }

    @Test("a batch's files are flushed with one flush of their file system, before any of them is renamed")
    func aBatchIsFlushedWithOneFlushOfItsFileSystem() async throws {
        try await withTemporaryDirectory { path in
            #expect(mkdir(path + "/other", 0o755) == 0)
            let folder = try DirectoryHandle.open(path)
            let other = try DirectoryHandle.open(path + "/other")
            let flushes = Flushes(fileSystem: { _ in true }, watching: [path, path + "/other"])
            let finisher = flushes.finisher()
            let names = (1..<7).map { "file\($0)" }
            let outcomes = try await Self.finishBehindAHeldBatch(
                finisher, flushes, first: try Self.handover("file0", in: other),
                others: try names.map { try Self.handover($0, in: $0 == "file1" ? other : folder) })
            #expect(outcomes.allSatisfy { $0 == nil })
            // One flush a batch. The second batch's goes through the directory opened first, though
            // the file that leads the batch lies in the other: that directory was open before any of
            // the files was written, so its flush reports their write errors.
            #expect(flushes.fileSystemFolders.withLock { $0 } == [path + "/other", path])
            // No file of a batch had its final name, in either directory, when the batch's file
            // system was flushed: only the first batch's file had it at the second flush.
            #expect(flushes.namedAtFileSystemFlush.withLock { $0 } == [[], ["file0"]])
            #expect(flushes.dataCalls.load(ordering: .relaxed) == 0)
            for name in ["file0"] + names {
                let file = (["file0", "file1"].contains(name) ? path + "/other/" : path + "/") + name
                #expect(try Self.contents(file) == name)
                #expect(!POSIX.exists(file + ".part"))
            }
        }
    }

    @Test("a file written before its directory was opened is flushed on its own")
    func aFileWrittenBeforeItsDirectoryWasOpenedIsFlushedOnItsOwn() async throws {
        try await withTemporaryDirectory { path in
            let folder = try DirectoryHandle.open(path)
            let flushes = Flushes(fileSystem: { _ in true })
            let finisher = flushes.finisher()
            let outcomes = try await Self.finishBehindAHeldBatch(
                finisher, flushes, first: try Self.handover("file0", in: folder),
                others: [
                    try Self.handover("file1", in: folder), try Self.handover("file2", in: folder, earlier: true),
                ])
            #expect(outcomes == [nil, nil])
            #expect(flushes.fileSystemCalls.load(ordering: .relaxed) == 2)
            #expect(flushes.dataCalls.load(ordering: .relaxed) == 1)
            for name in ["file0", "file1", "file2"] { #expect(try Self.contents(path + "/" + name) == name) }
        }
    }

    @Test(
        "where a flush of the file system does not suit, or should not be now, each file is flushed",
        arguments: [false, true])
    func whereAFlushOfTheFileSystemDoesNotSuitEachFileIsFlushed(suits: Bool) async throws {
        try await withTemporaryDirectory { path in
            let folder = try DirectoryHandle.open(path)
            // A file whose own flush fails as it is handed over never joins a batch (see
            // aFailedDataFlushFailsItsFile); one flushed in its batch fails there.
            let flushes = Flushes(failing: suits ? ["file3"] : [], suits: suits, fileSystem: { _ in false })
            let finisher = flushes.finisher()
            let names = (1..<5).map { "file\($0)" }
            let outcomes = try await Self.finishBehindAHeldBatch(
                finisher, flushes, first: try Self.handover("file0", in: folder),
                others: try names.map { try Self.handover($0, in: folder) })
            #expect(outcomes == [nil, nil, suits ? "data flush of \(path)/file3 failed" : nil, nil])
            // Asked as each batch begins only where it suits the file system.
            #expect(flushes.fileSystemCalls.load(ordering: .relaxed) == (suits ? 2 : 0))
            #expect(flushes.dataCalls.load(ordering: .relaxed) == 5)
            #expect(flushes.namedBeforeFlush.load(ordering: .relaxed) == 0)
            for name in ["file0", "file1", "file2", "file4"] { #expect(try Self.contents(path + "/" + name) == name) }
            if suits {
                #expect(!POSIX.exists(path + "/file3"))
                #expect(try Self.contents(path + "/file3.part") == "file3")
            } else {
                #expect(try Self.contents(path + "/file3") == "file3")
            }
        }
    }

    @Test("a failed flush of the file system is made up file by file, and no later batch flushes it")
    func aFailedFlushOfTheFileSystemIsMadeUpFileByFile() async throws {
        try await withTemporaryDirectory { path in
            let folder = try DirectoryHandle.open(path)
            // The first flush fails; any later one would stand for the files' own.
            let flushes = Flushes(fileSystem: { $0 == 1 ? nil : true })
            let finisher = flushes.finisher()
            let names = (1..<5).map { "file\($0)" }
            let outcomes = try await Self.finishBehindAHeldBatch(
                finisher, flushes, first: try Self.handover("file0", in: folder),
                others: try names.map { try Self.handover($0, in: folder) })
            #expect(outcomes.allSatisfy { $0 == nil })
            // The failure may have reported a write of a file of a later batch: those are flushed on
            // their own too.
            #expect(flushes.fileSystemCalls.load(ordering: .relaxed) == 1)
            #expect(flushes.dataCalls.load(ordering: .relaxed) == 5)
            #expect(flushes.namedBeforeFlush.load(ordering: .relaxed) == 0)
            for name in ["file0"] + names { #expect(try Self.contents(path + "/" + name) == name) }
        }
    }

    #if os(Linux)
        @Test("the data waiting to be written is read from this machine's /proc/meminfo in one read")
        func pendingWriteBytesAreRead() throws {
            let pending = try #require(Platform.pendingWriteBytes())
            #expect(pending >= 0)
            // The same text read the general way tells a figure of the same order (both move as the
            // machine writes).
            let text = String(decoding: try POSIX.readWholeFile("/proc/meminfo", limit: 1 << 16), as: UTF8.self)
            let again = try #require(FileSystemFacts.pendingWriteBytes(meminfo: text))
            #expect(abs(again - pending) < 1 << 30)
        }
    #endif

    @Test("a flush of a file system is trusted from kernel 5.8 on, on ext4 alone of its number, up to the data waiting")
    func theFactsAFlushOfAFileSystemRestsOn() {
        #expect(FileSystemFacts.kernelReportsFileSystemFlushErrors(release: "6.1.0-13-amd64"))
        #expect(FileSystemFacts.kernelReportsFileSystemFlushErrors(release: "5.8.0"))
        #expect(!FileSystemFacts.kernelReportsFileSystemFlushErrors(release: "5.7.19"))
        #expect(!FileSystemFacts.kernelReportsFileSystemFlushErrors(release: "4.4.0"))
        #expect(!FileSystemFacts.kernelReportsFileSystemFlushErrors(release: "unknown"))

        let meminfo =
            "MemTotal:       24000000 kB\nDirty:              1234 kB\nWriteback:            16 kB\n"
            + "WritebackTmp:          7 kB\n"
        #expect(FileSystemFacts.pendingWriteBytes(meminfo: meminfo) == Int64(1250 * 1024))
        #expect(FileSystemFacts.pendingWriteBytes(meminfo: "Dirty:    1 kB\n") == nil)
        #expect(FileSystemFacts.pendingWriteBytes(meminfo: "Dirty:    1 MB\nWriteback:    0 kB\n") == nil)

        let mountinfo = """
            22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
            30 22 254:2 / /old rw,relatime shared:2 - ext2 /dev/vda2 rw
            31 22 0:45 / /dev/shm rw,nosuid shared:3 - tmpfs tmpfs rw
            """
        #expect(FileSystemFacts.mountType(mountinfo: mountinfo, major: 254, minor: 1) == "ext4")
        #expect(FileSystemFacts.mountType(mountinfo: mountinfo, major: 254, minor: 2) == "ext2")
        #expect(FileSystemFacts.mountType(mountinfo: mountinfo, major: 0, minor: 45) == "tmpfs")
        #expect(FileSystemFacts.mountType(mountinfo: mountinfo, major: 254, minor: 3) == nil)
    }
}
