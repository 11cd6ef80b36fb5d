import Testing

@testable import Haul

struct RangeTableTests {
    static let mebibyte: Int64 = 1 << 20
    let now = Moment.zero
    let takeover = Duration.seconds(3)

    private func table(total: Int64, written: Int64 = 0, minimumSplit: Int64 = 1 << 20) -> RangeTable {
        RangeTable(totalLength: total, written: written, durable: 0, minimumSplit: minimumSplit, now: .zero)
    }

    private func ranges(_ table: RangeTable) -> [Range<Int64>] { table.segments.map { $0.start..<$0.end } }

    private func claim(_ table: inout RangeTable, _ connection: Int, at now: Moment = .zero) throws -> RangeTable.Claim
    {
        let claim = table.claim(connection: connection, now: now, stallTakeover: takeover)
        return try #require(claim)
    }

    @Test func aFreshDownloadIsCutIntoEqualRangesOn64KiBBoundaries() {
        let mebibyte = Self.mebibyte
        let total = 9 * mebibyte + 123
        var table = table(total: total)
        let split = table.split(into: 3, now: now)
        #expect(split)
        #expect(ranges(table) == [0..<3 * mebibyte, 3 * mebibyte..<6 * mebibyte, 6 * mebibyte..<total])
        // Each connection claims its own range, in order, before any range is halved.
        let claims = (0..<3).compactMap { table.claim(connection: $0, now: now, stallTakeover: takeover) }
        #expect(claims.map(\.from) == [0, 3 * mebibyte, 6 * mebibyte])
        #expect(claims.map(\.to) == [3 * mebibyte, 6 * mebibyte, total])
        #expect(table.segments.map(\.owner) == [0, 1, 2])
    }

    @Test func theSplitStartsAtTheBytesAlreadyWrittenAndKeepsToTheMinimum() {
        let mebibyte = Self.mebibyte
        // 1 MiB written in order (a download that began on one connection), 3 MiB to go, 1 MiB minimum:
        // eight connections asked for, three ranges made.
        var table = table(total: 4 * mebibyte, written: mebibyte)
        table.split(into: 8, now: now)
        #expect(ranges(table) == [0..<2 * mebibyte, 2 * mebibyte..<3 * mebibyte, 3 * mebibyte..<4 * mebibyte])
        #expect(table.segments.map(\.written) == [mebibyte, 0, 0])
        // Too little left to split at all, and a file of unknown length is never split.
        var small = self.table(total: mebibyte + 65_536)
        let smallSplit = small.split(into: 4, now: now)
        #expect(!smallSplit)
        #expect(ranges(small) == [0..<mebibyte + 65_536])
        var unknown = RangeTable(totalLength: nil, written: 0, durable: 0, minimumSplit: mebibyte, now: now)
        let unknownSplit = unknown.split(into: 4, now: now)
        #expect(!unknownSplit)
        _ = unknown.handOver(0, to: 0, now: now)
        let unknownClaim = unknown.claim(connection: 1, now: now + .seconds(60), stallTakeover: takeover)
        #expect(unknownClaim == nil)
    }

    @Test func aMinimumBelowTheBoundaryCountsAsOneBoundary() {
        // 256 KiB with a minimum of 1 byte, 64 connections asked for: four ranges of 64 KiB, none empty.
        var table = table(total: 262_144, minimumSplit: 1)
        table.split(into: 64, now: now)
        #expect(ranges(table) == [0..<65_536, 65_536..<131_072, 131_072..<196_608, 196_608..<262_144])
        // Halving what is left never cuts a range to nothing: 64 KiB is not split again.
        let claims = (0..<5).compactMap { table.claim(connection: $0, now: now, stallTakeover: takeover) }
        #expect(claims.count == 4)
    }

    @Test func anIdleConnectionHalvesTheLargestRangeLeft() throws {
        let mebibyte = Self.mebibyte
        var table = table(total: 8 * mebibyte)
        let first = try claim(&table, 0)
        let second = try claim(&table, 1)
        // The first took the whole file; the second took the upper half of it.
        #expect((first.from, first.to) == (0, 8 * mebibyte))
        #expect((second.from, second.to) == (4 * mebibyte, 8 * mebibyte))
        #expect(table.segments[first.segment].end == 4 * mebibyte)
        // The first has fetched 1 MiB; a third connection takes half of the second's range, the largest left.
        table.advance(first.segment, to: mebibyte, now: now)
        let third = try claim(&table, 2)
        #expect(third.from == 6 * mebibyte && third.to == 8 * mebibyte && third.displaced == nil)
        #expect(table.segments[second.segment].end == 6 * mebibyte)
    }

    @Test func aStalledRangeIsTakenOverWholeAndItsConnectionDisplaced() throws {
        let mebibyte = Self.mebibyte
        var table = table(total: 3 * mebibyte)
        table.split(into: 3, now: now)
        for connection in 0..<3 { _ = table.claim(connection: connection, now: now, stallTakeover: takeover) }
        table.advance(0, to: mebibyte, now: now + .seconds(1))
        table.advance(1, to: mebibyte + 65_536, now: now + .seconds(2))
        // Nothing can be halved (under 2 MiB left anywhere); before the take-over time nothing is given.
        let early = table.claim(connection: 0, now: now + .seconds(2), stallTakeover: takeover)
        #expect(early == nil)
        // Range 2 has not moved for 3 s: it goes whole to the idle connection.
        let claim = try claim(&table, 0, at: now + .seconds(3))
        #expect(claim.displaced == 2 && claim.from == 2 * mebibyte && claim.to == 3 * mebibyte)
        #expect(table.segments[2].isComplete)
    }

    @Test func anAnswerGoesOnIntoTheNextRangeByHandOver() {
        let mebibyte = Self.mebibyte
        var table = table(total: 4 * mebibyte)
        table.split(into: 2, now: now)
        _ = table.claim(connection: 0, now: now, stallTakeover: takeover)
        _ = table.claim(connection: 1, now: now, stallTakeover: takeover)
        table.advance(1, to: 2 * mebibyte + 65_536, now: now)
        #expect(table.successor(of: 0) == 1)
        let previous = table.handOver(1, to: 0, now: now)
        #expect(previous == 1)
        #expect(table.segments[1].owner == 0 && table.segments[1].position == 2 * mebibyte + 65_536)
        // A complete range is never the one an answer goes on into.
        table.advance(1, to: 4 * mebibyte, now: now)
        #expect(table.successor(of: 0) == nil)
    }

    @Test func progressDurabilityAndCutsOnlyMoveTheWayTheyMay() {
        var table = table(total: 1000, minimumSplit: 1)
        let completeEarly = table.advance(0, to: 600, now: now)
        #expect(!completeEarly)
        table.advance(0, to: 500, now: now)
        #expect(table.written == 600)
        let captured = table.segments
        table.advance(0, to: 800, now: now)
        table.markDurable(captured)
        #expect(table.segments[0].durable == 600)
        table.cut(0, to: 400)
        #expect(table.segments[0].written == 400 && table.segments[0].durable == 400)
        let completeAtLast = table.advance(0, to: 5000, now: now)
        #expect(completeAtLast)
        #expect(table.segments[0].written == 1000 && table.isComplete)
    }

    @Test func aFileOfUnknownLengthGetsItsEndWhenItsBodyEnds() {
        var table = RangeTable(totalLength: nil, written: 0, durable: 0, minimumSplit: 1, now: now)
        table.advance(0, to: 700, now: now)
        #expect(!table.isComplete && table.totalLength == nil)
        #expect(table.manifestSegments == [Manifest.Segment(start: 0, end: nil, written: 700, durable: 0)])
        table.setLength(700)
        #expect(table.isComplete && table.totalLength == 700)
    }
}

struct RetryPolicyTests {
    func policy(retries: Int = 3, jitter: Bool = false) -> RetryPolicy {
        var retry = DownloaderConfiguration.Retry()
        retry.maximumRetries = retries
        retry.initialDelay = .seconds(1)
        retry.maximumDelay = .seconds(8)
        retry.jitter = jitter
        retry.maximumRetryAfter = .seconds(600)
        return RetryPolicy(retry)
    }

    @Test func delaysDoubleUpToTheMaximum() {
        let delays = (1...3).map { policy(retries: 10).decide(failures: $0, retryAfter: nil, random: 0) }
        #expect(delays == [.retry(after: .seconds(1)), .retry(after: .seconds(2)), .retry(after: .seconds(4))])
        #expect(policy(retries: 10).decide(failures: 9, retryAfter: nil, random: 0) == .retry(after: .seconds(8)))
    }

    @Test func jitterSpreadsADelayOverItsUpperHalf() {
        let policy = policy(retries: 10, jitter: true)
        #expect(policy.decide(failures: 3, retryAfter: nil, random: 0) == .retry(after: .seconds(2)))
        #expect(policy.decide(failures: 3, retryAfter: nil, random: 1) == .retry(after: .seconds(4)))
    }

    @Test func retryAfterIsHonouredUpToItsCapForEveryConnection() {
        #expect(policy().decide(failures: 1, retryAfter: .seconds(120), random: 0) == .retry(after: .seconds(120)))
        #expect(policy().decide(failures: 1, retryAfter: .seconds(86_400), random: 0) == .waitTooLong(.seconds(86_400)))
        let final = RetryPolicy.finalError(
            HaulError(.httpStatus, "the server answered 503 Service Unavailable", status: 503),
            .waitTooLong(.seconds(86_400)))
        #expect(final.message.hasSuffix("asked to retry after 86400 s, longer than allowed") && final.status == 503)
    }

    @Test func failuresInARowRunOut() {
        #expect(policy(retries: 3).decide(failures: 3, retryAfter: nil, random: 0) == .retry(after: .seconds(4)))
        #expect(policy(retries: 3).decide(failures: 4, retryAfter: nil, random: 0) == .exhausted(retries: 3))
        #expect(
            RetryPolicy.finalError(HaulError(.network, "reset"), .exhausted(retries: 3)).message
                == "reset (gave up after 3 retries)")
    }
}

struct ConnectionRampTests {
    let window = Duration.milliseconds(500)

    /// Feeds the ramp a download whose rate is `rate(connections)` bytes per second, a decision at a
    /// time; returns the connections allowed after each.
    func run(maximum: Int, rate: (Int) -> Double, steps: Int = 12) -> (allowed: [Int], ramping: Bool) {
        var ramp = ConnectionRamp(maximum: maximum, adaptive: true, window: window)
        var now = Moment.zero
        var bytes: Double = 0
        ramp.begin(at: now, bytes: 0)
        var allowed: [Int] = [ramp.allowed]
        for _ in 0..<steps {
            guard let next = ramp.nextDecision else { break }
            bytes += rate(ramp.allowed) * (next - now).seconds
            now = next
            _ = ramp.update(now: now, bytes: Int64(bytes))
            allowed.append(ramp.allowed)
        }
        return (allowed, ramp.isRamping)
    }

    @Test func aPerConnectionLimitRampsUpToTheMaximum() {
        // Each connection is held to 20 MB/s: every added connection adds its share.
        let (allowed, ramping) = run(maximum: 8) { Double($0) * 20e6 }
        #expect(allowed.last == 8 && !ramping)
        // Doubling, with a window to settle after each step and one to measure it (the last step too):
        // 1, 2, 4, 8 within eight decisions.
        #expect(Array(Set(allowed)).sorted() == [1, 2, 4, 8])
        #expect(allowed.count <= 8)
    }

    @Test func aSharedBottleneckSendsTheRampBackToOneConnection() {
        // One fast connection already fills the path: a second adds nothing, and leaves.
        let (allowed, ramping) = run(maximum: 8) { _ in 1e9 }
        #expect(allowed.last == 1 && allowed.max() == 2 && !ramping)
    }

    @Test(arguments: [1.1, 1.35])
    func aSmallGainIsNotEnough(gain: Double) {
        // Two connections give 10 % or 35 % more than one (a fast local server, whose disk soon
        // becomes the bottleneck): not worth keeping.
        let (allowed, ramping) = run(maximum: 8) { $0 == 1 ? 100e6 : 100e6 * gain }
        #expect(allowed.last == 1 && !ramping)
    }

    @Test func aRateThatFallsWithMoreConnectionsGoesBackAStep() {
        // Two connections help; four are slower than two (a disk writing in four places, say).
        let (allowed, ramping) = run(maximum: 8) { [1: 400e6, 2: 800e6, 4: 500e6][$0] ?? 0 }
        #expect(allowed.last == 2 && allowed.max() == 4 && !ramping)
    }

    @Test func theStepToTheMaximumIsMeasuredToo() {
        let (allowed, ramping) = run(maximum: 4) { [1: 100e6, 2: 200e6, 4: 210e6][$0] ?? 0 }
        #expect(allowed.last == 2 && !ramping)
        let (kept, _) = run(maximum: 4) { Double($0) * 100e6 }
        #expect(kept.last == 4)
    }

    @Test func anExplicitCountIsUsedAtOnce() {
        let ramp = ConnectionRamp(maximum: 4, adaptive: false)
        #expect(ramp.allowed == 4 && !ramp.isRamping && ramp.nextDecision == nil)
        let single = ConnectionRamp(maximum: 1, adaptive: true)
        #expect(single.allowed == 1 && !single.isRamping)
    }
}
