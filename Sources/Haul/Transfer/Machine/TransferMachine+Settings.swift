extension TransferMachine {
    /// The rules' parameters, from a ``DownloaderConfiguration``.
    struct Settings: Sendable {
        /// The most connections the download uses.
        var connections = 1
        /// Start with one connection and add more only while they add throughput.
        var adaptive = false
        var minimumSplit: Int64 = 1 << 20
        var stallTakeover: Duration = .seconds(3)
        var stallTimeout: Duration = .seconds(30)
        var retry = RetryPolicy(DownloaderConfiguration.Retry())
        var maximumRestarts = 8
        var checkpointInterval: Duration = .seconds(1)
        var durableCheckpointInterval: Duration = .seconds(5)
        var progressInterval: Duration = .milliseconds(200)
        var trustUnvalidatedResume = false
        var overlapCheckBytes = 64 * 1024
        var pieceSize: Int64 = Manifest.defaultPieceSize
        var rampWindow: Duration = .milliseconds(500)
        /// The request gives a checksum the complete file must match (what lets mirrors be mixed).
        var checksumGiven = false

        init() {}

        init(_ configuration: DownloaderConfiguration) {
            connections = max(1, configuration.segmentation.connections)
            adaptive = configuration.segmentation.adaptive
            minimumSplit = configuration.segmentation.minimumSplit
            stallTakeover = configuration.segmentation.stallTakeover
            stallTimeout = configuration.timeouts.stall
            retry = RetryPolicy(configuration.retry)
            maximumRestarts = configuration.retry.maximumRestarts
            checkpointInterval = configuration.storage.checkpointInterval
            durableCheckpointInterval = configuration.storage.durableCheckpointInterval
            progressInterval = configuration.progressInterval
            trustUnvalidatedResume = configuration.trustUnvalidatedResume
            overlapCheckBytes = configuration.overlapCheckBytes
            pieceSize = configuration.storage.pieceSize
            rampWindow = configuration.segmentation.rampWindow
        }

        /// The configuration's parameters, with the request's own connection count (checked by
        /// ``DownloadRequest/check()``) when it gives one: that many, opened at once.
        init(_ configuration: DownloaderConfiguration, request: DownloadRequest) {
            self.init(configuration)
            checksumGiven = request.checksum != nil
            if let own = request.connections {
                connections = own
                adaptive = false
            } else if !request.mirrors.isEmpty {
                // A connection for every mirror at least, all at once.
                connections = min(max(connections, 1 + request.mirrors.count), DownloadRequest.maximumConnections)
                adaptive = false
            }
        }
    }
}

/// A small, fast random number generator (SplitMix64) that a test can seed, for retry jitter.
struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var value = state
        value = (value ^ (value >> 30)) &* 0xBF58_476D_1CE4_E5B9
        value = (value ^ (value >> 27)) &* 0x94D0_49BB_1331_11EB
        return value ^ (value >> 31)
    }

    /// A number in `0...1`.
    mutating func nextUnit() -> Double { Double(next() >> 11) / Double(1 << 53) }
}
