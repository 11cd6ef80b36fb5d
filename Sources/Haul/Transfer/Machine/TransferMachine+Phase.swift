/// The phases a download goes through, and what each holds.
extension TransferMachine {
    /// The phases of a download, each with what holds only while the download is in it.
    enum Phase: Sendable {
        /// Nothing has happened yet.
        case created
        /// The stored bytes of a resumed download are being checked.
        case resuming
        /// The first request is out: what the file is, and whether it comes in ranges, is not known.
        case probing
        /// The first answer arrived; the destination it names is being opened, the answer held.
        case choosingDestination(FirstAnswer)
        /// Connections fetch the ranges.
        case transferring
        /// Connections are stopping; then the download goes on as `then` says.
        case stopping(then: AfterStop)
        /// The partial data is being discarded, for this reason; then the download starts over, or
        /// pauses when the caller cancelled it while it could not stop (`thenPause`).
        case restarting(RestartReason, thenPause: Bool)
        /// The complete file is being checked; with `thenPause`, the caller cancelled meanwhile, and
        /// the download pauses once the check is over.
        case verifying(thenPause: Bool)
        /// The complete file failed its check: a piece of what each mirror wrote is being fetched
        /// again from the origin and compared with the disk, to tell which mirror served other bytes.
        case checkingMirrors(MirrorChecks)
        /// The complete file is being renamed into place.
        case finishing
        /// The last checkpoint of a cancelled download is being stored.
        case pausing
        /// The last checkpoint of a download failing with this error is being stored.
        case failing(HaulError)
        /// Cancelled; the data and its manifest are kept.
        case paused
        /// Failed with this error; the data and its manifest are kept.
        case failed(HaulError)
        /// The file is complete under its final name.
        case completed

        /// Whether the download is over.
        var isTerminal: Bool {
            switch self {
            case .paused, .failed, .completed: true
            default: false
            }
        }

        /// A phase without its details: one case for every phase, and for every course a stop can
        /// take. Iterable, so that a test can go through every phase there is.
        enum Kind: CaseIterable, Sendable {
            /// ``Phase/created``.
            case created
            /// ``Phase/resuming``.
            case resuming
            /// ``Phase/probing``.
            case probing
            /// ``Phase/choosingDestination(_:)``.
            case choosingDestination
            /// ``Phase/transferring``.
            case transferring
            /// ``Phase/stopping(then:)`` to restart.
            case stoppingToRestart
            /// ``Phase/stopping(then:)`` to verify.
            case stoppingToVerify
            /// ``Phase/stopping(then:)`` to pause.
            case stoppingToPause
            /// ``Phase/stopping(then:)`` to fail.
            case stoppingToFail
            /// ``Phase/restarting(_:thenPause:)``.
            case restarting
            /// ``Phase/verifying(thenPause:)``.
            case verifying
            /// ``Phase/checkingMirrors(_:)``.
            case checkingMirrors
            /// ``Phase/finishing``.
            case finishing
            /// ``Phase/pausing``.
            case pausing
            /// ``Phase/failing(_:)``.
            case failing
            /// ``Phase/paused``.
            case paused
            /// ``Phase/failed(_:)``.
            case failed
            /// ``Phase/completed``.
            case completed
        }

        /// The phase without its details.
        var kind: Kind {
            switch self {
            case .created: .created
            case .resuming: .resuming
            case .probing: .probing
            case .choosingDestination: .choosingDestination
            case .transferring: .transferring
            case .stopping(then: .restart): .stoppingToRestart
            case .stopping(then: .verify): .stoppingToVerify
            case .stopping(then: .pause): .stoppingToPause
            case .stopping(then: .fail): .stoppingToFail
            case .restarting: .restarting
            case .verifying: .verifying
            case .checkingMirrors: .checkingMirrors
            case .finishing: .finishing
            case .pausing: .pausing
            case .failing: .failing
            case .paused: .paused
            case .failed: .failed
            case .completed: .completed
            }
        }
    }

    /// The first accepted answer of a download whose destination it names, held while the
    /// destination is opened.
    struct FirstAnswer: Sendable {
        /// The connection the answer came on.
        let connection: Int
        /// What the request asked.
        let ask: RangeAsk
        /// The answer's head.
        let head: ResponseHead
        /// What the classifier found in it.
        let facts: ResponseFacts
    }

    /// What a download does once its connections have stopped.
    enum AfterStop: Sendable {
        /// Discard the partial data and start over, for this reason (or pause once it is discarded,
        /// when the caller cancelled the download while its file was checked).
        case restart(RestartReason, thenPause: Bool)
        /// Check the complete file.
        case verify
        /// Store the last checkpoint and pause.
        case pause
        /// Store the last checkpoint and fail with this error.
        case fail(HaulError)

        /// Which of two stops wins: a pause wins over everything, a failure over a restart, a
        /// restart over completion. Of two equal ones, the first stays (the first error is the one
        /// the caller hears about).
        var rank: Int {
            switch self {
            case .verify: 0
            case .restart: 1
            case .fail: 2
            case .pause: 3
            }
        }
    }
}
