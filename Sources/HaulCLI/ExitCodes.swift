import Haul
import HaulDaemon

/// The exit codes `haul` documents (docs/cli.md); scripts may rely on them.
enum ExitCodes {
    static let success: Int32 = 0
    static let unexpected: Int32 = 1
    static let interrupted: Int32 = 130
    static let terminated: Int32 = 143

    static func code(for error: HaulError.Code) -> Int32 {
        switch error {
        case .invalidArgument: 2
        case .invalidURL, .unsupportedScheme: 3
        case .httpStatus: 4
        case .network: 5
        case .timedOut: 6
        case .tls: 7
        case .redirectRefused: 8
        case .protocolViolation, .remoteChanged: 9
        case .insufficientSpace: 10
        case .diskFull: 11
        case .fileSystem: 12
        case .locked: 13
        case .destinationExists: 14
        case .manifestCorrupt: 15
        case .checksumMismatch: 16
        case .unknownDownload: 17
        case .invalidState: 18
        case .database: 19
        case .cancelled: interrupted
        // A haul daemon's refusals of a destination outside its roots or of credentials: bad input.
        case .outsideDownloadRoot, .credentialsForRemoteDaemon: 2
        default: unexpected
        }
    }
}
