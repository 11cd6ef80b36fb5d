import NIOPosix
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Resolves host names for a `socks5://` proxy, which is given addresses (a `socks5h://` one
/// resolves names itself).
enum HostResolution {
    /// A name that did not resolve: worth another attempt (the network may be back).
    struct Failure: Error {
        let host: String

        var message: String {
            "cannot resolve \(host): a socks5:// proxy is given addresses (socks5h:// resolves names)"
        }
    }

    /// The address of `host` as text: its first IPv4 address, else its first IPv6 one.
    /// - Throws: ``Failure`` when the name does not resolve.
    static func address(of host: String) async throws -> String {
        let addresses = try await NIOThreadPool.singleton.runIfActive { lookUp(host) }
        guard let address = addresses.first(where: { !$0.contains(":") }) ?? addresses.first else {
            throw Failure(host: host)
        }
        return address
    }

    /// Every address getaddrinfo gives for `host`, in its order.
    private static func lookUp(_ host: String) -> [String] {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        #if canImport(Darwin)
            hints.ai_socktype = SOCK_STREAM
        #else
            hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        #endif
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, nil, &hints, &list) == 0, let first = list else { return [] }
        defer { freeaddrinfo(first) }
        var addresses: [String] = []
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let current = entry {
            var buffer = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            if let address = current.pointee.ai_addr,
                getnameinfo(
                    address, current.pointee.ai_addrlen, &buffer, socklen_t(buffer.count), nil, 0, NI_NUMERICHOST) == 0
            {
                let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
                if !addresses.contains(text) { addresses.append(text) }
            }
            entry = current.pointee.ai_next
        }
        return addresses
    }
}

/// The addresses Haul resolved itself (for a `socks5://` proxy), each kept for ``lifetime`` on the
/// downloader's clock, as curl keeps its answers: many files from one host through the proxy cost
/// one lookup a minute, not one a request. Lookups of one host at the same time share one; a name
/// that did not resolve is looked up again the next time.
///
/// Other connections are resolved by the HTTP client, once per new connection (kept alive, a
/// connection serves many files). It takes no resolver to plug in, and pinning a name to one
/// address (its `dnsOverride`) would give up trying the name's other addresses when one fails.
final class AddressCache: Sendable {
    /// How long an answer is kept (curl's default).
    static let lifetime: Duration = .seconds(60)

    private enum Entry {
        /// A lookup under way, which later askers wait for.
        case resolving(UInt64, Task<Result<String, any Error>, Never>)
        case resolved(String, until: Moment)
    }

    private struct State {
        var entries: [String: Entry] = [:]
        var lookups: UInt64 = 0
        /// The entry count at which expired answers are swept out next.
        var sweepAt = 256
    }

    private let clock: TransferClock
    private let lookUp: @Sendable (String) async throws -> String
    private let state = Mutex(State())

    /// A cache reading time from `clock`, resolving names with `lookUp`.
    init(
        clock: TransferClock, lookUp: @escaping @Sendable (String) async throws -> String = HostResolution.address
    ) {
        self.clock = clock
        self.lookUp = lookUp
    }

    /// The address of `host`: a kept answer while it is fresh, else a new lookup's.
    /// - Throws: what the lookup threw (``HostResolution/Failure`` for a name that does not resolve).
    func address(of host: String) async throws -> String {
        let now = clock.now
        let lookUp = self.lookUp
        // A fresh answer, or a lookup to wait for.
        let found = state.withLock { state -> Entry in
            switch state.entries[host] {
            case .resolved(let address, let until) where now < until:
                return .resolved(address, until: until)
            case .resolving(let number, let lookup):
                return .resolving(number, lookup)
            default:
                state.lookups += 1
                let lookup = Task { () -> Result<String, any Error> in
                    do { return .success(try await lookUp(host)) } catch { return .failure(error) }
                }
                state.entries[host] = .resolving(state.lookups, lookup)
                return .resolving(state.lookups, lookup)
            }
        }
        switch found {
        case .resolved(let address, _):
            return address
        case .resolving(let number, let lookup):
            let result = await lookup.value
            keep(result, of: host, from: number)
            return try result.get()
        }
    }

    /// Keeps the answer of lookup `number` of `host`, unless a later lookup took its place; forgets
    /// a failure, and sweeps out expired answers once there are many.
    private func keep(_ result: Result<String, any Error>, of host: String, from number: UInt64) {
        let now = clock.now
        state.withLock { state in
            guard case .resolving(number, _) = state.entries[host] else { return }
            switch result {
            case .success(let address): state.entries[host] = .resolved(address, until: now + Self.lifetime)
            case .failure: state.entries[host] = nil
            }
            guard state.entries.count >= state.sweepAt else { return }
            state.entries = state.entries.filter { _, entry in
                if case .resolved(_, let until) = entry { return now < until }
                return true
            }
            state.sweepAt = max(256, 2 * state.entries.count)
        }
    }
}
