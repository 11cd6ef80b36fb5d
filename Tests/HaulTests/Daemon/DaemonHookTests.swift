import Foundation
import Haul
import HaulTestServer
import NIOHTTP1
import Testing

@testable import HaulDaemon

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Writes an executable shell script.
private func script(_ path: String, _ body: String) throws {
    let text = "#!/bin/sh\n" + body + "\n"
    let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o755)
    guard descriptor >= 0 else { throw TestFailure("cannot write \(path)") }
    _ = text.utf8CString.withUnsafeBufferPointer { write(descriptor, $0.baseAddress, $0.count - 1) }
    close(descriptor)
}

/// The part of a list answer that says where the event stream stood.
private struct DownloadListLastEvent: Decodable {
    let lastEventId: String
}

private func text(_ path: String) -> String? {
    (try? readFile(path)).map { String(decoding: $0, as: UTF8.self) }
}

/// `--on-complete` and `--on-error`.
@Suite(.timeLimit(.minutes(1)))
struct DaemonHookTests {
    @Test func theCompletionHookGetsIDPathAndURLAsArgumentsAndNothingElseFromTheEnvironment() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "f", size: 50_000))
            try await withTemporaryDirectory { directory in
                let record = directory + "/hook.out"
                try script(
                    directory + "/hook.sh",
                    #"for argument in "$@"; do printf '%s\n' "$argument"; done > "\#(record).tmp"; env >> "\#(record).tmp"; mv "\#(record).tmp" "\#(record)""#
                )
                // Not set here with setenv: that races with every test that reads the environment or
                // starts a process. This process has variables beyond the kept ones; none may pass.
                let kept = ["PATH", "HOME", "LANG", "TZ", "PWD", "SHLVL", "_"]
                #expect(ProcessInfo.processInfo.environment.keys.contains { !kept.contains($0) })
                try await withDaemon({ $0.hooks.onComplete = directory + "/hook.sh" }) { daemon in
                    // Characters a shell would act on reach the program as they are.
                    let url = server.url("/f") + "?name=$(id);x=`id`&y=$HOME"
                    let id = try await daemon.add(#"{"url": "\#(url)", "destination": "f.bin"}"#)[0]
                    _ = try await daemon.waitFor(id, "completed")
                    try await waitUntil("the hook ran") { text(record) != nil }
                    let lines = try #require(text(record)).split(separator: "\n").map(String.init)
                    #expect(Array(lines.prefix(3)) == ["\(id)", daemon.root + "/f.bin", url])
                    let environment = lines.dropFirst(3)
                    #expect(
                        environment.allSatisfy { kept.contains(String($0.prefix { $0 != "=" })) }, "\(environment)")
                    // What it did is recorded with the download.
                    try await waitUntilAsync("the result is recorded") {
                        try await daemon.download(id).hook == "on-complete exited 0"
                    }
                }
            }
        }
    }

    @Test func aPasswordInTheURLIsSentAsCredentialsAndShownNowhere() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "guarded", size: 30_000)
            var guarded = resource
            guarded.requiredAuthorization = BasicCredentials(user: "u", password: "pw-5772").authorization
            server.add("/guarded", guarded)
            try await withTemporaryDirectory { directory in
                let record = directory + "/hook.out"
                try script(
                    directory + "/hook.sh", #"printf '%s\n' "$@" > "\#(record).tmp"; mv "\#(record).tmp" "\#(record)""#)
                try await withDaemon({ $0.hooks.onComplete = directory + "/hook.sh" }, live: true) { daemon in
                    // Events from here on are replayed to a stream opened later.
                    let mark = try await daemon.send(.GET, "/api/v1/downloads").json(DownloadListLastEvent.self)
                    let url = server.url("/guarded").replacingOccurrences(of: "http://", with: "http://u:pw-5772@")
                    let id = try await daemon.add(#"{"url": "\#(url)", "destination": "g.bin"}"#)[0]
                    let done = try await daemon.waitFor(id, "completed")
                    #expect(done.url == server.url("/guarded"))
                    #expect(try readFile(daemon.root + "/g.bin") == resource.content)
                    try await waitUntil("the hook ran") { text(record) != nil }
                    #expect(text(record) == "\(id)\n\(daemon.root)/g.bin\n\(server.url("/guarded"))\n")
                    let events = try await EventReader(daemon, lastEventID: mark.lastEventId)
                    var seen: [ReceivedEvent] = []
                    while let event = try await events.next(), seen.count < 50 {
                        seen.append(event)
                        if event.name == "completed" { break }
                    }
                    #expect(seen.contains { $0.name == "completed" })
                    for event in seen { #expect(!event.data.contains("pw-5772"), "\(event.name)") }
                    for name in listDirectory(daemon.stateDirectory) where !name.hasPrefix("owners") {
                        let bytes = (try? readFile(daemon.stateDirectory + "/" + name)) ?? []
                        #expect(!String(decoding: bytes, as: UTF8.self).contains("pw-5772"), "\(name)")
                    }
                    #expect(!daemon.logs.wholeLines.contains { $0.contains("pw-5772") })
                }
            }
        }
    }

    #if os(Linux)
        @Test func aHookInheritsNoneOfTheDaemonsSocketsOrFiles() async throws {
            try await HaulTestServer.withRunning { server in
                server.add("/f", TestResource(name: "f", size: 10_000))
                try await withTemporaryDirectory { directory in
                    let record = directory + "/descriptors"
                    // What the shell running the hook holds (it keeps its script open, on 10 or so).
                    try script(
                        directory + "/hook.sh",
                        #"ls -l /proc/$$/fd > "\#(record).tmp"; mv "\#(record).tmp" "\#(record)""#)
                    try await withDaemon({ $0.hooks.onComplete = directory + "/hook.sh" }) { daemon in
                        let id = try await daemon.add(#"{"url": "\#(server.url("/f"))"}"#)[0]
                        _ = try await daemon.waitFor(id, "completed")
                        try await waitUntil("the hook ran") { text(record) != nil }
                        let listing = try #require(text(record))
                        #expect(!listing.contains("socket:"), "\(listing)")
                        #expect(!listing.contains(".sqlite") && !listing.contains("daemon."), "\(listing)")
                    }
                }
            }
        }
    #endif

    @Test func theErrorHookRunsForAFailedDownloadAndItsStatusIsShown() async throws {
        try await HaulTestServer.withRunning { server in
            try await withTemporaryDirectory { directory in
                try script(directory + "/fail.sh", "exit 3")
                try await withDaemon({
                    $0.hooks.onError = directory + "/fail.sh"
                    $0.hooks.onComplete = directory + "/fail.sh"
                }) { daemon in
                    let id = try await daemon.add(#"{"url": "\#(server.url("/missing"))"}"#)[0]
                    _ = try await daemon.waitFor(id, "failed")
                    try await waitUntilAsync("the result is recorded") {
                        try await daemon.download(id).hook == "on-error exited 3"
                    }
                    // Retrying clears it.
                    server.add("/missing", TestResource(name: "missing", size: 1000))
                    let retried = try await daemon.send(.POST, "/api/v1/downloads/\(id)/retry")
                    #expect(try retried.json(DownloadAnswer.self).hook == nil)
                    _ = try await daemon.waitFor(id, "completed")
                    try await waitUntilAsync("the completion hook's result replaces it") {
                        try await daemon.download(id).hook == "on-complete exited 3"
                    }
                }
            }
        }
    }

    @Test func aHookStillRunningAtItsTimeLimitIsKilled() async throws {
        try await HaulTestServer.withRunning { server in
            server.add("/f", TestResource(name: "f", size: 10_000))
            try await withTemporaryDirectory { directory in
                try script(directory + "/slow.sh", "touch \(directory)/started; exec sleep 30")
                let clock = ManualClock()
                try await withDaemon(
                    {
                        $0.hooks.onComplete = directory + "/slow.sh"
                        $0.hooks.timeLimit = .seconds(60)
                    }, clock: clock
                ) { daemon in
                    let id = try await daemon.add(#"{"url": "\#(server.url("/f"))"}"#)[0]
                    _ = try await daemon.waitFor(id, "completed")
                    try await waitUntil("the hook started") { POSIX.exists(directory + "/started") }
                    // 59 s on the daemon's clock: still running.
                    clock.advance(by: .seconds(59))
                    try await Task.sleep(for: .milliseconds(100))
                    #expect(try await daemon.download(id).hook == nil)
                    clock.advance(by: .seconds(1))
                    try await waitUntilAsync("the hook is killed") {
                        try await daemon.download(id).hook == "on-complete killed after its 60 s limit"
                    }
                }
            }
        }
    }

    @Test func aHookThatIsNotAnExecutableFileIsRefusedAtStart() async throws {
        try await withTemporaryDirectory { directory in
            for program in [directory + "/absent", directory, "ls"] {
                var options = Daemon.Options(stateDirectory: directory + "/state", downloadRoots: [directory])
                options.hooks.onError = program
                #expect(throws: HaulError.self, "\(program)") { try Daemon(options: options) }
            }
        }
    }
}
