import AsyncHTTPClient
import Foundation
import Synchronization
import Testing

@testable import Haul

/// A resolver for tests: counts its lookups, answers `10.0.0.N` for the Nth, and fails or waits
/// when told to.
private final class CountingResolver: Sendable {
    private struct State {
        var lookups = 0
        var failNext = false
        var held: [CheckedContinuation<Void, Never>] = []
        var holding = false
    }

    private let state = Mutex(State())

    var lookups: Int { state.withLock { $0.lookups } }
    var waiting: Int { state.withLock { $0.held.count } }

    func failNext() { state.withLock { $0.failNext = true } }
    func hold() { state.withLock { $0.holding = true } }

    func release() {
        let held = state.withLock { state in
            state.holding = false
            defer { state.held = [] }
            return state.held
        }
        for waiter in held { waiter.resume() }
    }

    func lookUp(_ host: String) async throws -> String {
        let (number, fails, holds) = state.withLock { state in
            state.lookups += 1
            defer { state.failNext = false }
            return (state.lookups, state.failNext, state.holding)
        }
        if holds {
            await withCheckedContinuation { continuation in
                let resumeNow = state.withLock { state in
                    guard state.holding else { return true }
                    state.held.append(continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        }
        if fails { throw HostResolution.Failure(host: host) }
        return "10.0.0.\(number)"
    }
}

@Suite("Addresses Haul resolves itself are kept for a minute", .timeLimit(.minutes(1)))
struct AddressCacheTests {
    @Test("an answer is kept for a minute on the downloader's clock, then looked up again")
    func keptForAMinute() async throws {
        let clock = ManualClock()
        let resolver = CountingResolver()
        let cache = AddressCache(clock: TransferClock(clock), lookUp: resolver.lookUp)
        #expect(try await cache.address(of: "example.test") == "10.0.0.1")
        clock.advance(by: .seconds(59))
        #expect(try await cache.address(of: "example.test") == "10.0.0.1")
        #expect(try await cache.address(of: "other.test") == "10.0.0.2", "each host has its own answer")
        #expect(resolver.lookups == 2)
        clock.advance(by: .seconds(1))
        #expect(try await cache.address(of: "example.test") == "10.0.0.3")
        #expect(resolver.lookups == 3)
    }

    @Test("asks for one host at the same time share one lookup; a failed one is not kept")
    func sharedAndFailuresForgotten() async throws {
        let resolver = CountingResolver()
        let cache = AddressCache(clock: TransferClock(ManualClock()), lookUp: resolver.lookUp)
        resolver.hold()
        let asks = (0..<5).map { _ in Task { try await cache.address(of: "example.test") } }
        try await waitUntil("the lookup waits") { resolver.waiting == 1 }
        resolver.release()
        for ask in asks { #expect(try await ask.value == "10.0.0.1") }
        #expect(resolver.lookups == 1)

        resolver.failNext()
        await #expect(throws: HostResolution.Failure.self) { try await cache.address(of: "down.test") }
        #expect(try await cache.address(of: "down.test") == "10.0.0.3")
        #expect(resolver.lookups == 3)
    }

    @Test("requests through a socks5:// proxy resolve their host once a minute, not once a request")
    func socks5RoutesUseTheCache() async throws {
        let clock = ManualClock()
        let resolver = CountingResolver()
        let lanes = ProxiedLanes(
            count: 1, configuration: HTTPClient.Configuration(),
            addresses: AddressCache(clock: TransferClock(clock), lookUp: resolver.lookUp))
        let proxy = try Proxy(parsing: "socks5://127.0.0.1:1080")
        let url = try #require(URL(string: "https://example.test/file"))
        let first = try await lanes.lanes(to: url, through: proxy)
        let second = try await lanes.lanes(to: url, through: proxy)
        #expect(first === second)
        #expect(resolver.lookups == 1)
        clock.advance(by: AddressCache.lifetime)
        let later = try await lanes.lanes(to: url, through: proxy)
        #expect(later !== first, "a new answer, a new address")
        #expect(resolver.lookups == 2)
        try await lanes.shutdown()
    }
}
