import Dispatch
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Turns SIGINT and SIGTERM into an awaitable event, so the download can be paused (and checkpointed)
/// instead of the process dying mid-write. A second signal exits at once.
final class SignalWatcher: Sendable {
    /// What the signal handlers share with the waiting task.
    private final class Inbox: Sendable {
        struct State {
            var received: Int32?
            var waiter: CheckedContinuation<Void, Never>?
        }

        let state = Mutex(State())

        func deliver(_ number: Int32) {
            let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                if state.received != nil {
                    // A second signal: the user insists.
                    _exit(number == SIGTERM ? ExitCodes.terminated : ExitCodes.interrupted)
                }
                state.received = number
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume()
        }

        func takeWaiter() -> CheckedContinuation<Void, Never>? {
            state.withLock { state in
                defer { state.waiter = nil }
                return state.waiter
            }
        }
    }

    private let inbox = Inbox()
    private let sources: Mutex<[any DispatchSourceSignal]>

    init(signals: [Int32]) {
        let inbox = self.inbox
        var sources: [any DispatchSourceSignal] = []
        for number in signals {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { inbox.deliver(number) }
            source.resume()
            sources.append(source)
        }
        self.sources = Mutex(sources)
    }

    /// The first signal received, if any.
    var received: Int32? { inbox.state.withLock { $0.received } }

    /// Returns when a signal arrives, or when the calling task is cancelled.
    func next() async {
        let inbox = self.inbox
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let resumeNow = inbox.state.withLock { state -> Bool in
                    if state.received != nil || Task.isCancelled { return true }
                    state.waiter = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            inbox.takeWaiter()?.resume()
        }
    }

    func stop() {
        sources.withLock { sources in
            for source in sources { source.cancel() }
            sources = []
        }
    }
}
