import Haul
import NIOCore
import Synchronization

/// How many connections the daemon's listener holds and for how long.
public struct ConnectionLimits: Sendable {
    /// Connections open at once, event streams included. A new one past it closes the connection
    /// that has waited longest without a response under way (an idle one, or one still sending its
    /// request); when every connection is answering, the new one is refused (503, then closed).
    public var maximumConnections = 1024
    /// Connections open at once from one client address, with the same rule among its own.
    public var maximumConnectionsPerClient = 512
    /// Event streams (`GET /api/v1/events`) open at once; past it, 503 with `Retry-After`.
    public var maximumEventStreams = 256
    /// WebSockets (aria2's `/jsonrpc`) open at once, apart from the event streams: one opens without
    /// the token (aria2's clients send it in each call), so these must not crowd out the page's
    /// stream. Past it, the upgrade is refused.
    public var maximumWebSockets = 32
    /// Time a request may take to arrive, head and body, from its first byte.
    public var requestTimeout: Duration = .seconds(10)
    /// Time a connection may stay open with no request under way, before its first and between two.
    public var idleTimeout: Duration = .seconds(30)
    /// Time a response (other than an event stream, which cuts off a client that stops reading by
    /// itself) may take to be read by its client.
    public var responseTimeout: Duration = .seconds(60)

    /// The defaults.
    public init() {}
}

/// Every open connection of the daemon's listener and what it is doing: the one place that admits
/// connections, closes those that wait too long, and makes room when there are too many.
///
/// The daemon's clock decides when a connection has waited too long (``sweep()`` runs on it), so
/// the timeouts are tested with a clock that moves only when a test moves it.
final class ConnectionLedger: Sendable {
    /// What a connection is doing.
    enum Activity: Equatable {
        /// Waiting for a request.
        case idle
        /// A request's bytes are arriving.
        case receiving
        /// A response is under way (an event stream stays here).
        case responding
    }

    private struct Connection {
        let channel: any Channel
        let client: String
        var activity: Activity
        /// When the current activity began.
        var since: Moment
        var isEventStream = false
        /// A WebSocket: open for as long as its client keeps it, never swept.
        var isWebSocket = false
    }

    private struct State {
        var connections: [ObjectIdentifier: Connection] = [:]
        var perClient: [String: Int] = [:]
        var eventStreams = 0
        var webSockets = 0
    }

    let limits: ConnectionLimits
    private let clock: TransferClock
    private let state = Mutex(State())

    init(limits: ConnectionLimits, clock: TransferClock) {
        self.limits = limits
        self.clock = clock
    }

    /// Connections open now.
    var openConnections: Int { state.withLock { $0.connections.count } }
    /// Connections whose request's bytes are arriving now.
    var receivingConnections: Int { state.withLock { $0.connections.values.count { $0.activity == .receiving } } }
    /// Event streams open now.
    var openEventStreams: Int { state.withLock { $0.eventStreams } }
    /// WebSockets open now.
    var openWebSockets: Int { state.withLock { $0.webSockets } }
    /// Clients with a connection open now.
    var clientsWithConnections: Int { state.withLock { $0.perClient.count } }

    /// Takes a new connection in, making room by closing the connection of the same client (at its
    /// cap) or of any client (at the total cap) that has waited longest without a response under
    /// way; false when there is none to close.
    func admit(_ channel: any Channel) -> Bool {
        let client = Self.client(of: channel)
        let now = clock.now
        let (admitted, victim) = state.withLock { state -> (Bool, (any Channel)?) in
            var victim: ObjectIdentifier?
            if state.perClient[client, default: 0] >= limits.maximumConnectionsPerClient {
                victim = Self.longestWaiting(in: state.connections, from: client)
                if victim == nil { return (false, nil) }
            } else if state.connections.count >= limits.maximumConnections {
                victim = Self.longestWaiting(in: state.connections, from: nil)
                if victim == nil { return (false, nil) }
            }
            var closed: (any Channel)?
            if let victim, let gone = state.connections.removeValue(forKey: victim) {
                state.perClient[gone.client, default: 1] -= 1
                if state.perClient[gone.client] == 0 { state.perClient[gone.client] = nil }
                if gone.isEventStream { state.eventStreams -= 1 }
                if gone.isWebSocket { state.webSockets -= 1 }
                closed = gone.channel
            }
            state.connections[ObjectIdentifier(channel)] = Connection(
                channel: channel, client: client, activity: .idle, since: now)
            state.perClient[client, default: 0] += 1
            return (true, closed)
        }
        victim?.close(promise: nil)
        return admitted
    }

    /// Records what the connection does now.
    func note(_ channel: any Channel, _ activity: Activity) {
        let now = clock.now
        state.withLock { state in
            let key = ObjectIdentifier(channel)
            guard var connection = state.connections[key], connection.activity != activity else { return }
            connection.activity = activity
            connection.since = now
            if activity != .responding && connection.isEventStream {
                connection.isEventStream = false
                state.eventStreams -= 1
            }
            state.connections[key] = connection
        }
    }

    /// Records that the connection's response is an event stream.
    func noteEventStream(_ channel: any Channel) {
        state.withLock { state in
            let key = ObjectIdentifier(channel)
            guard var connection = state.connections[key], !connection.isEventStream else { return }
            connection.isEventStream = true
            state.connections[key] = connection
            state.eventStreams += 1
        }
    }

    /// Records that the connection became a WebSocket.
    func noteWebSocket(_ channel: any Channel) {
        state.withLock { state in
            let key = ObjectIdentifier(channel)
            guard var connection = state.connections[key], !connection.isWebSocket else { return }
            connection.isWebSocket = true
            connection.activity = .responding
            state.connections[key] = connection
            state.webSockets += 1
        }
    }

    /// Forgets a closed connection.
    func remove(_ channel: any Channel) {
        state.withLock { state in
            guard let gone = state.connections.removeValue(forKey: ObjectIdentifier(channel)) else { return }
            state.perClient[gone.client, default: 1] -= 1
            if state.perClient[gone.client] == 0 { state.perClient[gone.client] = nil }
            if gone.isEventStream { state.eventStreams -= 1 }
            if gone.isWebSocket { state.webSockets -= 1 }
        }
    }

    /// Closes the connections idle for ``ConnectionLimits/idleTimeout``, those whose request has
    /// taken ``ConnectionLimits/requestTimeout`` and those whose response (not an event stream) has
    /// taken ``ConnectionLimits/responseTimeout``.
    func sweep() {
        let now = clock.now
        let expired = state.withLock { state in
            state.connections.values.filter { connection in
                switch connection.activity {
                case .idle: now - connection.since >= limits.idleTimeout
                case .receiving: now - connection.since >= limits.requestTimeout
                case .responding:
                    !connection.isEventStream && !connection.isWebSocket
                        && now - connection.since >= limits.responseTimeout
                }
            }.map(\.channel)
        }
        for channel in expired { channel.close(promise: nil) }
    }

    /// Sweeps once a second on the daemon's clock until cancelled.
    func sweepUntilCancelled() async {
        while !Task.isCancelled {
            do { try await clock.sleep(for: .seconds(1)) } catch { return }
            sweep()
        }
    }

    /// The connection (of `client`, when given) that has waited longest with no response under way.
    private static func longestWaiting(in connections: [ObjectIdentifier: Connection], from client: String?)
        -> ObjectIdentifier?
    {
        connections.filter { $0.value.activity != .responding && (client == nil || $0.value.client == client) }
            .min { $0.value.since < $1.value.since }?.key
    }

    private static func client(of channel: any Channel) -> String {
        channel.remoteAddress?.ipAddress ?? "unknown"
    }
}
