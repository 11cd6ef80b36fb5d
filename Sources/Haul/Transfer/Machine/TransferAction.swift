/// What the ``TransferMachine`` asks its I/O shell to do.
enum TransferAction: Sendable {
    // The disk.
    /// Check the stored bytes of a resumed download: the manifest's segments say what may be trusted;
    /// cut the partial file to it (one range) and re-check the last recorded piece of every range.
    case checkStoredData(Manifest)
    /// Name and open the destination from the answer `connection` received.
    case chooseDestination(connection: Int)
    /// Make the partial file ready for the bytes to come.
    case prepareFile(FilePreparation)
    /// Record progress in the manifest (a durable checkpoint flushes the data first), beside the
    /// transfer: ``TransferEvent/checkpointed(pieces:)`` tells when it is stored.
    case checkpoint(Checkpoint)
    /// Store the last checkpoint of a download that pauses or fails, after the one in flight: the
    /// download waits for it (``TransferEvent/checkpointed(pieces:)``) before it is over.
    case lastCheckpoint(Checkpoint)
    /// Cut the partial file (written in order) back to this length: what follows is not kept.
    case cut(to: Int64)
    /// Delete the partial data and the manifest: the download starts over.
    case discard
    /// The bytes from this offset on will be written again: hashes kept of them no longer hold.
    case forgetHashes(from: Int64)
    /// Check the complete file against the expected checksums.
    case verify(totalBytes: Int64, validator: ResourceValidator)
    /// Give the complete file its final name, and remove its manifest (`nil` when none was stored).
    case finish(totalBytes: Int64, manifest: Manifest?)

    // The network.
    /// Send `ask` on the request's connection.
    case send(RequestTag, RangeAsk)
    /// Write the body of the answer `connection` received.
    case receive(connection: Int, ReceivePlan)
    /// Close the answer `connection` received without writing it.
    case drop(connection: Int)
    /// Stop `connection`'s request or transfer now.
    case abandon(connection: Int)
    /// The range `connection` writes now ends here.
    case setLimit(connection: Int, Int64)
    /// The answer to `connection` reaching its limit: go on into another range, or stop (`nil`).
    case proceed(connection: Int, Continuation?)

    // The caller.
    /// The download (re)starts transferring.
    case started(StartFacts)
    /// Tell the caller.
    case report(DownloadEvent)
    /// A line for the debug log.
    case log(String)
    /// The download is over, as the outcome says: the machine takes no more events.
    case end(TransferOutcome)
}

/// What the machine answers to one event.
struct TransferStep: Sendable {
    /// What the shell must do, in order.
    var actions: [TransferAction]
    /// When the machine next needs a ``TransferEvent/timer`` event, if ever.
    var deadline: Moment?
}

/// How a download ended.
enum TransferOutcome: Sendable {
    /// The file is complete under its final name.
    case completed(TransferSummary)
    /// The caller cancelled it; the data and its manifest are kept.
    case paused
    /// It failed with this error; the data and its manifest are kept.
    case failed(HaulError)
}

/// What a completed download did.
struct TransferSummary: Equatable, Sendable {
    /// The file's length.
    let totalBytes: Int64
    /// The bytes kept from earlier sessions.
    let resumedFrom: Int64
    /// Restarts from byte 0 in this call.
    let restarts: Int
    /// What identifies the version of the file that was fetched.
    let validator: ResourceValidator
}

/// How to make the partial file ready for the bytes to come.
struct FilePreparation: Sendable {
    /// The manifest the data will belong to.
    let manifest: Manifest
    /// The answer replaces whatever is stored: empty the partial file first.
    let startsOver: Bool
    /// The manifest records a new layout of ranges that must be on disk before any byte is written
    /// out of order.
    let storesLayout: Bool
    /// The bytes still to come, which the volume must have room for.
    let neededBytes: Int64?
    /// Space to reserve: the file's length, from which offset, over how many ranges.
    let reservation: (totalLength: Int64, from: Int64, ranges: Int)?
}

/// A checkpoint: the manifest as it stands, stored (after a flush of the data, when durable).
struct Checkpoint: Sendable {
    /// The manifest to store.
    let manifest: Manifest
    /// Whether the data is flushed to the disk before the manifest is stored.
    let durable: Bool
}

/// How to write the body of an accepted answer.
struct ReceivePlan: Equatable, Sendable {
    /// The range the bytes belong to.
    let segment: Int
    /// The offset of the first body byte.
    let bodyStart: Int64
    /// Body bytes before this offset are compared with the disk, not written.
    let writeStart: Int64
    /// Where the range ends now: the connection stops there (it may move, see ``TransferAction/setLimit(connection:_:)``).
    let limit: Int64
    /// Where the body ends (the end asked for, or of the file); `nil` when not known.
    let answerEnd: Int64?
    /// Digests the whole body must match (`Content-Digest`).
    let contentDigests: [Checksum]
    /// The size of the pieces hashed as the body is written (the manifest's).
    let pieceSize: Int64
}

/// Going on from the end of one range into the next: write range `segment` from `skipTo` up to
/// `limit`, passing over the answer's bytes before `skipTo` (they are already stored).
struct Continuation: Equatable, Sendable {
    let segment: Int
    let skipTo: Int64
    let limit: Int64
}

/// What is known when a download starts transferring.
struct StartFacts: Equatable, Sendable {
    let url: String
    let totalBytes: Int64?
    let resumedFrom: Int64
    let resumable: Bool
    let validator: ResourceValidator
}
