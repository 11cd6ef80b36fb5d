import NIOHTTP1

/// A download's connections, and what the machine's rules ask of them.
extension TransferMachine {
    /// How a fresh request asks for the file.
    enum RangeProbe: Equatable, Sendable {
        /// With `bytes=0-`, to learn whether ranges are served.
        case ask
        /// Without a range, once: `bytes=0-` was told to come back, and the plain request tells
        /// whether the range or the server's load was the reason.
        case deferred
        /// Without a range: the server refused `bytes=0-`.
        case refused
    }

    /// One connection of the download and what it is doing.
    struct Connection: Equatable, Sendable {
        /// What a connection is doing.
        enum State: Equatable, Sendable {
            /// Free to take a range.
            case idle
            /// `ask` was sent for `segment` (`nil` before the file's ranges are known).
            case requesting(RangeAsk, segment: Int?, since: Moment)
            /// `ask` for `segment` waits for a connection to the host (the cap on connections per
            /// host): it has not been sent, so no stall clock runs.
            case queued(RangeAsk, segment: Int?)
            /// Writing the answer's body.
            case receiving(Receiving)
            /// Waiting before the next attempt.
            case waiting(until: Moment)
            /// Told to stop; its request has not ended yet.
            case stopping(StopCause)
            /// Left the download: the server keeps refusing it.
            case retired
        }

        /// A connection writing its answer's body.
        struct Receiving: Equatable, Sendable {
            /// What its request asked.
            let ask: RangeAsk
            /// The range it writes now.
            var segment: Int
            /// When its last bytes were written, or when a rate limit that holds them back lets
            /// them go, whichever is later: its stall clock runs from there.
            var lastByte: Moment
            /// Whether it wrote a byte in this request.
            var progressed = false
            /// Whether the body must match a `Content-Digest` when it ends: the file is not complete
            /// before that is known.
            var checksBody = false
        }

        /// Why a connection was told to stop.
        enum StopCause: Equatable, Sendable {
            /// Nothing arrived for the stall timeout: the attempt counts as failed.
            case stalled
            /// Another connection took its range.
            case replaced
            /// The download is pausing, restarting, failing or complete.
            case shutdown
        }

        var state: State = .idle
        /// Failed attempts in a row.
        var failures = 0
        /// The serial number of the connection's current request.
        var serial = 0
        /// The source (see ``TransferMachine/sources``) of its current request.
        var source = 0

        /// Whether a request of this connection is under way.
        var isBusy: Bool {
            switch state {
            case .requesting, .queued, .receiving, .stopping: true
            case .idle, .waiting, .retired: false
            }
        }
    }

    /// Whether `request` is its connection's current request (events of earlier ones are late).
    func isCurrent(_ request: RequestTag) -> Bool {
        connections.indices.contains(request.connection) && connections[request.connection].serial == request.serial
    }

    /// The failure of a request the server told to come back (after `retryAfter` seconds, if given).
    static func retryable(status: Int, retryAfter: Int64?) -> TransferFailure {
        let phrase = HTTPResponseStatus(statusCode: status).reasonPhrase
        return .retryable(
            HaulError(.httpStatus, "the server answered \(status) \(phrase)", status: status),
            retryAfter: retryAfter.map { .seconds($0) })
    }

    /// Connections with a request out or an answer arriving.
    var openConnections: Int {
        connections.count { connection in
            switch connection.state {
            case .requesting, .receiving: true
            case .idle, .queued, .waiting, .stopping, .retired: false
            }
        }
    }

    /// The most bytes a connection reads and drops to go on into the next range rather than ask
    /// for it anew: what it receives while a new request waits for its answer, twice over, at least
    /// 1 MiB.
    var skipAllowance: Int64 {
        let receiving = connections.filter { if case .receiving = $0.state { true } else { false } }.count
        let perConnection = (meter?.bytesPerSecond ?? 0) / Double(max(1, receiving))
        return max(1 << 20, Int64(min(2 * answerDelay.seconds * perConnection, Double(Int64.max / 2))))
    }

    /// Whether a connection delivers bytes (or has left): what the ramp waits for before measuring.
    func delivers(_ connection: Connection) -> Bool {
        switch connection.state {
        case .receiving(let receiving): receiving.progressed
        case .retired: true
        default: false
        }
    }

    /// Whether other connections can finish the download if `connection` leaves.
    func othersCanContinue(without connection: Int) -> Bool {
        guard phase.kind == .transferring, rangesAllowed else { return false }
        return connections.indices.contains { index in
            index != connection && index < ramp.allowed && connections[index].state != .retired
        }
    }

    /// When an idle connection could take over a range that made no progress, if one can.
    var nextTakeover: Moment? {
        guard rangesAllowed, let table,
            connections.indices.contains(where: { $0 < ramp.allowed && connections[$0].state == .idle })
        else { return nil }
        // Only a range a connection is fetching can stall; one without a busy owner is claimed as it is.
        return table.segments.filter { segment in
            guard let owner = segment.owner, !segment.isComplete else { return false }
            return connections.indices.contains(owner) && connections[owner].isBusy
        }
        .map { $0.lastProgress + settings.stallTakeover }
        .min()
    }
}

extension TransferMachine.Connection {
    /// Whether the connection waits before its next attempt.
    var isWaiting: Bool {
        if case .waiting = state { true } else { false }
    }
}

extension Manifest {
    /// Forgets the hashes of the pieces that overlap `from..<to`: their bytes are fetched again.
    mutating func forgetPieces(from: Int64, to: Int64) {
        guard pieceSize > 0, from < to else { return }
        let first = Int(from / pieceSize)
        let last = Int(min((to - 1) / pieceSize, Int64(pieces.count - 1)))
        guard first <= last else { return }
        for index in first...last { pieces[index] = nil }
    }
}
