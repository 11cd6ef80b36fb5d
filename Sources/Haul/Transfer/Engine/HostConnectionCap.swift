import Synchronization

/// The cap on connections to one host over every download of a downloader
/// (``DownloaderConfiguration/maxConnectionsPerHost``): each request enters before it is sent and
/// leaves once its answer is read; requests beyond the cap wait in line, first come first served,
/// until one leaves or their task is cancelled.
///
/// Over HTTP/1.1 a request holds a connection of its own, so each one in flight takes a place;
/// they all go through the first client of their way out, whose pool opens no more connections
/// than the cap and keeps them for the next. Over HTTP/2 a connection carries many requests: none
/// takes a place, and connection `k` of a download goes through client `k` modulo the cap, each
/// client keeping one connection to the host. Which of the two a host speaks is known once an
/// answer came (only https may be HTTP/2); until then one request goes to it at a time.
final class HostConnectionCap: Sendable {
    /// What a request entered with: whether it holds a place, and which client it goes through.
    struct Pass: Sendable {
        let host: String
        /// Whether the request counts as a connection of its own (HTTP/1.1, or not known yet).
        let holdsPlace: Bool
        /// The client (the connection lane) to send it through.
        let lane: Int
    }

    private struct Waiter {
        let id: UInt64
        let connection: Int
        let continuation: CheckedContinuation<Pass, any Error>
    }

    private struct Host {
        /// Places held: requests in flight that count as a connection each.
        var held = 0
        /// Requests in flight, holding a place or not.
        var inFlight = 0
        /// Whether the host speaks HTTP/2; `nil` until an answer tells.
        var multiplexes: Bool?
        var waiters: [Waiter] = []
    }

    private struct State {
        var hosts: [String: Host] = [:]
        var nextID: UInt64 = 0
    }

    /// The most connections to one host.
    let limit: Int
    private let state = Mutex(State())

    init(limit: Int) {
        self.limit = max(1, limit)
    }

    /// Waits for a place for connection `connection`'s request to `host` (scheme, name and port);
    /// `mayMultiplex` says whether the host could speak HTTP/2. `waiting` is called before the
    /// request waits, when it has to.
    /// - Throws: `CancellationError` when the task is cancelled first: the request leaves the line.
    func enter(host: String, connection: Int, mayMultiplex: Bool, waiting: () -> Void) async throws -> Pass {
        let (admitted, id) = state.withLock { state -> (Pass?, UInt64) in
            state.nextID += 1
            var entry = state.hosts[host] ?? Host(multiplexes: mayMultiplex ? nil : false)
            defer { state.hosts[host] = entry }
            return (entry.waiters.isEmpty ? admit(connection, to: &entry, host: host) : nil, state.nextID)
        }
        if let admitted { return admitted }
        waiting()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                let granted = state.withLock { state -> Result<Pass, any Error>? in
                    guard !Task.isCancelled else { return .failure(CancellationError()) }
                    var entry = state.hosts[host] ?? Host(multiplexes: mayMultiplex ? nil : false)
                    defer { state.hosts[host] = entry }
                    // A place freed since the first look goes to whoever waits longest.
                    if entry.waiters.isEmpty, let pass = admit(connection, to: &entry, host: host) {
                        return .success(pass)
                    }
                    entry.waiters.append(Waiter(id: id, connection: connection, continuation: continuation))
                    return nil
                }
                if let granted { continuation.resume(with: granted) }
            }
        } onCancel: {
            let cancelled = state.withLock { state -> Waiter? in
                guard var entry = state.hosts[host], let index = entry.waiters.firstIndex(where: { $0.id == id })
                else { return nil }
                let waiter = entry.waiters.remove(at: index)
                state.hosts[host] = entry.inFlight == 0 && entry.waiters.isEmpty ? nil : entry
                return waiter
            }
            cancelled?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Tells what the host's answer to `pass`'s request showed; returns the pass the request now
    /// holds (an answer over HTTP/2 holds no place, one over HTTP/1.1 does).
    func answered(_ pass: Pass, multiplexed: Bool) -> Pass {
        let (updated, woken) = state.withLock { state -> (Pass, [(Waiter, Pass)]) in
            guard var entry = state.hosts[pass.host] else { return (pass, []) }
            defer { state.hosts[pass.host] = entry }
            entry.multiplexes = multiplexed
            var updated = pass
            if pass.holdsPlace && multiplexed {
                entry.held -= 1
                updated = Pass(host: pass.host, holdsPlace: false, lane: pass.lane)
            } else if !pass.holdsPlace && !multiplexed {
                // The host went back to HTTP/1.1: this request's connection counts from now on.
                entry.held += 1
                updated = Pass(host: pass.host, holdsPlace: true, lane: pass.lane)
            }
            return (updated, admitWaiters(&entry, host: pass.host))
        }
        for (waiter, granted) in woken { waiter.continuation.resume(returning: granted) }
        return updated
    }

    /// The request of `pass` is over (its answer read, or it failed): its place goes to the next in line.
    func leave(_ pass: Pass) {
        let woken = state.withLock { state -> [(Waiter, Pass)] in
            guard var entry = state.hosts[pass.host] else { return [] }
            if pass.holdsPlace { entry.held -= 1 }
            entry.inFlight -= 1
            let woken = admitWaiters(&entry, host: pass.host)
            // A host nobody uses is forgotten; its protocol is learned again on the next visit.
            state.hosts[pass.host] = entry.inFlight == 0 && entry.waiters.isEmpty ? nil : entry
            return woken
        }
        for (waiter, granted) in woken { waiter.continuation.resume(returning: granted) }
    }

    /// Places held, requests in flight and requests waiting for `host`.
    func usage(of host: String) -> (held: Int, inFlight: Int, waiting: Int) {
        state.withLock { state in
            let entry = state.hosts[host]
            return (entry?.held ?? 0, entry?.inFlight ?? 0, entry?.waiters.count ?? 0)
        }
    }

    /// A pass for connection `connection` if the host has room for it now.
    private func admit(_ connection: Int, to entry: inout Host, host: String) -> Pass? {
        switch entry.multiplexes {
        case true?:
            entry.inFlight += 1
            return Pass(host: host, holdsPlace: false, lane: connection % limit)
        case false?:
            guard entry.held < limit else { return nil }
        case nil:
            // One request at a time until an answer tells whether the host speaks HTTP/2.
            guard entry.inFlight == 0 else { return nil }
        }
        entry.held += 1
        entry.inFlight += 1
        return Pass(host: host, holdsPlace: true, lane: 0)
    }

    /// Lets in, in order, the waiters the host has room for now.
    private func admitWaiters(_ entry: inout Host, host: String) -> [(Waiter, Pass)] {
        var woken: [(Waiter, Pass)] = []
        while let first = entry.waiters.first, let pass = admit(first.connection, to: &entry, host: host) {
            woken.append((entry.waiters.removeFirst(), pass))
        }
        return woken
    }
}
