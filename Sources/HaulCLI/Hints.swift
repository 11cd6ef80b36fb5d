import Haul
import HaulDaemon

/// What `haul` adds to the library's messages: the option that helps, where one does. The library
/// describes what happened; only the command line knows its own options.
extension HaulError {
    /// The message, with a hint naming the option that helps.
    var messageWithHint: String {
        switch code {
        // The partial data of another URL's download is in the way of the name the server chose.
        case .destinationExists where message.contains(" belongs to a download of "):
            "\(message) (-o NAME names the file)"
        case .destinationExists:
            "\(message); use --force to replace it once the new download is complete"
        case .httpStatus where status == 401:
            "\(message); the server wants credentials: give them with -u USER:PASSWORD or --netrc (haul never "
                + "stores them, so a resume needs them again)"
        case .credentialsForRemoteDaemon:
            "\(message); add --no-daemon to download in this process"
        case .outsideDownloadRoot:
            "\(message); give the haul daemon a --download-root that holds it, or add --no-daemon to download "
                + "in this process"
        default:
            message
        }
    }
}

extension RestartReason {
    /// The reason, with a hint naming the option that helps.
    var descriptionWithHint: String {
        self == .unvalidated ? "\(description) (allow an unchecked resume with --trust-unvalidated)" : description
    }
}
