import NIOHTTP1
import Testing

@testable import Haul

/// The transfer machine, every phase against every event, without sockets, files or sleeps.
struct TransferMachineTableTests {
    typealias Phase = TransferMachine.Phase.Kind

    /// The phases, each reached by a real sequence of events.
    static let phases: [(Phase, @Sendable () -> MachineHarness)] = [
        (.created, { MachineHarness() }),
        (.resuming, MachineHarness.resuming),
        (.probing, { MachineHarness.probing() }),
        (.choosingDestination, MachineHarness.choosingDestination),
        (.transferring, { MachineHarness.allReceiving() }),
        (.stoppingToRestart, MachineHarness.stoppingToRestart),
        (.stoppingToVerify, MachineHarness.stoppingToVerify),
        (.stoppingToPause, MachineHarness.stoppingToPause),
        (.stoppingToFail, MachineHarness.stoppingToFail),
        (.restarting, MachineHarness.restarting),
        (.verifying, MachineHarness.verifying),
        (.checkingMirrors, MachineHarness.checkingMirrors),
        (.finishing, MachineHarness.finishing),
        (.pausing, MachineHarness.pausing),
        (.failing, MachineHarness.failing),
        (.paused, MachineHarness.paused),
        (.failed, MachineHarness.failed),
        (.completed, MachineHarness.completed),
    ]

    /// One event of each kind, made for the machine as it stands (for connection 0's current request).
    static let events: [(String, @Sendable (MachineHarness) -> TransferEvent)] = [
        ("start", { _ in .start(.nothing) }),
        (
            "storedDataChecked",
            { _ in
                .storedDataChecked(
                    StoredData(
                        segments: [Manifest.Segment(start: 0, end: MachineHarness.total, written: 1 << 20)], pieces: [])
                )
            }
        ),
        ("destinationChosen", { _ in .destinationChosen(.nothing) }),
        ("head", { .head($0.request(0), MachineHarness.partial(0, MachineHarness.total - 1)) }),
        ("lateHead", { .head(RequestTag(connection: 0, serial: $0.machine.lastSerial + 1), MachineHarness.whole()) }),
        ("wrote", { .wrote($0.request(0), segment: 0, upTo: 131_072, pieces: [:]) }),
        ("reachedLimit", { .reachedLimit($0.request(0), at: $0.machine.table?.segments[0].end ?? 0) }),
        ("ended", { .ended($0.request(0), .finished(at: 131_072)) }),
        ("failure", { .ended($0.request(0), .failed(.retryable(HaulError(.network, "reset"), retryAfter: nil))) }),
        ("timer", { _ in .timer }),
        ("cancel", { _ in .cancel }),
        ("checkpointed", { _ in .checkpointed(pieces: [:]) }),
        ("discarded", { _ in .discarded }),
        ("verified", { _ in .verified(.matches) }),
        ("finished", { _ in .finished }),
        ("failed", { _ in .failed(HaulError(.fileSystem, "cannot write")) }),
    ]

    /// The phase each event leads to, where it is not the phase the machine was in.
    static let changes: [Phase: [String: Phase]] = [
        .created: ["start": .probing, "cancel": .paused, "failed": .failed],
        .resuming: ["storedDataChecked": .probing, "cancel": .paused, "failed": .failed],
        .probing: ["head": .transferring, "cancel": .stoppingToPause, "failed": .stoppingToFail],
        .choosingDestination: ["destinationChosen": .transferring, "cancel": .paused, "failed": .stoppingToFail],
        .transferring: ["cancel": .stoppingToPause, "failed": .stoppingToFail],
        .stoppingToRestart: ["cancel": .stoppingToPause, "failed": .stoppingToFail],
        // The answer whose body must pass its Content-Digest ends: the file is checked; it fails
        // before its digest could be checked: its bytes are fetched again.
        .stoppingToVerify: [
            "ended": .verifying, "failure": .transferring, "cancel": .stoppingToPause, "failed": .stoppingToFail,
        ],
        // Other connections are still busy: one ending changes nothing yet. A pause outranks a failure.
        .stoppingToPause: [:],
        .stoppingToFail: ["cancel": .stoppingToPause],
        .restarting: ["discarded": .probing, "failed": .failed],
        .verifying: ["verified": .finishing, "failed": .failing],
        // One check's answer or end changes nothing while the other runs; a pause forgets what the
        // mirrors wrote without waiting for the checks, which it stops.
        .checkingMirrors: ["cancel": .stoppingToPause, "failed": .stoppingToFail],
        .finishing: ["finished": .completed, "failed": .failing],
        .pausing: ["checkpointed": .paused, "failed": .failed],
        .failing: ["checkpointed": .failed, "failed": .failed],
        .paused: [:],
        .failed: [:],
        .completed: [:],
    ]

    /// Every phase there is has its row: a new phase cannot slip past the table.
    @Test func everyPhaseHasARow() {
        for phase in Phase.allCases {
            #expect(Self.phases.contains { $0.0 == phase }, "no way to reach \(phase)")
            #expect(Self.changes[phase] != nil, "no changes listed for \(phase)")
        }
    }

    static var cases: [(Phase, String)] {
        phases.flatMap { phase in events.map { (phase.0, $0.0) } }
    }

    @Test(arguments: cases)
    func everyPhaseTakesEveryEvent(phase: Phase, event: String) throws {
        let build = try #require(Self.phases.first { $0.0 == phase }?.1)
        let make = try #require(Self.events.first { $0.0 == event }?.1)
        var harness = build()
        #expect(harness.machine.phase.kind == phase, "the harness did not reach \(phase)")
        let wasOver = harness.machine.phase.isTerminal
        let actions = harness.handle(make(harness))
        let expected = Self.changes[phase]?[event] ?? phase
        #expect(harness.machine.phase.kind == expected, "\(phase) + \(event): \(describe(actions))")
        // The event that ends the download, and no other, tells how it ended, as its last action.
        let ends = actions.filter { if case .end = $0 { true } else { false } }
        if harness.machine.phase.isTerminal && !wasOver {
            #expect(ends.count == 1, "\(phase) + \(event): \(describe(actions))")
            if case .end = actions.last {} else { Issue.record("\(phase) + \(event): the end is not last") }
        } else {
            #expect(ends.isEmpty, "\(phase) + \(event): \(describe(actions))")
        }
        // No action ever targets a connection the machine does not have.
        for action in actions {
            if case .send(let request, _) = action {
                #expect(harness.machine.connections.indices.contains(request.connection))
            }
        }
        // Whatever the machine waits for next lies in the future: a timer never spins.
        if let deadline = harness.machine.nextDeadline {
            harness.now = max(harness.now, deadline)
            harness.handle(.timer)
            if let next = harness.machine.nextDeadline { #expect(next > harness.now, "\(phase) + \(event) + timer") }
        }
    }

    @Test(arguments: phases.map(\.0))
    func cancellationInEveryPhaseEndsPausedWithTheDataKept(phase: Phase) throws {
        let build = try #require(Self.phases.first { $0.0 == phase }?.1)
        var harness = build()
        let written = harness.machine.table?.written ?? 0
        var actions = harness.handle(.cancel)
        actions += harness.endBusyConnections()
        if harness.machine.phase.kind == .pausing || harness.machine.phase.kind == .failing {
            actions += harness.handle(.checkpointed(pieces: [:]))
        }
        if case .restarting = harness.machine.phase { actions += harness.handle(.discarded) }
        if harness.machine.phase.kind == .verifying { actions += harness.handle(.verified(.matches)) }
        if harness.machine.phase.kind == .pausing { actions += harness.handle(.checkpointed(pieces: [:])) }
        if harness.machine.phase.kind == .finishing { actions += harness.handle(.finished) }
        // Nothing written is thrown away, and bytes written while the download ran are stored durably.
        let described = describe(actions)
        #expect(!described.contains("discard") && !described.contains { $0.hasPrefix("cut") }, "\(described)")
        let running: Set<Phase> = [
            .probing, .transferring, .stoppingToRestart, .stoppingToVerify, .stoppingToPause, .stoppingToFail,
        ]
        if written > 0, running.contains(phase) {
            #expect(described.contains("last checkpoint durable"), "\(phase): \(described)")
        }
        switch phase {
        case .finishing, .completed:
            // A rename under way is not undone.
            #expect(harness.machine.phase.kind == .completed)
            #expect(described.last == (phase == .completed ? nil : "completed"), "\(described)")
        case .failing, .failed:
            #expect(harness.machine.phase.kind == .failed)
            #expect(described.last == (phase == .failed ? nil : "failed"), "\(described)")
        default:
            #expect(described.last == (phase == .paused ? nil : "paused"), "\(described)")
            #expect(harness.machine.phase.kind == .paused, "\(phase) ended \(harness.machine.phase)")
            let busy = harness.machine.connections.filter(\.isBusy)
            #expect(busy.isEmpty)
        }
    }
}

/// The rules the issue names, as scenarios.
struct TransferMachineScenarioTests {
    typealias Harness = MachineHarness

    @Test func rangeRequestsRefusedWithALongRetryAfterRetireAtOnceAndTheFirstAnswerGoesOn() throws {
        var harness = Harness.transferring()
        let ranges = harness.machine.table!.segments
        // Every range request is told to come back in a day: each connection retires at once, no wait.
        for connection in 1...3 {
            let actions = harness.answer(connection, Harness.status(503, retryAfter: "86400"))
            #expect(describe(actions) == ["drop \(connection)"])
            #expect(harness.machine.connections[connection].state == .retired)
        }
        #expect(harness.machine.nextDeadline == harness.now + .seconds(30), "only the stall timeout of connection 0")
        // The first answer asked for the whole file: at the end of its range it goes on into the next,
        // and the next, without a new request.
        for segment in 0..<3 {
            harness.wrote(0, segment: segment, upTo: ranges[segment].end)
            let actions = harness.handle(.reachedLimit(harness.request(0), at: ranges[segment].end))
            #expect(describe(actions) == ["proceed 0 into \(segment + 1)"])
        }
        harness.wrote(0, segment: 3, upTo: Harness.total)
        harness.ended(0, .finished(at: Harness.total))
        #expect(harness.machine.phase.kind == .verifying)
        #expect(harness.machine.connections.map(\.state) == [.idle, .retired, .retired, .retired])
    }

    @Test func whenEveryConnectionIsToldToWaitADayTheDownloadFailsAtOnceWithTheDataKept() throws {
        var harness = Harness.transferring()
        for connection in 1...3 { harness.answer(connection, Harness.status(503, retryAfter: "86400")) }
        harness.wrote(0, segment: 0, upTo: 500_000)
        // Connection 0's answer breaks; its next request (a range) is refused the same way.
        harness.ended(0, .failed(.retryable(HaulError(.network, "reset"), retryAfter: nil)))
        harness.advance(.seconds(1))
        let resend = harness.handle(.timer)
        #expect(describe(resend) == ["send 0 bytes=500000-1048575"])
        let actions = harness.answer(0, Harness.status(503, retryAfter: "86400"))
        #expect(harness.machine.phase.kind == .failing)
        #expect(describe(actions).contains("last checkpoint"))
        #expect(describe(harness.handle(.checkpointed(pieces: [:]))) == ["failed"])
        let error = try #require(harness.machine.error)
        #expect(error.code == .httpStatus && error.status == 503)
        #expect(error.message.contains("asked to retry after 86400 s, longer than allowed"))
        #expect(harness.machine.phase.kind == .failed)
    }

    @Test func theLastConnectionRetiringFailsTheDownloadWithItsError() throws {
        var harness = Harness.transferring()
        // Connections 1 to 3 keep failing until they retire.
        for connection in 1...3 {
            for attempt in 1...3 {
                harness.ended(connection, .failed(.retryable(HaulError(.network, "refused"), retryAfter: nil)))
                if attempt < 3 {
                    harness.advance(.seconds(10))
                    harness.handle(.timer)
                    #expect(harness.machine.connections[connection].isBusy, "connection \(connection) tries again")
                }
            }
            #expect(harness.machine.connections[connection].state == .retired)
        }
        #expect(harness.machine.phase.kind == .transferring)
        // Connection 0 fails as often: being the last one, its failure is the download's.
        for attempt in 1...3 {
            harness.ended(0, .failed(.retryable(HaulError(.network, "reset"), retryAfter: nil)))
            if attempt < 3 {
                harness.advance(.seconds(10))
                harness.handle(.timer)
            }
        }
        #expect(harness.machine.phase.kind == .failed)
        #expect(harness.machine.error?.message == "reset (gave up after 2 retries)")
    }

    @Test func theFirstErrorIsTheOneTheCallerHearsAboutUnlessAPauseWins() throws {
        // The disk filled up; while the download stops, and while its last checkpoint is stored,
        // more things fail.
        var harness = Harness.stoppingToFail()
        harness.handle(.failed(HaulError(.fileSystem, "cannot write")))
        harness.endBusyConnections()
        #expect(harness.machine.phase.kind == .failing)
        harness.handle(.failed(HaulError(.fileSystem, "cannot store the checkpoint")))
        #expect(harness.machine.phase.kind == .failed)
        #expect(harness.machine.error?.message == "disk full")
        // The caller cancels while it stops: it pauses, and only the pause's own failure is heard.
        var paused = Harness.stoppingToFail()
        paused.handle(.cancel)
        paused.endBusyConnections()
        #expect(paused.machine.phase.kind == .pausing)
        paused.handle(.failed(HaulError(.fileSystem, "cannot store the checkpoint")))
        #expect(paused.machine.error?.message == "cannot store the checkpoint")
    }

    @Test func aRestartWaitsForEveryConnectionMidWriteBeforeTheDataIsDiscarded() throws {
        var harness = Harness.allReceiving()
        // Connection 1's next request finds the file changed while 0, 2 and 3 are writing.
        harness.ended(1, .finished(at: harness.machine.table!.segments[1].position))
        harness.advance(.seconds(1))
        harness.handle(.timer)
        let actions = harness.answer(1, Harness.whole(etag: "\"v2\""))
        #expect(describe(actions) == ["drop 1", "abandon 0", "abandon 2", "abandon 3"])
        guard case .stopping(then: .restart(let reason, _)) = harness.machine.phase else {
            Issue.record("\(harness.machine.phase)")
            return
        }
        #expect(reason == .remoteChanged("ETag changed from \"v1\" to \"v2\""))
        // Their last writes still land and are counted, and nothing is discarded while one writes.
        harness.wrote(0, segment: 0, upTo: 200_000)
        #expect(describe(harness.ended(0, .failed(.cancelled))).isEmpty)
        #expect(describe(harness.ended(2, .failed(.cancelled))).isEmpty)
        let last = harness.ended(3, .failed(.cancelled))
        #expect(describe(last) == ["discard"])
        // Once the data is gone the download starts over with a fresh request.
        let again = harness.handle(.discarded)
        #expect(describe(again) == ["restarted", "send 0 bytes=0-"])
        #expect(harness.machine.restarts == 1 && harness.machine.table == nil)
    }

    @Test func restartsCountAgainstOneCapWhetherTheAnswerReplacesTheDataOrItIsDiscardedFirst() throws {
        var harness = Harness.probing(connections: 1)
        harness.answer(0, Harness.whole(etag: "\"v0\""))
        // Every resume finds another version: the whole new file, which replaces the stored bytes as
        // it is written, or (the second time) a range of another length, whose bytes are discarded
        // before the file is asked for again.
        for version in 1...4 {
            harness.wrote(0, segment: 0, upTo: 100_000)
            harness.ended(0, .failed(.retryable(HaulError(.network, "reset"), retryAfter: nil)))
            harness.advance(.seconds(1))
            #expect(describe(harness.handle(.timer)) == ["send 0 bytes=100000-"])
            if version == 2 {
                let changed = Harness.partial(100_000, Harness.total, of: Harness.total + 1, etag: "\"v2\"")
                #expect(describe(harness.answer(0, changed)) == ["drop 0", "discard"])
                #expect(describe(harness.handle(.discarded)) == ["restarted", "send 0 whole"])
                harness.answer(0, Harness.whole(etag: "\"v2\""))
            } else {
                let actions = describe(harness.answer(0, Harness.whole(etag: "\"v\(version)\"")))
                #expect(actions.contains("restarted") == (version < 4), "\(actions)")
            }
            #expect(harness.machine.restarts == version)
        }
        // The fourth restart is one too many: the download fails, keeping what it has.
        #expect(harness.machine.phase.kind == .failing)
        harness.handle(.checkpointed(pieces: [:]))
        let error = try #require(harness.machine.error)
        #expect(error.code == .remoteChanged && error.message.hasPrefix("gave up after 3 restarts: "))
    }

    @Test func goingOnToTheNextMirrorIsNoRestart() throws {
        var harness = Harness.withMirrors(checksum: false, connections: 1) { $0.maximumRestarts = 0 }
        harness.handle(.start(.nothing))
        // The origin, then the first mirror, refuse the file: each time the next URL serves it from
        // byte 0, though no restart is allowed.
        for source in 1...2 {
            harness.answer(0, Harness.status(404))
            harness.endBusyConnections()
            guard case .restarting(.mirrorFallback, _) = harness.machine.phase else {
                Issue.record("\(harness.machine.phase)")
                return
            }
            let probe = harness.handle(.discarded)
            #expect(describe(probe) == ["restarted", "send 0 whole"])
            #expect(harness.machine.origin == source && harness.machine.restarts == 0)
        }
    }

    @Test func aCancellationWhileTheFileIsCheckedWaitsForTheCheckAndTheDiscardItLeadsTo() throws {
        var harness = Harness.verifying()
        #expect(describe(harness.handle(.cancel)).isEmpty)
        #expect(describe(harness.handle(.verified(.digestMismatch("sha-256 differs")))) == ["discard"])
        // The bytes were wrong: they are gone, and the download pauses rather than start over.
        #expect(describe(harness.handle(.discarded)) == ["paused"])
        #expect(harness.machine.restarts == 0 && harness.machine.table == nil)
    }

    @Test func progressIsStoredEverySecondAndDurablyEveryFiveOneCheckpointAtATime() throws {
        var harness = Harness.transferring(connections: 1)
        var taken: [String] = []
        for second in 1...5 {
            harness.advance(.milliseconds(500))
            harness.wrote(0, segment: 0, upTo: Int64(second) * 100_000)
            #expect(harness.machine.nextDeadline == .zero + .seconds(second))
            harness.advance(.milliseconds(500))
            taken += describe(harness.handle(.timer))
            // Bytes written while it is stored wait for it: no deadline is set for them.
            harness.wrote(0, segment: 0, upTo: Int64(second) * 100_000 + 50_000)
            #expect(harness.machine.nextDeadline == harness.now + .seconds(30), "only the stall timeout")
            harness.handle(.checkpointed(pieces: [:]))
        }
        #expect(taken == ["checkpoint", "checkpoint", "checkpoint", "checkpoint", "checkpoint durable"])
        // The durable one vouches for the bytes written before it was taken, not for those after.
        #expect(harness.machine.table?.segments[0].durable == 500_000)
    }

    @Test func aStalledConnectionIsAbandonedOnTheClockAndRetried() throws {
        var harness = MachineHarness(connections: 1) { $0.checkpointInterval = .seconds(3600) }
        harness.handle(.start(.nothing))
        harness.answer(0, Harness.partial(0, Harness.total - 1))
        harness.wrote(0, segment: 0, upTo: 100_000)
        #expect(harness.machine.nextDeadline == harness.now + .seconds(30))
        harness.advance(.seconds(30))
        #expect(describe(harness.handle(.timer)) == ["abandon 0"])
        let retry = harness.ended(0, .failed(.cancelled))
        #expect(describe(retry).contains("retrying 1 in 1.0 seconds"))
        harness.advance(.seconds(1))
        #expect(describe(harness.handle(.timer)) == ["send 0 bytes=100000-"])
    }

    @Test func anIdleConnectionTakesOverARangeThatMadeNoProgressForThreeSeconds() throws {
        // Ranges of 1 MiB, never split below 1 MiB.
        var harness = Harness.allReceiving(minimumSplit: 1 << 20)
        // Connection 3 finishes its range; range 2 (under 2 MiB left: too little to halve) does not move.
        let ranges = harness.machine.table!.segments
        for connection in [0, 1, 3] {
            harness.wrote(connection, segment: connection, upTo: ranges[connection].end)
        }
        harness.ended(3, .finished(at: ranges[3].end))
        harness.advance(.seconds(2))
        #expect(!describe(harness.handle(.timer)).contains { $0.hasPrefix("send") })
        harness.advance(.seconds(1))
        let actions = harness.handle(.timer)
        #expect(describe(actions).contains("abandon 2"))
        // The take-over is logged, with the bytes and the connection it comes from.
        #expect(
            actions.contains {
                if case .log(let message) = $0 {
                    message.contains("takes over bytes") && message.contains("connection 2")
                } else {
                    false
                }
            })
        #expect(describe(actions).contains { $0.hasPrefix("send 3 bytes=\(ranges[2].start + 65_536)-") })
    }

    /// Two ranges of 2 MiB, never split below 1 MiB (a range can only be taken over, not halved),
    /// both answered; connection 1 has written 64 KiB of its range.
    static func twoRangesThatCannotBeHalved() -> (Harness, [RangeTable.Segment]) {
        var harness = MachineHarness(connections: 2) { $0.minimumSplit = 1 << 20 }
        harness.handle(.start(.nothing))
        harness.answer(0, Harness.partial(0, Harness.total - 1))
        let ranges = harness.machine.table!.segments
        harness.answer(1, Harness.partial(ranges[1].start, ranges[1].end - 1))
        harness.wrote(1, segment: 1, upTo: ranges[1].start + 65_536)
        return (harness, ranges)
    }

    @Test func aStalledConnectionWhoseRangeIsTakenOverStillCountsItsFailedAttempt() throws {
        let (start, ranges) = Self.twoRangesThatCannotBeHalved()
        var harness = start
        harness.advance(.seconds(29))
        harness.wrote(0, segment: 0, upTo: ranges[0].end - 65_536)
        harness.advance(.seconds(1))
        // Connection 1 sent nothing for 30 s: it is abandoned as stalled.
        #expect(describe(harness.handle(.timer)) == ["abandon 1"])
        // Connection 0 finishes its range and takes over range 1 while connection 1 is still stopping.
        harness.wrote(0, segment: 0, upTo: ranges[0].end)
        let takeover = harness.ended(0, .finished(at: ranges[0].end))
        #expect(describe(takeover).contains("send 0 bytes=\(ranges[1].start + 65_536)-\(ranges[1].end - 1)"))
        // The stall still counts: connection 1 waits before its next attempt.
        let end = harness.ended(1, .failed(.cancelled))
        #expect(describe(end).contains("retrying 1 in 1.0 seconds"), "\(describe(end))")
    }

    @Test func anAnswerReadPastACutMadeMeanwhileCountsItsBytesForTheRangeItGoesOnInto() throws {
        var harness = MachineHarness(connections: 2)
        harness.handle(.start(.nothing))
        harness.answer(0, Harness.partial(0, Harness.total - 1))
        let ranges = harness.machine.table!.segments
        harness.wrote(0, segment: 0, upTo: 65_536)
        harness.answer(1, Harness.partial(ranges[1].start, ranges[1].end - 1))
        harness.wrote(1, segment: 1, upTo: ranges[1].end)
        // Connection 1 is done and takes half of what connection 0 has left.
        let claim = describe(harness.ended(1, .finished(at: ranges[1].end)))
        let cut = try #require(harness.machine.table!.segments.last?.start)
        #expect(claim.contains("limit 0 \(cut)") && claim.contains { $0.hasPrefix("send 1") }, "\(claim)")
        // Connection 0 had already read to its old end: it reports those bytes, then asks at that end.
        harness.wrote(0, segment: 0, upTo: ranges[0].end)
        let actions = describe(harness.handle(.reachedLimit(harness.request(0), at: ranges[0].end)))
        #expect(actions == ["proceed 0 into 2", "abandon 1"])
        // The bytes past the cut are stored and count: nothing is left to fetch.
        #expect(harness.machine.table!.isComplete)
    }

    @Test func aRequestWaitingForAConnectionToItsHostIsNotStalledAndItsStallClockStartsWhenItIsSent() throws {
        var harness = Harness.probing(connections: 1)
        let request = harness.request(0)
        #expect(harness.machine.nextDeadline == harness.now + .seconds(30))
        // The cap on connections per host holds the request back: no stall clock runs while it waits.
        harness.handle(.queued(request))
        #expect(harness.machine.nextDeadline == nil)
        #expect(harness.machine.openConnections == 0)
        harness.advance(.seconds(600))
        #expect(describe(harness.handle(.timer)).isEmpty)
        // Sent at last: the stall timeout runs from now.
        harness.handle(.admitted(request))
        #expect(harness.machine.nextDeadline == harness.now + .seconds(30))
        harness.advance(.seconds(30))
        #expect(describe(harness.handle(.timer)) == ["abandon 0"])
    }

    @Test func theFirstAnswerGoesOnIntoARangeWhoseConnectionWaitsForTheHostAndAPauseLeavesTheLine() throws {
        var harness = Harness.transferring()
        let ranges = harness.machine.table!.segments
        for connection in 1...3 { harness.handle(.queued(harness.request(connection))) }
        // Sent just now after a long wait: its range is not taken over for the time it waited.
        harness.advance(.seconds(10))
        harness.handle(.admitted(harness.request(3)))
        harness.wrote(0, segment: 0, upTo: ranges[0].end)
        // Connection 1 has no connection to the host yet: the first answer delivers its range instead.
        let actions = describe(harness.handle(.reachedLimit(harness.request(0), at: ranges[0].end)))
        #expect(actions == ["proceed 0 into 1", "abandon 1"])
        #expect(harness.machine.table!.segments[3].lastProgress == harness.now)
        // Pausing abandons the requests still waiting too.
        let pause = describe(harness.handle(.cancel))
        #expect(pause.filter { $0.hasPrefix("abandon") } == ["abandon 0", "abandon 2", "abandon 3"])
    }

    @Test func aConnectionHeldBackByARateLimitIsNeitherStalledNorTakenOver() throws {
        let (start, ranges) = Self.twoRangesThatCannotBeHalved()
        var harness = start
        // Connection 1 waits a minute for a limit shared with many downloads.
        harness.handle(.throttled(harness.request(1), until: harness.now + .seconds(60)))
        // The block taken just before reaches the disk after the wait began: the wait still holds.
        harness.advance(.seconds(1))
        harness.wrote(1, segment: 1, upTo: ranges[1].start + 131_072)
        harness.advance(.seconds(28))
        harness.wrote(0, segment: 0, upTo: ranges[0].end)
        // Connection 0 is done; it does not take connection 1's range, whose stall clock waits.
        let done = describe(harness.ended(0, .finished(at: ranges[0].end)))
        #expect(!done.contains { $0.hasPrefix("send") }, "\(done)")
        harness.advance(.seconds(30))
        let waiting = describe(harness.handle(.timer))
        #expect(!waiting.contains { $0.hasPrefix("abandon") || $0.hasPrefix("send") }, "\(waiting)")
        #expect(harness.machine.nextDeadline.map { $0 >= .zero + .seconds(60) } == true)
        // Once the limit lets it go and it still sends nothing, the usual take-over applies.
        harness.advance(.seconds(4))
        #expect(describe(harness.handle(.timer)).contains { $0.hasPrefix("send 0") })
    }

    @Test func aFileWhoseLastBytesFailTheirContentDigestIsNotComplete() throws {
        var harness = Harness.stoppingToVerify()
        // The body's end is awaited before the file counts as complete.
        #expect(harness.machine.phase.kind == .stoppingToVerify)
        let actions = harness.ended(0, .failed(.bodyDigestMismatch("sha-256 differs", from: 0)))
        #expect(describe(actions).contains("cut 0"))
        #expect(harness.machine.phase.kind == .transferring && harness.machine.table?.written == 0)
    }

    @Test(arguments: ["reset", "stall"])
    func aFileWhoseLastAnswerEndsBeforeItsContentDigestIsCheckedIsFetchedAgain(ending: String) throws {
        var harness = Harness.stoppingToVerify()
        var actions: [TransferAction]
        if ending == "reset" {
            actions = harness.ended(0, .failed(.retryable(HaulError(.network, "reset"), retryAfter: nil)))
        } else {
            harness.advance(.seconds(30))
            actions = harness.handle(.timer)
            #expect(describe(actions).contains("abandon 0"))
            actions += harness.ended(0, .failed(.cancelled))
        }
        // Not verified and completed on trust: the answer's bytes are forgotten and asked for again.
        #expect(describe(actions).contains("cut 0"), "\(describe(actions))")
        #expect(!describe(actions).contains("verify"))
        #expect(harness.machine.phase.kind == .transferring && harness.machine.table?.written == 0)
        harness.advance(.seconds(1))
        #expect(describe(harness.handle(.timer)) == ["send 0 whole"])
    }

    @Test func anAnswerThatNoLongerFitsItsRangeGivesTheRangeBack() throws {
        var harness = Harness.transferring()
        let range = harness.machine.table!.segments[1]
        // While connection 1's request is out, bytes of its range arrive from an earlier answer.
        harness.handle(
            .wrote(RequestTag(connection: 1, serial: 0), segment: 1, upTo: range.start + 65_536, pieces: [:]))
        let actions = harness.answer(1, Harness.partial(range.start, range.end - 1))
        // The answer starts before what is now needed: it is dropped, and the range is asked for
        // again from where it stands, not left to a connection that sits idle.
        #expect(
            describe(actions) == ["drop 1", "send 1 bytes=\(range.start + 65_536)-\(range.end - 1)"],
            "\(describe(actions))")
        #expect(harness.machine.table?.owner(of: 1) == 1)
        if let deadline = harness.machine.nextDeadline { #expect(deadline > harness.now) }
    }

    @Test func aBusyServerToldToComeBackIsAskedForRangesAgainAfterTheWait() throws {
        var harness = Harness.probing()
        // bytes=0- is told to wait: the plain request goes out at once, in case the range was the reason.
        #expect(describe(harness.answer(0, Harness.status(503, retryAfter: "5"))) == ["drop 0", "send 0 whole"])
        // The plain request is told to wait too: the server is busy. After the wait, ranges again.
        let wait = harness.answer(0, Harness.status(503, retryAfter: "5"))
        #expect(describe(wait).contains("retrying 1 in 5.0 seconds"), "\(describe(wait))")
        harness.advance(.seconds(5))
        #expect(describe(harness.handle(.timer)) == ["send 0 bytes=0-"])
        // Served now: the download is split over its connections.
        let served = harness.answer(0, Harness.partial(0, Harness.total - 1))
        #expect(describe(served).filter { $0.hasPrefix("send") }.count == 3, "\(describe(served))")
    }

    @Test func aLateEndOfADroppedAnswerDoesNotEndTheNextRequest() throws {
        var harness = Harness.probing(connections: 1)
        let first = harness.request(0)
        harness.answer(0, Harness.status(503, retryAfter: "0"))
        harness.handle(.timer)
        #expect(harness.machine.connections[0].isBusy)
        // The dropped answer's request ends after the next request went out: nothing happens.
        #expect(describe(harness.handle(.ended(first, .dropped))).isEmpty)
        #expect(harness.machine.connections[0].isBusy)
    }

    @Test func anAdaptiveDownloadAddsConnectionsWhileTheyAddThroughput() throws {
        var harness = MachineHarness(connections: 4, adaptive: true)
        harness.handle(.start(.nothing))
        let first = harness.answer(0, Harness.partial(0, Harness.total - 1))
        #expect(!describe(first).contains { $0.hasPrefix("send") }, "one connection to begin with")
        // 1 MB/s with one connection: after a window, a second connection takes half of what is left.
        harness.wrote(0, segment: 0, upTo: 65_536)
        harness.advance(.milliseconds(500))
        let actions = harness.wrote(0, segment: 0, upTo: 565_536)
        #expect(describe(actions).contains("prepare file layout"))
        #expect(describe(actions).contains { $0.hasPrefix("send 1 bytes=") })
    }

    /// The second connection's bytes when it leaves: the first reads up to 1 MiB of them again to
    /// go on into its range, and asks for the rest of the range anew when it wrote more.
    @Test(arguments: [500_000, 1_150_000] as [Int64])
    func anAddedConnectionThatDoesNotSpeedTheDownloadUpLeavesAndTheFirstTakesOverItsRange(leftAt written: Int64)
        throws
    {
        var harness = MachineHarness(connections: 4, adaptive: true)
        harness.handle(.start(.nothing))
        harness.answer(0, Harness.partial(0, Harness.total - 1))
        // 1 MB/s with one connection: a second one takes half of what is left.
        harness.wrote(0, segment: 0, upTo: 65_536)
        harness.advance(.milliseconds(500))
        harness.wrote(0, segment: 0, upTo: 565_536)
        let second = harness.machine.table!.segments[1]
        harness.answer(1, Harness.partial(second.start, second.end - 1))
        // Both deliver, but together no faster than one alone (a disk, say, that is the bottleneck).
        harness.wrote(1, segment: 1, upTo: second.start + written - 250_000)
        harness.advance(.milliseconds(400))
        harness.wrote(0, segment: 0, upTo: 815_536)
        harness.advance(.milliseconds(100))
        let back = harness.wrote(1, segment: 1, upTo: second.start + written)
        // The second connection leaves; its range waits for the first.
        #expect(describe(back).filter { !$0.hasPrefix("checkpoint") } == ["abandon 1"], "\(describe(back))")
        #expect(harness.machine.ramp.allowed == 1 && !harness.machine.ramp.isRamping)
        #expect(harness.machine.table?.owner(of: 1) == nil)
        harness.ended(1, .failed(.cancelled))
        #expect(harness.machine.connections[1].state == .idle && harness.machine.connections[1].failures == 0)
        harness.wrote(0, segment: 0, upTo: second.start)
        let onward = harness.handle(.reachedLimit(harness.request(0), at: second.start))
        if written <= 1 << 20 {
            // It goes on into that range at the end of its own, without a new request.
            #expect(describe(onward) == ["proceed 0 into 1"])
        } else {
            // Reading that much again costs more than a request: it ends its answer and asks.
            #expect(describe(onward) == ["stop 0"])
            let next = harness.ended(0, .finished(at: second.start))
            #expect(
                describe(next).filter { !$0.hasPrefix("checkpoint") }
                    == ["send 0 bytes=\(second.start + written)-\(second.end - 1)"], "\(describe(next))")
        }
    }
}

/// A connection the host refuses: at once the download's end when nothing has come from any server
/// and nothing is stored (as curl and wget), else a failure like any other.
@Suite struct RefusedConnectionMachineTests {
    typealias Harness = MachineHarness

    static func harness(retried: Bool, connections: Int = 1) -> Harness {
        Harness(connections: connections) { settings in
            var retry = DownloaderConfiguration.Retry()
            retry.maximumRetries = 2
            retry.jitter = false
            retry.retriesRefusedConnections = retried
            settings.retry = RetryPolicy(retry)
        }
    }

    static let refusal = ConnectionEnd.failed(
        .refused(HaulError(.network, "cannot connect to 127.0.0.1:1: connection refused")))

    @Test func aFreshDownloadFailsAtTheFirstRefusal() throws {
        var harness = Self.harness(retried: false)
        harness.handle(.start(.nothing))
        harness.ended(0, Self.refusal)
        #expect(harness.machine.phase.kind == .failed)
        #expect(harness.machine.error?.message == "cannot connect to 127.0.0.1:1: connection refused")
    }

    @Test func refusalsAreRetriedWhenAskedFor() throws {
        var harness = Self.harness(retried: true)
        harness.handle(.start(.nothing))
        let actions = harness.ended(0, Self.refusal)
        #expect(harness.machine.phase.kind != .failed)
        #expect(describe(actions).contains { $0.hasPrefix("retrying 1") }, "\(describe(actions))")
        harness.advance(.seconds(1))
        #expect(describe(harness.handle(.timer)).contains { $0.hasPrefix("send 0") })
    }

    @Test func aServerThatAnsweredBeforeIsRetried() throws {
        var harness = Self.harness(retried: false)
        harness.handle(.start(.nothing))
        // It answered (busy), then refused: restarting, not gone.
        harness.answer(0, Harness.status(503))
        harness.advance(.seconds(1))
        harness.handle(.timer)
        harness.ended(0, Self.refusal)
        #expect(harness.machine.phase.kind != .failed)
        #expect(harness.machine.connections[0].failures == 2)
    }

    @Test func aDownloadWithStoredBytesIsRetried() throws {
        var harness = Self.harness(retried: false)
        let stored = Harness.storedManifest(written: 1 << 20)
        harness.handle(.start(.stored(stored, partialSize: 1 << 20)))
        #expect(
            describe(harness.handle(.storedDataChecked(StoredData(segments: stored.segments, pieces: []))))
                == ["send 0 bytes=1048576-"])
        harness.ended(0, Self.refusal)
        #expect(harness.machine.phase.kind != .failed)
        #expect(harness.machine.connections[0].failures == 1)
    }
}
