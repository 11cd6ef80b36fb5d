import NIOHTTP1

@testable import Haul

/// Builds transfer machines in every phase by feeding them real sequences of events, and names
/// their actions so tests can compare them as text. No sockets, no files, no clock.
struct MachineHarness {
    static let url = "http://h/f"
    static let etag = "\"v1\""
    static let total: Int64 = 4 << 20
    static let boot = "boot-1"

    var machine: TransferMachine
    var now = Moment.zero

    init(
        connections: Int = 4, adaptive: Bool = false, retries: Int = 2,
        configure: (inout TransferMachine.Settings) -> Void = { _ in }
    ) {
        var settings = TransferMachine.Settings()
        settings.connections = connections
        settings.adaptive = adaptive
        settings.minimumSplit = 65_536
        settings.stallTimeout = .seconds(30)
        settings.stallTakeover = .seconds(3)
        var retry = DownloaderConfiguration.Retry()
        retry.maximumRetries = retries
        retry.initialDelay = .seconds(1)
        retry.maximumDelay = .seconds(8)
        retry.jitter = false
        retry.maximumRetryAfter = .seconds(600)
        retry.maximumRestarts = 3
        settings.retry = RetryPolicy(retry)
        settings.maximumRestarts = 3
        configure(&settings)
        machine = TransferMachine(settings: settings, sources: [Self.url], bootID: Self.boot, now: .zero, seed: 7)
    }

    // MARK: Feeding events

    @discardableResult
    mutating func handle(_ event: TransferEvent) -> [TransferAction] {
        machine.handle(event, now: now).actions
    }

    mutating func advance(_ duration: Duration) { now = now + duration }

    /// The current request of `connection`.
    func request(_ connection: Int) -> RequestTag {
        RequestTag(connection: connection, serial: machine.connections[connection].serial)
    }

    @discardableResult
    mutating func answer(_ connection: Int, _ head: ResponseHead) -> [TransferAction] {
        handle(.head(request(connection), head))
    }

    @discardableResult
    mutating func wrote(_ connection: Int, segment: Int, upTo: Int64) -> [TransferAction] {
        handle(.wrote(request(connection), segment: segment, upTo: upTo, pieces: [:]))
    }

    @discardableResult
    mutating func ended(_ connection: Int, _ end: ConnectionEnd) -> [TransferAction] {
        handle(.ended(request(connection), end))
    }

    /// Ends every busy connection's request the way a cancelled one ends.
    @discardableResult
    mutating func endBusyConnections() -> [TransferAction] {
        var actions: [TransferAction] = []
        for index in machine.connections.indices where machine.connections[index].isBusy {
            actions += ended(index, .failed(.cancelled))
        }
        return actions
    }

    // MARK: Answers

    static func head(_ status: Int, _ headers: [(String, String)]) -> ResponseHead {
        ResponseHead(status: status, headers: HTTPHeaders(headers), finalURL: url, date: 1_800_000_000)
    }

    /// `206` with bytes `from...to` of `total`, the strong ETag and a length.
    static func partial(_ from: Int64, _ to: Int64, of total: Int64 = total, etag: String = etag) -> ResponseHead {
        head(
            206,
            [
                ("Content-Range", "bytes \(from)-\(to)/\(total)"), ("ETag", etag),
                ("Content-Length", "\(to - from + 1)"),
            ])
    }

    /// `200` with the whole file.
    static func whole(_ total: Int64 = total, etag: String = etag) -> ResponseHead {
        head(200, [("Content-Length", "\(total)"), ("ETag", etag), ("Accept-Ranges", "bytes")])
    }

    static func status(_ status: Int, retryAfter: String? = nil) -> ResponseHead {
        head(status, retryAfter.map { [("Retry-After", $0)] } ?? [])
    }

    // MARK: Phases

    /// A fresh download whose first request is out.
    static func probing(connections: Int = 4, minimumSplit: Int64 = 65_536) -> MachineHarness {
        var harness = MachineHarness(connections: connections) { $0.minimumSplit = minimumSplit }
        harness.handle(.start(.nothing))
        return harness
    }

    /// A fresh download fetched in four ranges: connection 0 writes range 0 from its first answer,
    /// connections 1 to 3 have asked for theirs.
    static func transferring(connections: Int = 4, minimumSplit: Int64 = 65_536) -> MachineHarness {
        var harness = probing(connections: connections, minimumSplit: minimumSplit)
        harness.answer(0, partial(0, total - 1))
        return harness
    }

    /// Every connection of a four-range download receives, and has written 64 KiB of its range.
    static func allReceiving(minimumSplit: Int64 = 65_536) -> MachineHarness {
        var harness = transferring(minimumSplit: minimumSplit)
        harness.wrote(0, segment: 0, upTo: 65_536)
        for connection in 1...3 {
            let start = harness.machine.table!.segments[connection].start
            harness.answer(connection, partial(start, harness.machine.table!.segments[connection].end - 1))
            harness.wrote(connection, segment: connection, upTo: start + 65_536)
        }
        return harness
    }

    /// A one-connection download whose bytes are all written by an answer with a `Content-Digest`:
    /// the file is complete once that answer's body has ended and passed its digest.
    static func stoppingToVerify() -> MachineHarness {
        var harness = probing(connections: 1)
        let head = partial(0, total - 1)
        harness.answer(
            0,
            ResponseHead(
                status: 206,
                headers: head.headers.union([
                    ("Content-Digest", "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:")
                ]),
                finalURL: head.finalURL, date: head.date))
        harness.wrote(0, segment: 0, upTo: total)
        return harness
    }

    /// Every connection receives; the caller has just cancelled the download.
    static func stoppingToPause() -> MachineHarness {
        var harness = allReceiving()
        harness.handle(.cancel)
        return harness
    }

    /// Every connection receives; the disk has just failed.
    static func stoppingToFail() -> MachineHarness {
        var harness = allReceiving()
        harness.handle(.failed(HaulError(.diskFull, "disk full")))
        return harness
    }

    /// A one-connection download whose bytes are all written: it checks the file.
    static func verifying() -> MachineHarness {
        var harness = transferring(connections: 1)
        harness.wrote(0, segment: 0, upTo: total)
        harness.ended(0, .finished(at: total))
        return harness
    }

    static func finishing() -> MachineHarness {
        var harness = verifying()
        harness.handle(.verified(.matches))
        return harness
    }

    static func completed() -> MachineHarness {
        var harness = finishing()
        harness.handle(.finished)
        return harness
    }

    /// A stored download of one range (1 MiB written), being checked.
    static func resuming() -> MachineHarness {
        var harness = MachineHarness()
        harness.handle(.start(.stored(storedManifest(written: 1 << 20), partialSize: 1 << 20)))
        return harness
    }

    /// A directory download whose first answer names the file.
    static func choosingDestination() -> MachineHarness {
        var harness = MachineHarness()
        harness.handle(.start(.unnamed))
        harness.answer(0, partial(0, total - 1))
        return harness
    }

    /// A download stopping its connections to start over: a range was answered with the whole file
    /// while connection 0 writes and connections 2 and 3 wait for their answers.
    static func stoppingToRestart() -> MachineHarness {
        var harness = transferring()
        harness.wrote(0, segment: 0, upTo: 65_536)
        harness.answer(1, whole())
        return harness
    }

    /// The partial data is being discarded.
    static func restarting() -> MachineHarness {
        var harness = MachineHarness()
        harness.handle(.start(.untrusted(.untrustedPartial("no manifest"))))
        return harness
    }

    /// A cancelled download whose last checkpoint is being stored.
    static func pausing() -> MachineHarness {
        var harness = stoppingToPause()
        harness.endBusyConnections()
        return harness
    }

    /// A failed download whose last checkpoint is being stored.
    static func failing() -> MachineHarness {
        var harness = stoppingToFail()
        harness.endBusyConnections()
        return harness
    }

    static func paused() -> MachineHarness {
        var harness = pausing()
        harness.handle(.checkpointed(pieces: [:]))
        return harness
    }

    static func failed() -> MachineHarness {
        var harness = failing()
        harness.handle(.checkpointed(pieces: [:]))
        return harness
    }

    static let mirrors = ["http://m1/f", "http://m2/f"]

    /// A download of `url` with two mirrors and `connections` connections, not started. With
    /// `checksum`, the request gives the file's checksum, which lets the mirrors be mixed.
    static func withMirrors(
        checksum: Bool, connections: Int = 3, configure: (inout TransferMachine.Settings) -> Void = { _ in }
    ) -> MachineHarness {
        var harness = MachineHarness(connections: connections) { settings in
            settings.checksumGiven = checksum
            configure(&settings)
        }
        harness.machine = TransferMachine(
            settings: harness.machine.settings, sources: [url] + mirrors, bootID: boot, now: .zero, seed: 7)
        return harness
    }

    /// A checksum download whose three ranges came from the origin and the two mirrors, complete
    /// and being checked.
    static func mixedAndVerifying() -> MachineHarness {
        var harness = withMirrors(checksum: true)
        harness.handle(.start(.nothing))
        harness.answer(0, partial(0, total - 1))
        harness.wrote(0, segment: 0, upTo: harness.machine.table!.segments[0].end)
        for connection in 1...2 {
            let range = harness.machine.table!.segments[connection]
            harness.answer(connection, partial(range.start, range.end - 1))
            harness.handle(
                .wrote(
                    RequestTag(
                        connection: connection, serial: harness.machine.connections[connection].serial,
                        source: connection), segment: connection, upTo: range.end, pieces: [:]))
        }
        harness.endBusyConnections()
        return harness
    }

    static let mismatch = Verification.checksumMismatch(HaulError(.checksumMismatch, "mismatch"))

    /// The file of ``mixedAndVerifying()`` failed its checksum: connections 0 and 1 fetch a piece
    /// of what each mirror wrote from the origin, to compare it with the disk.
    static func checkingMirrors() -> MachineHarness {
        var harness = mixedAndVerifying()
        harness.handle(.verified(mismatch))
        return harness
    }

    static func storedManifest(written: Int64, segments: [Manifest.Segment]? = nil) -> Manifest {
        var manifest = Manifest(
            originalURL: url, finalURL: url, validator: ResourceValidator(etag: etag, lastModified: nil, date: nil),
            totalLength: total, acceptsRanges: true, contentEncoding: nil, bootID: boot, now: 0)
        manifest.segments[0].written = written
        if let segments { manifest.segments = segments }
        return manifest
    }
}

/// Actions as short text, for exact comparisons: `send 0 bytes=0-`, `abandon 2`, `discard`…
func describe(_ actions: [TransferAction]) -> [String] {
    actions.compactMap { action in
        switch action {
        case .checkStoredData: "check stored data"
        case .chooseDestination(let connection): "choose destination \(connection)"
        case .prepareFile(let preparation):
            "prepare file\(preparation.startsOver ? " fresh" : "")\(preparation.storesLayout ? " layout" : "")"
        case .checkpoint(let checkpoint): checkpoint.durable ? "checkpoint durable" : "checkpoint"
        case .lastCheckpoint(let checkpoint): checkpoint.durable ? "last checkpoint durable" : "last checkpoint"
        case .cut(let offset): "cut \(offset)"
        case .forgetHashes(let offset): "forget hashes \(offset)"
        case .discard: "discard"
        case .verify: "verify"
        case .finish: "finish"
        case .send(let request, let ask):
            "send \(request.connection) \(ask.headers.first(where: { $0.0 == "Range" })?.1 ?? "whole")"
        case .receive(let connection, let plan): "receive \(connection) \(plan.writeStart)..<\(plan.limit)"
        case .drop(let connection): "drop \(connection)"
        case .abandon(let connection): "abandon \(connection)"
        case .setLimit(let connection, let end): "limit \(connection) \(end)"
        case .proceed(let connection, let next):
            next.map { "proceed \(connection) into \($0.segment)" } ?? "stop \(connection)"
        case .started: "started"
        case .report(.restarted): "restarted"
        case .report(.retrying(let attempt, let delay, _)): "retrying \(attempt) in \(delay)"
        case .report(.progress): nil
        case .report: "report"
        case .log: nil
        case .end(.completed): "completed"
        case .end(.paused): "paused"
        case .end(.failed): "failed"
        }
    }
}

extension TransferMachine {
    /// The error the download fails with, once it fails.
    var error: HaulError? {
        switch phase {
        case .stopping(then: .fail(let error)), .failing(let error), .failed(let error): error
        default: nil
        }
    }
}

extension HTTPHeaders {
    /// These headers and `more`.
    func union(_ more: [(String, String)]) -> HTTPHeaders {
        var headers = self
        for (name, value) in more { headers.add(name: name, value: value) }
        return headers
    }
}
