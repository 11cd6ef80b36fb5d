import Foundation
import HaulTestServer

/// The many-small-files mode (`--files N`): haul downloads N small files from one input file, 16 at
/// a time, into one directory with one state database, and is SIGKILLed at random moments.
///
/// After every kill, every file's final name is absent or holds exactly the file; every partial
/// file holds only the file's bytes where a resume would keep them; and every download `haul ls
/// --json` reports completed is there with the right bytes. After the final run every file is
/// complete, nothing but the files is left in the directory, and every download is completed.
extension Torture {
    /// A file of the many-files mode: its path on the server and what it serves.
    struct SmallFile {
        let name: String
        let resource: TestResource
    }

    func tortureMany(_ server: HaulTestServer) async throws -> String {
        var random = SeededRandom(seed: seed)
        let smallFiles = (1...files).map { index in
            SmallFile(
                name: "f\(index)", resource: TestResource(name: "f\(index)", size: Int64(random.next(in: 2048...65536)))
            )
        }
        for file in smallFiles { server.add("/" + file.name, file.resource) }
        let work = directory ?? NSTemporaryDirectory() + "haul-torture-files-\(seed)"
        let folder = work + "/files"
        let state = work + "/state"
        try? FileManager.default.removeItem(atPath: work)
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let list = work + "/list.txt"
        let text = smallFiles.map { server.url("/" + $0.name) + "\n" }.joined()
        try text.write(toFile: list, atomically: true, encoding: .utf8)
        let arguments = [
            "get", "-i", list, "-j", "16", "-d", folder, "--state-dir", state, "-q", "--retries", "1000",
            "--retry-delay", "0.05", "--stall-timeout", "1",
        ]
        var applied: [String: Int] = [:]
        var completions = 0
        var seen = FolderCounts()
        var killsFromStart = 0

        for round in 1...kills {
            // A few files misbehave on their next request, and about one in ten is slow for the
            // whole round, so kills find downloads under way.
            for file in smallFiles {
                let path = "/" + file.name
                var steps: [[Fault]] = []
                if random.next(in: 0...99) < 3 {
                    let (name, fault) = smallFault(&random, size: file.resource.size)
                    steps.append([fault])
                    applied[name, default: 0] += 1
                }
                server.script(path, steps)
                let slow = random.next(in: 0...9) == 0
                server.setStandingFaults(
                    path, slow ? [.throttle(bytesPerSecond: random.next(in: 32...256) * 1024)] : [])
            }
            let delay = random.next(in: minimumKillDelay...maximumKillDelay)
            // One kill in four counts from the start, so some land while haul reads its list and
            // its database; the others count from the first change haul makes to the directory, so
            // they land among the transfers even when starting takes longer than the delay.
            let fromStart = random.next(in: 0...3) == 0
            let before = modificationDate(folder)
            let process = try launch(arguments)
            if fromStart {
                killsFromStart += 1
            } else {
                let limit = Date().addingTimeInterval(60)
                while process.isRunning && Date() < limit && modificationDate(folder) == before {
                    try await Task.sleep(for: .milliseconds(2))
                }
            }
            let deadline = Date().addingTimeInterval(Double(delay) / 1000)
            while process.isRunning && Date() < deadline { try await Task.sleep(for: .milliseconds(5)) }
            if process.isRunning {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
                seen += try checkFolder(folder, smallFiles, round: "round \(round)")
                try await checkRecords(state, folder: folder, smallFiles, round: "round \(round)")
            } else {
                guard process.terminationStatus == 0 else {
                    throw TortureFailure("round \(round): haul exited with \(process.terminationStatus)")
                }
                // Finished before the kill: everything must be exact, then start over.
                try await checkFinished(folder, state: state, smallFiles, round: "round \(round)")
                completions += 1
                try FileManager.default.removeItem(atPath: folder)
                try FileManager.default.removeItem(atPath: state)
                try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            }
        }

        for file in smallFiles {
            server.script("/" + file.name, [])
            server.setStandingFaults("/" + file.name, [])
        }
        // What the database says before the final run, kept for a failure's report: a file complete
        // under its final name whose download is not recorded completed must be recognised as done.
        let records = try await listRecords(state, round: "before the final run", keeping: work + "/before-final.json")
        let recorded = Dictionary(records.map { ($0.name, $0.state) }, uniquingKeysWith: { first, _ in first })
        let unrecorded = smallFiles.filter { file in
            FileManager.default.fileExists(atPath: folder + "/" + file.name) && recorded[file.name] != "completed"
        }
        let states = Dictionary(grouping: unrecorded) { recorded[$0.name] ?? "no record" }
            .map { "\($0.value.count) \($0.key)" }.sorted().joined(separator: ", ")
        let log = work + "/final.log"
        let final = try launch(arguments.filter { $0 != "-q" } + ["-v"], log: log)
        try await finish(final, within: finalRunLimit, "the final run")
        guard final.terminationStatus == 0 else {
            throw TortureFailure(
                "the final run failed with exit code \(final.terminationStatus); its log is \(log). Before it, "
                    + "\(unrecorded.count) files were complete under their final names without a completed record"
                    + (unrecorded.isEmpty ? "" : " (\(states))") + "; haul ls --json then: \(work)/before-final.json")
        }
        try await checkFinished(folder, state: state, smallFiles, round: "the final run")
        try? FileManager.default.removeItem(atPath: work)

        let total = smallFiles.map(\.resource.size).reduce(0, +)
        let sent = server.bodyBytesSent
        let faults = applied.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        return """
            haul-torture: seed \(seed), \(files) files (\(total) bytes), \(kills) kills \
            (\(minimumKillDelay)–\(maximumKillDelay) ms after haul started for \(killsFromStart), after its first \
            change to the directory for the rest), \(completions) completions before a kill, \
            \(server.requests.count) requests
            faults scripted: \(faults.isEmpty ? "none" : faults); about one file in ten throttled in each round
            before the final run: \(unrecorded.count) files complete under their final names without a completed \
            record\(unrecorded.isEmpty ? "" : " (\(states))")
            after the kills: \(seen.complete) complete files and \(seen.partials) partial files with a manifest \
            checked; \(seen.untrusted) partial files without one (\(seen.untrustedPrefixes) of them a prefix of the file)
            bytes sent: \(sent) = \(String(format: "%.2f", Double(sent) / Double(total * Int64(completions + 1))))× \
            the files' size per completed set
            result: every final name held its exact file or nothing, every partial file only the file's bytes, \
            every download recorded as completed its file; the final run completed them all
            """
    }

    /// A fault for one request of a small file: the connection closes early, the body is short, or
    /// the server is unavailable for a moment.
    func smallFault(_ random: inout SeededRandom, size: Int64) -> (String, Fault) {
        let offset = Int64(random.next(in: 1...Int(max(1, size - 1))))
        switch random.next(in: 0...2) {
        case 0: return ("reset", .closeAfter(bytes: offset))
        case 1: return ("short body", .shortBody(missing: offset))
        default: return ("503", .status(503, retryAfter: "0"))
        }
    }

    /// What a check of the directory found.
    struct FolderCounts {
        /// Files under their final names, all exact.
        var complete = 0
        /// Partial files with a manifest, whose kept bytes were all the file's.
        var partials = 0
        /// Partial files without a manifest (a resume discards them).
        var untrusted = 0
        /// Of those, the ones that held a prefix of the file all the same.
        var untrustedPrefixes = 0

        static func += (total: inout FolderCounts, round: FolderCounts) {
            total.complete += round.complete
            total.partials += round.partials
            total.untrusted += round.untrusted
            total.untrustedPrefixes += round.untrustedPrefixes
        }
    }

    /// Checks the directory after a kill: every final name absent or exact, every partial file
    /// consistent.
    func checkFolder(_ folder: String, _ smallFiles: [SmallFile], round: String) throws -> FolderCounts {
        var counts = FolderCounts()
        for file in smallFiles {
            let destination = folder + "/" + file.name
            if FileManager.default.fileExists(atPath: destination) {
                guard try compare(destination, expected: file.resource, length: file.resource.size) else {
                    throw TortureFailure(
                        "\(round): \(file.name) is under its final name without exactly its \(file.resource.size) bytes"
                            + " (\(fileSize(destination).map(String.init) ?? "unreadable") bytes there)")
                }
                counts.complete += 1
            }
            try checkSmallPartial(destination, file, round: round, counts: &counts)
        }
        return counts
    }

    /// Checks the partial file of the download at `destination`, if there is one: with a manifest,
    /// the bytes a resume would keep must be the file's own. A partial file without a manifest is
    /// not trusted (the next run discards it), so it may hold anything; it is only counted.
    func checkSmallPartial(_ destination: String, _ file: SmallFile, round: String, counts: inout FolderCounts) throws {
        let path = destination + ".haul.part"
        guard let length = fileSize(path) else { return }
        guard let manifest = FileManager.default.contents(atPath: destination + ".haul.json"),
            let object = try? JSONSerialization.jsonObject(with: manifest) as? [String: Any],
            let segments = object["segments"] as? [[String: Any]]
        else {
            counts.untrusted += 1
            if length <= file.resource.size, try compare(path, expected: file.resource, range: 0..<length) {
                counts.untrustedPrefixes += 1
            }
            return
        }
        var ranges: [Range<Int64>] = [0..<length]
        if segments.count > 1 {
            ranges = segments.compactMap { segment in
                guard let start = (segment["start"] as? NSNumber)?.int64Value,
                    let written = (segment["written"] as? NSNumber)?.int64Value, written > 0, start < length
                else { return nil }
                return start..<min(length, start + written)
            }
        }
        for range in ranges {
            guard range.upperBound <= file.resource.size,
                try compare(path, expected: file.resource, range: range)
            else {
                throw TortureFailure(
                    "\(round): the partial file of \(file.name) (\(length) bytes, \(segments.count) segments) holds "
                        + "bytes other than the file's in \(range)")
            }
        }
        counts.partials += 1
    }

    /// Every download `haul ls --json` reports completed must have its file, exact.
    func checkRecords(_ state: String, folder: String, _ smallFiles: [SmallFile], round: String) async throws {
        let byName = Dictionary(uniqueKeysWithValues: smallFiles.map { ($0.name, $0) })
        for record in try await listRecords(state, round: round) where record.state == "completed" {
            guard let file = byName[record.name] else {
                throw TortureFailure("\(round): haul ls reports a completed download of an unknown file \(record.name)")
            }
            guard try compare(folder + "/" + file.name, expected: file.resource, length: file.resource.size) else {
                throw TortureFailure(
                    "\(round): haul ls reports \(file.name) completed, but its file is missing or not exact")
            }
        }
    }

    /// After a run that ended by itself: every file exact, nothing else in the directory, and every
    /// download recorded completed.
    func checkFinished(_ folder: String, state: String, _ smallFiles: [SmallFile], round: String) async throws {
        let found = try checkFolder(folder, smallFiles, round: round)
        guard found.complete == smallFiles.count else {
            throw TortureFailure(
                "\(round): \(smallFiles.count - found.complete) of \(smallFiles.count) files are missing")
        }
        let expected = Set(smallFiles.map(\.name))
        let extra = try FileManager.default.contentsOfDirectory(atPath: folder).filter { !expected.contains($0) }
        guard extra.isEmpty else { throw TortureFailure("\(round): left behind: \(extra.sorted().prefix(10))") }
        let records = try await listRecords(state, round: round)
        let unfinished = records.filter { $0.state != "completed" }
        guard records.count == smallFiles.count, unfinished.isEmpty else {
            throw TortureFailure(
                "\(round): haul ls reports \(records.count) downloads, \(unfinished.count) not completed "
                    + "(\(unfinished.prefix(5).map { "\($0.name): \($0.state)" }.joined(separator: ", ")))")
        }
        try await checkRecords(state, folder: folder, smallFiles, round: round)
    }

    /// A download as `haul ls --json` reports it: its state and its destination's file name.
    struct Record {
        let state: String
        let name: String
    }

    /// The downloads `haul ls --json` reports for the state directory `state`; its output stays in
    /// the file `keeping` when given.
    func listRecords(_ state: String, round: String, keeping: String? = nil) async throws -> [Record] {
        let output = keeping ?? (directory ?? NSTemporaryDirectory()) + "/haul-torture-ls-\(seed).json"
        defer { if keeping == nil { try? FileManager.default.removeItem(atPath: output) } }
        let process = try launch(["ls", "--json", "--state-dir", state], output: output)
        try await finish(process, within: 120, "\(round): haul ls --json")
        guard process.terminationStatus == 0, let data = FileManager.default.contents(atPath: output),
            let array = try? JSONSerialization.jsonObject(with: data) as? [[String: Any]]
        else {
            throw TortureFailure(
                "\(round): haul ls --json failed (exit \(process.terminationStatus)) or printed no list")
        }
        return try array.map { object in
            guard let state = object["state"] as? String else {
                throw TortureFailure("\(round): haul ls --json printed a download without a state")
            }
            let destination = (object["destination"] as? String) ?? (object["name"] as? String) ?? ""
            return Record(state: state, name: URL(fileURLWithPath: destination).lastPathComponent)
        }
    }

    /// When the directory at `path` last changed (a file created, renamed or removed in it).
    func modificationDate(_ path: String) -> Date? {
        (try? FileManager.default.attributesOfItem(atPath: path))?[.modificationDate] as? Date
    }

    /// The size of the file at `path`, or nil when there is none.
    func fileSize(_ path: String) -> Int64? {
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path) else { return nil }
        return (attributes[.size] as? NSNumber)?.int64Value
    }
}
