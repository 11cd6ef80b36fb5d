import Testing

@testable import Haul

/// The mirror rules of the transfer machine, without sockets: which URL each request goes to, what
/// it asks, and what drops a mirror.
@Suite("Transfer machine: mirrors")
struct MirrorMachineTests {
    typealias Harness = MachineHarness
    static let mirrors = Harness.mirrors

    /// A download of `Harness.url` with two mirrors and `connections` connections, not started.
    static func created(checksum: Bool, connections: Int = 3) -> Harness {
        Harness.withMirrors(checksum: checksum, connections: connections)
    }

    /// A fresh download of `Harness.url` with two mirrors and three connections, its first request out.
    static func probing(checksum: Bool) -> Harness {
        var harness = created(checksum: checksum)
        harness.handle(.start(.nothing))
        return harness
    }

    static func sends(_ actions: [TransferAction]) -> [(tag: RequestTag, ask: RangeAsk)] {
        actions.compactMap { if case .send(let tag, let ask) = $0 { (tag, ask) } else { nil } }
    }

    static func reports(_ actions: [TransferAction]) -> [MirrorReport] {
        actions.compactMap { if case .report(.mirror(let report)) = $0 { report } else { nil } }
    }

    @Test func withAChecksumEveryMirrorGetsARangeAskedWithoutAnotherServersValidator() throws {
        var harness = Self.probing(checksum: true)
        let actions = harness.answer(0, Harness.partial(0, Harness.total - 1))
        guard case .mixed = Self.reports(actions).first else {
            Issue.record("\(Self.reports(actions))")
            return
        }
        let sends = Self.sends(actions)
        #expect(sends.map(\.tag.source) == [1, 2])
        // The origin's ETag means nothing to another server: a mirror's first request has no If-Range.
        #expect(sends.allSatisfy { $0.ask.ifRange == nil && $0.ask.expected?.totalLength == Harness.total })

        // Mirror 1 answers with its own ETag: its next request carries that one.
        let range1 = harness.machine.table!.segments[1]
        harness.answer(1, Harness.partial(range1.start, range1.end - 1, etag: "\"m1\""))
        #expect(harness.machine.sources[1].validator?.ifRangeValue == "\"m1\"")
        // Mirror 2 has another length: it is dropped, its range goes back, and the connection asks a
        // source still in use for it.
        let range2 = harness.machine.table!.segments[2]
        let dropped = harness.answer(2, Harness.partial(range2.start, range2.end - 1, of: Harness.total + 1))
        #expect(
            Self.reports(dropped).map(\.description).first?.hasPrefix(
                "mirror http://m2/f dropped: the remote file changed")
                == true)
        #expect(harness.machine.sources[2].dropped != nil)
        let again = Self.sends(dropped)
        #expect(again.count == 1 && again[0].tag.connection == 2 && again[0].tag.source != 2)
        #expect(again.first?.ask.from == range2.start)
        #expect(harness.machine.phase.kind == .transferring)
    }

    @Test func aMirrorThatFailsAgainAndAgainIsDroppedAndItsConnectionMovesOn() throws {
        var harness = Self.probing(checksum: true)
        harness.answer(0, Harness.partial(0, Harness.total - 1))
        #expect(harness.machine.connections[2].source == 2)
        for attempt in 1...TransferMachine.sourceFailureLimit {
            let actions = harness.answer(2, Harness.status(503))
            if attempt < TransferMachine.sourceFailureLimit {
                #expect(harness.machine.sources[2].dropped == nil)
                harness.advance(.seconds(10))
                harness.handle(.timer)
            } else {
                #expect(harness.machine.sources[2].dropped == "the server answered 503 Service Unavailable")
                let sends = Self.sends(actions)
                #expect(sends.count == 1 && sends[0].tag.connection == 2 && sends[0].tag.source != 2)
            }
        }
        #expect(harness.machine.connections[2].state != .retired)
    }

    @Test func aServerThatDeliversOnOneConnectionIsNotLeftForTheFailuresOfAnother() throws {
        // Mirrors used in turn; the origin serves connection 0 and refuses the others' ranges, as a
        // host allowing one connection per client does.
        var harness = Self.probing(checksum: false)
        harness.answer(0, Harness.partial(0, Harness.total - 1))
        harness.wrote(0, segment: 0, upTo: 65_536)
        for _ in 0..<10 {
            for connection in 1...2 where harness.machine.connections[connection].isBusy {
                harness.answer(connection, Harness.status(503))
            }
            harness.wrote(0, segment: 0, upTo: harness.machine.table!.segments[0].position + 65_536)
            harness.advance(.seconds(10))
            harness.handle(.timer)
        }
        #expect(harness.machine.connections[1].state == .retired && harness.machine.connections[2].state == .retired)
        #expect(harness.machine.origin == 0 && harness.machine.sources.allSatisfy(\.isActive))
        #expect(harness.machine.phase.kind == .transferring)
    }

    @Test func aStoredDownloadFromAMirrorResumesFromThatMirror() throws {
        var harness = Self.created(checksum: false)
        var stored = Harness.storedManifest(written: 1 << 20)
        stored.source = Self.mirrors[1]
        harness.handle(.start(.stored(stored, partialSize: 1 << 20)))
        let actions = harness.handle(.storedDataChecked(StoredData(segments: stored.segments, pieces: [])))
        let sends = Self.sends(actions)
        #expect(harness.machine.origin == 2)
        #expect(sends.count == 1 && sends[0].tag.source == 2 && sends[0].ask.ifRange == Harness.etag)
    }

    @Test func whenTheFileFailsItsChecksumAPieceOfEachMirrorIsComparedAndOnlyOneThatDiffersIsDropped() throws {
        var harness = Harness.mixedAndVerifying()
        #expect(harness.machine.phase.kind == .verifying)
        let segments = harness.machine.table!.segments
        let checks = Self.sends(harness.handle(.verified(Harness.mismatch)))
        #expect(harness.machine.phase.kind == .checkingMirrors)
        // One piece of each mirror's bytes, asked of the origin, compared with the disk, not written.
        #expect(checks.count == 2 && checks.allSatisfy { $0.tag.source == 0 && $0.ask.writeStart == $0.ask.to })
        #expect(Set(checks.map(\.ask.from)) == [segments[1].start, segments[2].start])
        for check in checks {
            let plan = harness.answer(check.tag.connection, Harness.partial(check.ask.from, check.ask.to! - 1))
            #expect(describe(plan) == ["receive \(check.tag.connection) \(check.ask.to!)..<\(check.ask.to!)"])
        }
        let first = try #require(checks.first { $0.ask.from == segments[1].start })
        let second = try #require(checks.first { $0.ask.from == segments[2].start })
        harness.ended(first.tag.connection, .finished(at: first.ask.to!))
        let actions = harness.ended(second.tag.connection, .failed(.overlapMismatch))
        // Mirror 2's bytes differ from the origin's: it alone is dropped and its range fetched again.
        #expect(harness.machine.phase.kind == .transferring)
        #expect(harness.machine.sources[1].dropped == nil)
        #expect(harness.machine.sources[2].dropped?.contains("differ") == true)
        #expect(harness.machine.table!.segments[2].written == 0 && harness.machine.table!.segments[1].isComplete)
        #expect(describe(actions).contains("forget hashes \(segments[2].start)"))
        let refetch = Self.sends(actions)
        #expect(!refetch.isEmpty && refetch.allSatisfy { $0.tag.source != 2 }, "\(refetch.map(\.tag))")
    }

    @Test func whenNoComparisonTellsTheMirrorsApartWhatEveryMirrorWroteIsFetchedAgainFromTheOrigin() throws {
        var harness = Harness.mixedAndVerifying()
        let checks = Self.sends(harness.handle(.verified(Harness.mismatch)))
        var actions: [TransferAction] = []
        for check in checks {
            harness.answer(check.tag.connection, Harness.partial(check.ask.from, check.ask.to! - 1))
            actions = harness.ended(check.tag.connection, .finished(at: check.ask.to!))
        }
        let segments = harness.machine.table!.segments
        #expect(harness.machine.sources[1].dropped != nil && harness.machine.sources[2].dropped != nil)
        #expect(segments[1].written == 0 && segments[2].written == 0 && segments[0].isComplete)
        #expect(Self.sends(actions).allSatisfy { $0.tag.source == 0 })
    }

    @Test func whenTheOriginsOwnBytesFailTheChecksumTheMirrorsDroppedAgainstItComeBack() throws {
        var harness = Harness.mixedAndVerifying()
        let checks = Self.sends(harness.handle(.verified(Harness.mismatch)))
        var actions: [TransferAction] = []
        for check in checks {
            harness.answer(check.tag.connection, Harness.partial(check.ask.from, check.ask.to! - 1))
            actions = harness.ended(check.tag.connection, .failed(.overlapMismatch))
        }
        // Both mirrors differ from the origin: dropped, and their ranges fetched again from it.
        #expect(harness.machine.sources[1].dropped != nil && harness.machine.sources[2].dropped != nil)
        var sends = Self.sends(actions)
        while let send = sends.first {
            sends.removeFirst()
            let segment = harness.machine.table!.segments.firstIndex { $0.start == send.ask.from }!
            harness.answer(send.tag.connection, Harness.partial(send.ask.from, send.ask.to! - 1))
            harness.wrote(send.tag.connection, segment: segment, upTo: send.ask.to!)
            sends += Self.sends(harness.ended(send.tag.connection, .finished(at: send.ask.to!)))
        }
        harness.endBusyConnections()
        #expect(harness.machine.phase.kind == .verifying)
        // The file, now all the origin's, still fails: the origin was the one serving other bytes.
        harness.handle(.verified(Harness.mismatch))
        guard case .restarting(.mirrorFallback, _) = harness.machine.phase else {
            Issue.record("\(harness.machine.phase)")
            return
        }
        #expect(harness.machine.sources[0].dropped != nil)
        #expect(harness.machine.sources[1].isActive && harness.machine.sources[2].isActive)
        let probe = Self.sends(harness.handle(.discarded))
        #expect(probe.count == 1 && probe[0].tag.source == 1)
    }

    @Test func aPauseDuringTheChecksForgetsWhatTheMirrorsWroteAndStops() throws {
        for pauseWhileVerifying in [true, false] {
            var harness = Harness.mixedAndVerifying()
            if pauseWhileVerifying { harness.handle(.cancel) }
            var actions = harness.handle(.verified(Harness.mismatch))
            if !pauseWhileVerifying {
                #expect(harness.machine.phase.kind == .checkingMirrors)
                actions = harness.handle(.cancel)
                actions += harness.endBusyConnections()
            }
            let segments = harness.machine.table!.segments
            #expect(segments[1].written == 0 && segments[2].written == 0 && segments[0].isComplete)
            #expect(harness.machine.phase.kind == .pausing, "\(harness.machine.phase)")
            #expect(describe(actions).contains("last checkpoint durable"))
        }
    }

    @Test func overOneConnectionAFileThatFailsTheChecksumIsFetchedFromTheNextMirror() throws {
        var harness = Self.created(checksum: true, connections: 1)
        harness.handle(.start(.nothing))
        let first = harness.answer(0, Harness.partial(0, Harness.total - 1))
        #expect(Self.reports(first).first == .inTurn(reason: "the file comes over one connection"))
        harness.wrote(0, segment: 0, upTo: Harness.total)
        harness.ended(0, .finished(at: Harness.total))
        #expect(harness.machine.phase.kind == .verifying)
        harness.handle(.verified(Harness.mismatch))
        guard case .restarting(.mirrorFallback, _) = harness.machine.phase else {
            Issue.record("\(harness.machine.phase)")
            return
        }
        let probe = Self.sends(harness.handle(.discarded))
        #expect(probe.count == 1 && probe[0].tag.source == 1)
        #expect(harness.machine.sources[0].dropped == "mismatch")
    }

    @Test func withoutProofTheMirrorsAreNotMixedAndTheNextServesTheFileFromByteZero() throws {
        var harness = Self.probing(checksum: false)
        let first = harness.answer(0, Harness.partial(0, Harness.total - 1))
        guard case .inTurn = Self.reports(first).first else {
            Issue.record("\(Self.reports(first))")
            return
        }
        #expect(Self.sends(first).allSatisfy { $0.tag.source == 0 })
        // The origin starts answering 404: the download leaves it for the next mirror, from byte 0.
        harness.wrote(0, segment: 0, upTo: 100_000)
        let refused = harness.answer(1, Harness.status(404))
        #expect(Self.reports(refused).first == .dropped(url: Harness.url, reason: "the server answered 404 Not Found"))
        harness.endBusyConnections()
        guard case .restarting(.mirrorFallback, _) = harness.machine.phase else {
            Issue.record("\(harness.machine.phase)")
            return
        }
        let probe = Self.sends(harness.handle(.discarded))
        #expect(probe.count == 1 && probe[0].tag.source == 1 && probe[0].ask.kind == .fresh(probesRanges: true))
        #expect(harness.machine.origin == 1)
    }
}
