import Foundation
import Haul
import HaulPostgreSQL
import HaulTestServer
import Testing

/// `haul ls --state` and `--limit`: the rows asked for, read page by page; bad values are one line.
@Suite(.timeLimit(.minutes(2)))
struct ListCommandTests {
    /// A state directory with three completed and three failed downloads, added alternately.
    static func recordedQueue(_ server: HaulTestServer, _ directory: String) async throws -> [DownloadID] {
        for position in [0, 2, 4] { server.add("/ok\(position)", TestResource(name: "ok\(position)", size: 1_000)) }
        var configuration = DownloadManager.Configuration()
        configuration.maxConcurrentDownloads = 1
        configuration.freeSpaceMargin = 0
        let manager = try DownloadManager(stateDirectory: directory + "/state", configuration: configuration)
        let ids = try await manager.enqueue(
            (0..<6).map { position in
                DownloadRequest(
                    url: server.url(position % 2 == 0 ? "/ok\(position)" : "/missing\(position)"),
                    destination: .file(directory + "/f\(position)"))
            })
        await manager.runUntilIdle()
        await manager.close()
        return ids
    }

    /// The IDs and states of `haul ls`'s rows, under its header.
    static func rows(_ output: String) -> [(id: Int64, state: String)] {
        output.split(separator: "\n").dropFirst().map { line in
            let cells = line.split(separator: " ")
            return (Int64(cells[0]) ?? 0, String(cells[1]))
        }
    }

    @Test func stateAndLimitListExactlyTheRowsAskedFor() async throws {
        try await HaulTestServer.withRunning { server in
            let directory = try makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let ids = try await Self.recordedQueue(server, directory).map(\.rawValue)
            let state = directory + "/state"

            let all = try await HaulProcess.run(["ls", "--state-dir", state])
            #expect(all.status == 0, "\(all.errors)")
            #expect(all.output.hasPrefix("ID  STATE "))
            #expect(Self.rows(all.output).map(\.id) == ids)

            let failed = try await HaulProcess.run(["ls", "--state", "failed", "--limit", "2", "--state-dir", state])
            #expect(failed.status == 0, "\(failed.errors)")
            #expect(Self.rows(failed.output).map(\.id) == [ids[1], ids[3]])
            #expect(Self.rows(failed.output).allSatisfy { $0.state == "failed" })

            let both = try await HaulProcess.run(["ls", "--state", "failed,completed", "--state-dir", state])
            #expect(Self.rows(both.output).map(\.id) == ids)
            let repeated = try await HaulProcess.run(
                ["ls", "--state", "completed", "--state", "failed", "--limit", "3", "--state-dir", state])
            #expect(Self.rows(repeated.output).map(\.id) == Array(ids.prefix(3)))
            let none = try await HaulProcess.run(["ls", "--state", "paused", "--state-dir", state])
            #expect(none.status == 0 && none.output.hasPrefix("no downloads recorded"))

            let json = try await HaulProcess.run(["ls", "--json", "--state", "completed", "--state-dir", state])
            let parsed = try #require(
                try JSONSerialization.jsonObject(with: Data(json.output.utf8)) as? [[String: Any]])
            #expect(parsed.compactMap { $0["id"] as? Int64 } == [ids[0], ids[2], ids[4]])
            let empty = try await HaulProcess.run(["ls", "--json", "--state", "paused", "--state-dir", state])
            #expect(empty.output == "[]\n")
        }
    }

    @Test(arguments: [
        (["--state", "done"], "unknown state 'done'"), (["--state", "failed,"], "unknown state ''"),
        (["--limit", "0"], "--limit"), (["--limit", "ten"], "--limit"),
    ])
    func aBadValueIsOneLineAndExitCode64(_ arguments: [String], _ message: String) async throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let result = try await HaulProcess.run(["ls"] + arguments + ["--state-dir", directory + "/state"])
        #expect(result.status == 64)
        #expect(result.output.isEmpty)
        #expect(result.errors.hasPrefix("haul: error: ") && result.errors.contains(message), "\(result.errors)")
        #expect(result.errors.split(separator: "\n").count == 1, "\(result.errors)")
    }

    @Test("a listing longer than a page is printed as it is read, every row in line with the header")
    func aLongListingStreamsInLine() async throws {
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let manager = try DownloadManager(stateDirectory: directory + "/state")
        // Nothing listens on port 9: they stay queued, as no queue runs here.
        let count = 1_203
        _ = try await manager.enqueue(
            (0..<count).map { DownloadRequest(url: "http://127.0.0.1:9/f\($0)", destination: .directory(directory)) })
        await manager.close()
        let listed = try await HaulProcess.run(["ls", "--state-dir", directory + "/state"])
        #expect(listed.status == 0, "\(listed.errors)")
        let lines = listed.output.split(separator: "\n")
        #expect(lines.count == count + 1)
        // Every row's name starts where the header's NAME does, past the last page too.
        let header = try #require(lines.first)
        let nameColumn = try #require(header.range(of: "NAME")).lowerBound.utf16Offset(in: header)
        let misplaced = lines.dropFirst().filter { line in
            let text = String(line)
            return !text.dropFirst(nameColumn).hasPrefix("f") || text.prefix(nameColumn).last != " "
        }
        #expect(misplaced.isEmpty, "\(misplaced.prefix(3))")
        #expect(Self.rows(listed.output).map(\.id) == (1...Int64(count)).map { $0 })
    }

    /// `haul ls --queue URL` lists a fleet's queue in PostgreSQL, with the worker of each running
    /// download; the queue's password appears nowhere, and an unreachable queue is one line.
    @Test func aFleetQueueListsWithTheWorkerOfEachRunningDownload() async throws {
        try await PostgreSQLTestServer.withDatabase { database in
            let location = try PostgreSQLLocation(parsing: database.url)
            let store = try PostgreSQLQueueStore(location: location)
            let worker = try FleetLease(store: store)
            let records = ["queued", "running", "other"].map { name in
                StoredDownload(
                    key: name,
                    definition: DownloadRequest(url: "http://127.0.0.1:9/\(name)", destination: .file("/tmp/\(name)")),
                    destination: "/tmp/\(name)", priority: 0, owner: nil, now: 1)
            }
            let ids = try store.commit(QueueChanges(inserts: records))
            // The worker claims the first two and runs the second.
            var running = try #require(try store.claimQueued(for: worker.name, limit: 2, now: 2).last)
            try running.move(to: .running, at: 2)
            try store.update([running])
            let at = try #require(database.url.range(of: "@", options: .backwards))
            let url = "postgresql://no_such_user:secret-password" + database.url[at.lowerBound...]

            let listed = try await HaulProcess.run(["ls", "--queue", database.url])
            #expect(listed.status == 0, "\(listed.errors)")
            let lines = listed.output.split(separator: "\n").map(String.init)
            #expect(lines.first?.hasPrefix("ID  STATE    PROGRESS  SIZE  SPEED  WORKER") == true, "\(lines)")
            #expect(Self.rows(listed.output).map(\.id) == ids.map(\.rawValue))
            #expect(lines.count == 4 && lines[2].contains(" running ") && lines[2].contains(" \(worker.name) "))
            #expect(!lines[1].contains(worker.name) && !lines[3].contains(worker.name))

            let json = try await HaulProcess.run(["ls", "--json", "--state", "running", "--queue", database.url])
            let rows = try JSONSerialization.jsonObject(with: Data(json.output.utf8)) as? [[String: Any]]
            #expect(rows?.count == 1 && rows?.first?["worker"] as? String == worker.name, "\(json.output)")

            // A wrong password is refused in one line that does not show it.
            let refused = try await HaulProcess.run(["ls", "--queue", url])
            #expect(refused.status != 0)
            #expect(refused.errors.hasPrefix("haul: error: ") && refused.errors.split(separator: "\n").count == 1)
            #expect(!refused.errors.contains("secret-password") && !refused.output.contains("secret-password"))
            worker.release()
        }
    }

    /// `haul ls --queue` only reads: a database with no queue is named so in one line, and is left
    /// as it was (no table made).
    @Test func listingAFleetQueueChangesNothing() async throws {
        try await PostgreSQLTestServer.withDatabase { database in
            let listed = try await HaulProcess.run(["ls", "--queue", database.url])
            #expect(listed.status != 0 && listed.output.isEmpty)
            #expect(listed.errors.contains("holds no haul queue"), "\(listed.errors)")
            #expect(listed.errors.split(separator: "\n").count == 1, "\(listed.errors)")
            let again = try await HaulProcess.run(["ls", "--queue", database.url])
            #expect(again.errors.contains("holds no haul queue"), "a table was made: \(again.errors)")
        }
    }
}
