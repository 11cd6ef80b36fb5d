import Dispatch

/// The definitions of the records one commit inserts, encoded
/// (``StoredDownload/encodeDefinition(_:)``) on another thread while the rows go in, in order: a
/// long add spent a third as long encoding them as inserting them, with the second core idle.
///
/// ``take(_:)`` is called for the records in order, each once, by the thread that inserts them.
final class EncodedDefinitions: @unchecked Sendable {
    /// Fewer records than this are encoded as they are inserted: handing them over costs more.
    static let handedOverFrom = 64
    /// How many definitions are handed over at once.
    static let block = 128

    /// One slot for each record, written by the encoding thread before it signals ``ready`` for
    /// the block, read by the inserting thread after its wait for it; `nil` when not handed over.
    private let slots: UnsafeMutableBufferPointer<Result<String, any Error>>?
    private let ready = DispatchSemaphore(value: 0)

    /// Starts encoding the definitions of `records` on another thread, when there are enough.
    init(of records: [StoredDownload]) {
        guard records.count >= Self.handedOverFrom else {
            slots = nil
            return
        }
        let slots = UnsafeMutableBufferPointer<Result<String, any Error>>.allocate(capacity: records.count)
        self.slots = slots
        // The closure holds `self`: the slots outlive the encoding, even when the inserts stop early.
        DispatchQueue.global().async {
            guard let slots = self.slots else { return }
            for start in stride(from: 0, to: records.count, by: Self.block) {
                for index in start..<min(records.count, start + Self.block) {
                    slots.initializeElement(
                        at: index, to: Result { try StoredDownload.encodeDefinition(records[index].definition) })
                }
                self.ready.signal()
            }
        }
    }

    deinit {
        // Every slot was written: the encoding thread held this object until it was done.
        if let slots {
            _ = slots.deinitialize()
            slots.deallocate()
        }
    }

    /// The definition of the record at `index`, once it is encoded; `nil` when the records were
    /// too few to hand over (the caller encodes it).
    func take(_ index: Int) throws -> String? {
        guard let slots else { return nil }
        if index % Self.block == 0 { ready.wait() }
        return try slots[index].get()
    }
}
