/// When a failed attempt is tried again: one rule for every connection of every download.
///
/// Delays grow exponentially from ``DownloaderConfiguration/Retry/initialDelay`` up to
/// ``DownloaderConfiguration/Retry/maximumDelay``, spread by jitter; a `Retry-After` from the server
/// is honoured, but never beyond ``DownloaderConfiguration/Retry/maximumRetryAfter``.
struct RetryPolicy: Sendable {
    /// What to do after a failure.
    enum Decision: Equatable, Sendable {
        /// Try again after this delay.
        case retry(after: Duration)
        /// The failures in a row passed the limit.
        case exhausted(retries: Int)
        /// The server asked for a wait longer than allowed.
        case waitTooLong(Duration)
    }

    let maximumRetries: Int
    let initialDelay: Duration
    let maximumDelay: Duration
    let jitter: Bool
    let maximumRetryAfter: Duration
    let retriesRefusedConnections: Bool

    init(_ retry: DownloaderConfiguration.Retry) {
        maximumRetries = retry.maximumRetries
        initialDelay = retry.initialDelay
        maximumDelay = retry.maximumDelay
        jitter = retry.jitter
        maximumRetryAfter = retry.maximumRetryAfter
        retriesRefusedConnections = retry.retriesRefusedConnections
    }

    /// The decision after `failures` failures in a row, the last of which asked for `retryAfter`.
    /// `random` is a number in `0...1` that spreads the delay when jitter is on.
    func decide(failures: Int, retryAfter: Duration?, random: Double) -> Decision {
        if let retryAfter, retryAfter > maximumRetryAfter { return .waitTooLong(retryAfter) }
        guard failures <= maximumRetries else { return .exhausted(retries: maximumRetries) }
        if let retryAfter { return .retry(after: retryAfter) }
        var delay = initialDelay * (1 << min(max(failures, 1) - 1, 20))
        if delay > maximumDelay { delay = maximumDelay }
        if jitter { delay = delay / 2 + delay / 2 * min(1, max(0, random)) }
        return .retry(after: delay)
    }

    /// The message of a failure that will not be retried, naming why.
    static func finalError(_ error: HaulError, _ decision: Decision) -> HaulError {
        let message =
            switch decision {
            case .exhausted(let retries): "\(error.message) (gave up after \(retries) retries)"
            case .waitTooLong(let wait):
                "\(error.message) and asked to retry after \(Int(wait.seconds)) s, longer than allowed"
            case .retry: error.message
            }
        return HaulError(error.code, message, status: error.status, underlying: error.underlying)
    }
}
