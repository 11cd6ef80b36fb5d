import Haul
import HaulTestServer
import Testing

@testable import HaulDaemon

/// The client the CLI uses when a daemon runs, against a real daemon.
@Suite(.timeLimit(.minutes(1)))
struct DaemonClientTests {
    @Test func theClientFindsTheDaemonAndDrivesItsQueue() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "c", size: 120_000)
            server.add("/c", resource)
            try await withTemporaryDirectory { state in
                #expect(try DaemonClient.running(on: state) == nil)
                try await withDaemon(stateDirectory: state, live: true) { daemon in
                    let client = try #require(try DaemonClient.running(on: state))
                    defer { Task { try? await client.shutdown() } }
                    #expect(client.url == daemon.url)
                    let checksum = try Checksum(parsing: "sha-256=" + hex(resource.sha256(0..<resource.size)))
                    let added = try await client.add(
                        [
                            DownloadRequest(
                                url: server.url("/c"), destination: .file(daemon.root + "/c.bin"), checksum: checksum)
                        ], priority: .high)
                    #expect(added.count == 1 && added[0].priority == .high)
                    let id = added[0].id
                    try await waitUntilAsync("it completes") { try await client.download(id).state == .completed }
                    #expect(try readFile(daemon.root + "/c.bin") == resource.content)
                    let completed = try await client.downloads(in: [.completed])
                    #expect(completed.map(\.id) == [id] && completed[0].bytes == 120_000)
                    #expect(try await client.downloads(in: [.failed]).isEmpty)
                    // The daemon's refusals arrive with their codes.
                    await #expect {
                        try await client.pause(id)
                    } throws: { error in
                        (error as? HaulError)?.code == .invalidState
                    }
                    await #expect {
                        try await client.download(DownloadID(999))
                    } throws: { error in
                        (error as? HaulError)?.code == .unknownDownload
                    }
                    try await client.remove(id, deletingFiles: true)
                    #expect(try await client.downloads().isEmpty)
                    #expect(!POSIX.exists(daemon.root + "/c.bin"))
                }
            }
        }
    }

    @Test func pauseResumeAndRetryThroughTheClient() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "p", size: 1_000_000)
            server.add("/p", resource)
            server.setStandingFaults("/p", [.throttle(bytesPerSecond: 500_000)])
            try await withTemporaryDirectory { state in
                try await withDaemon({ $0.downloader.segmentation.connections = 1 }, stateDirectory: state, live: true)
                { daemon in
                    let client = try #require(try DaemonClient.running(on: state))
                    defer { Task { try? await client.shutdown() } }
                    let id = try await client.add([
                        DownloadRequest(url: server.url("/p"), destination: .directory(daemon.root))
                    ])[0].id
                    try await waitUntilAsync("bytes arrive") { try await client.download(id).bytes > 0 }
                    #expect(try await client.pause(id).state == .paused)
                    server.setStandingFaults("/p", [])
                    #expect(try await client.resume(id).state != .paused)
                    try await waitUntilAsync("it completes") { try await client.download(id).state == .completed }
                    #expect(try readFile(daemon.root + "/p") == resource.content)
                    let failed = try await client.add([
                        DownloadRequest(url: server.url("/absent"), destination: .file(daemon.root + "/absent"))
                    ])[0].id
                    try await waitUntilAsync("it fails") { try await client.download(failed).state == .failed }
                    #expect(try await client.download(failed).error?.code == .httpStatus)
                    server.add("/absent", TestResource(name: "absent", size: 10))
                    #expect(try await [.queued, .running, .completed].contains(client.retry(failed).state))
                }
            }
        }
    }

    @Test func theEventStreamCarriesATransferAsAManagerReportsIt() async throws {
        try await HaulTestServer.withRunning { server in
            let resource = TestResource(name: "e", size: 600_000)
            server.add("/e", resource)
            server.setStandingFaults("/e", [.throttle(bytesPerSecond: 2_000_000)])
            try await withTemporaryDirectory { state in
                try await withDaemon({ $0.downloader.segmentation.connections = 1 }, stateDirectory: state, live: true)
                { daemon in
                    let client = try #require(try DaemonClient.running(on: state))
                    defer { Task { try? await client.shutdown() } }
                    let stream = try await client.events()
                    let id = try await client.add([
                        DownloadRequest(url: server.url("/e"), destination: .file(daemon.root + "/e"))
                    ])[0].id
                    var kinds: [String] = []
                    var result: DownloadResult?
                    var start: DownloadStart?
                    var progress: [DownloadProgress] = []
                    for try await event in stream {
                        guard case .download(let event) = event, event.download.id == id else { continue }
                        switch event.kind {
                        case .added: kinds.append("added")
                        case .stateChanged: kinds.append("state:\(event.download.state)")
                        case .transfer(.started(let started)):
                            kinds.append("started")
                            start = started
                        case .transfer(.progress(let report)): progress.append(report)
                        case .transfer(.completed(let done)):
                            kinds.append("completed")
                            result = done
                        default: kinds.append("other")
                        }
                        if event.download.state == .completed, case .stateChanged = event.kind { break }
                    }
                    #expect(kinds == ["added", "state:running", "started", "completed", "state:completed"])
                    #expect(start?.totalBytes == 600_000 && start?.resumedFrom == 0 && start?.resumable == true)
                    #expect(start?.validator.entityTag?.description == resource.entityTagValue)
                    #expect(result?.bytes == 600_000 && result?.bytesFetched == 600_000)
                    #expect(result?.destination == daemon.root + "/e")
                    #expect(!progress.isEmpty && progress.allSatisfy { $0.totalBytes == 600_000 })
                    #expect(progress.map(\.bytes) == progress.map(\.bytes).sorted())
                    // The ID to reconnect from: this run of the daemon and the event's number.
                    let last = try #require(stream.lastEventID?.split(separator: "-"))
                    #expect(last.count == 2 && Int(last[1]).map { $0 >= 5 } == true, "\(last)")
                }
            }
        }
    }

    @Test func credentialsAreNeverSentToADaemonOnAnotherMachine() async throws {
        // Nothing listens there: the refusal comes before any connection.
        let client = DaemonClient(url: "http://192.0.2.77:6842", token: "token")
        #expect(!client.isLocal)
        var request = DownloadRequest(url: "http://example.com/f", destination: .file("/tmp/f"))
        request.credentials = BasicCredentials(user: "u", password: "p")
        for attempt in 0..<3 {
            await #expect {
                switch attempt {
                case 0: _ = try await client.add([request])
                case 1:
                    _ = try await client.resume(DownloadID(1), credentials: BasicCredentials(user: "u", password: "p"))
                default: _ = try await client.resume(DownloadID(1), headers: [("Cookie", "session=1")])
                }
            } throws: { error in
                (error as? HaulError)?.code == .credentialsForRemoteDaemon
            }
        }
        try await client.shutdown()
        for url in ["http://127.0.0.1:6842", "http://[::1]:6842", "http://localhost:6842"] {
            let local = DaemonClient(url: url, token: "t")
            #expect(local.isLocal, "\(url)")
            try await local.shutdown()
        }
    }

    @Test(arguments: [1, 2, 3, 7, 1000])
    func theEventParserReadsMessagesCutAnywhere(chunk: Int) {
        let body =
            #"{"download":{"id":4,"url":"http://h/r\#u{E9}sum\#u{E9}.pdf","name":"r\#u{E9}sum\#u{E9}.pdf","#
            + #""state":"running","priority":0,"bytes":5,"totalBytes":10,"bytesPerSecond":2.5,"openConnections":2,"#
            + #""createdAt":"2026-11-24T06:00:00Z"}}"#
        // CR LF, CR and LF line ends; a comment; a reset; an event of a name this client does not know;
        // one whose data cannot be read; an opening with only an ID.
        let text =
            "retry: 2000\r\n\r\nid: r-0\r\n\r\n: keep-alive\n\nid: r-1\r\nevent: progress\r\ndata: \(body)\r\n\r\n"
            + "event: reset\rdata: {}\r\rid: r-2\nevent: unknown\ndata: {}\n\nid: r-3\nevent: state\ndata: {\n\n"
        var parser = EventParser()
        var messages: [EventParser.Message] = []
        var rest = Array(text.utf8)[...]
        while !rest.isEmpty {
            messages += parser.feed(rest.prefix(chunk))
            rest = rest.dropFirst(chunk)
        }
        #expect(messages.map(\.id) == ["r-0", "r-1", nil, "r-2", "r-3"])
        #expect(messages.map(\.events.count) == [0, 1, 1, 0, 1])
        guard case .download(let event) = messages[1].events.first,
            case .transfer(.progress(let progress)) = event.kind
        else {
            Issue.record("the second message is not a progress event")
            return
        }
        #expect(progress.bytes == 5 && progress.totalBytes == 10 && progress.connections == 2)
        #expect(event.download.id == DownloadID(4) && event.download.state == .running)
        #expect(event.download.name == "r\u{E9}sum\u{E9}.pdf", "UTF-8 cut between chunks is decoded whole")
        for index in [2, 4] {
            guard case .reset = messages[index].events.first else {
                Issue.record("message \(index) is not a reset")
                return
            }
        }
    }
}
