extension DownloadManager {
    /// Where the manager is in its life: whether its queue runs, and who runs it; whether a
    /// ``stop()`` is under way; whether it is closed. Each state carries what only it has, so no
    /// impossible mix (closed while running, two queues at once) can be written down, and every
    /// change of state is made here.
    ///
    /// A run that ended (idle or cancelled) goes back to ``idle`` at once, while its downloads may
    /// still be stopping: nothing more starts from it, and another run may begin.
    enum Lifecycle {
        /// Nothing runs the queue.
        case idle
        /// ``start()`` made `owned`, which has not begun to run the queue yet.
        case started(owned: Task<Void, Never>)
        /// A ``run()`` or ``runUntilIdle()`` runs the queue.
        case running(Run)
        /// ``stop()`` is stopping `owned`, the queue ``start()`` ran; `next` is the queue a
        /// ``start()`` made meanwhile, which begins once the stop is over.
        case stopping(owned: Task<Void, Never>, next: Task<Void, Never>?)
        /// ``close()`` was called: nothing runs or is added any more.
        case closed

        /// One run of the queue.
        struct Run {
            /// Receives the downloads to start.
            let starter: AsyncStream<DownloadID>.Continuation
            /// Whether the run ends once nothing of the manager is running, queued or waiting for disk
            /// space (``runUntilIdle()``).
            let stopsWhenIdle: Bool
            /// The task ``start()`` made to run it; `nil` for a caller's ``run()``.
            let owned: Task<Void, Never>?
        }

        /// The current run, while the queue runs.
        var run: Run? {
            if case .running(let run) = self { return run }
            return nil
        }

        /// The task ``start()`` made that runs (or will run) the queue and no ``stop()`` stops yet.
        var owned: Task<Void, Never>? {
            switch self {
            case .started(let owned): owned
            case .running(let run): run.owned
            case .stopping(_, let next): next
            case .idle, .closed: nil
            }
        }

        /// The queue a ``stop()`` is stopping.
        var stopping: Task<Void, Never>? {
            if case .stopping(let owned, _) = self { return owned }
            return nil
        }

        /// Whether ``close()`` was called.
        var isClosed: Bool {
            if case .closed = self { return true }
            return false
        }

        /// Begins a run of the queue and returns the downloads it is to start; `nil` when it must not
        /// begin: the queue already runs or is being stopped, or the manager is closed. A caller's
        /// ``run()`` takes the place of a queue ``start()`` made that has not begun (which then ends at
        /// once); `owned` is that queue's own run, which begins unless a ``stop()`` cancelled it.
        mutating func beginRun(stopsWhenIdle: Bool, owned: Bool) -> AsyncStream<DownloadID>? {
            let task: Task<Void, Never>?
            switch self {
            case .idle where !owned:
                task = nil
            case .started(let waiting) where owned:
                // Cancelled by a stop (or a caller's run) before it began: it ends at once.
                guard !Task.isCancelled else { return nil }
                task = waiting
            case .started(let waiting):
                waiting.cancel()
                task = nil
            case .stopping(_, let next?) where owned && !Task.isCancelled:
                // The queue a start() made while a stop was under way; the stop is over.
                task = next
            case .idle, .running, .stopping, .closed:
                return nil
            }
            let (starts, starter) = AsyncStream<DownloadID>.makeStream()
            self = .running(Run(starter: starter, stopsWhenIdle: stopsWhenIdle, owned: task))
            return starts
        }

        /// Ends the current run: nothing more starts from it. A stop or a close under way stays as it
        /// is.
        mutating func endRun() {
            guard let run else { return }
            run.starter.finish()
            self = .idle
        }

        /// Makes the queue ``start()`` runs, when none runs or is made and the manager is open:
        /// `makeQueue` is given the queue being stopped, which the new one waits for.
        mutating func start(_ makeQueue: (_ after: Task<Void, Never>?) -> Task<Void, Never>) {
            switch self {
            case .idle:
                self = .started(owned: makeQueue(nil))
            case .stopping(let stopped, nil):
                self = .stopping(owned: stopped, next: makeQueue(stopped))
            case .started, .running, .stopping, .closed:
                break
            }
        }

        /// Begins to stop the queue ``start()`` runs and returns its task, which the caller cancels
        /// and waits for; `nil` when there is none (a caller's ``run()`` is not stopped here).
        mutating func beginStop() -> Task<Void, Never>? {
            guard let owned else { return nil }
            // A start() from now on begins once this stop is over.
            self = .stopping(owned: owned, next: nil)
            return owned
        }

        /// The stop of `stopped` is over: the queue a ``start()`` made meanwhile is next, else nothing
        /// runs. A state that moved on meanwhile (that queue began, another stop, a close) stays.
        mutating func endStop(_ stopped: Task<Void, Never>) {
            guard case .stopping(let owned, let next) = self, owned == stopped else { return }
            self = next.map { .started(owned: $0) } ?? .idle
        }

        /// Closes the manager; `false` when it was closed already. A caller's run still under way
        /// starts nothing more and ends once its downloads have stopped.
        mutating func close() -> Bool {
            switch self {
            case .closed:
                return false
            case .running(let run):
                run.starter.finish()
            case .started(let owned), .stopping(_, let owned?):
                owned.cancel()
            case .idle, .stopping:
                break
            }
            self = .closed
            return true
        }
    }
}
