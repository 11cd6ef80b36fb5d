import Dispatch
import Synchronization

/// The definitions of the records one commit inserts, encoded
/// (``StoredDownload/encodeDefinition(_:)``) on another thread while the rows go in, in order: a
/// long add spent a third as long encoding them as inserting them, with the second core idle.
///
/// The records are encoded in blocks, each claimed by whichever thread comes to it first: the
/// helper thread from the first block on, the inserting thread when it needs a block nobody has
/// claimed yet. So the inserting thread (a task's, which must not wait on work that has not
/// started) only ever waits for a block that is being encoded.
///
/// ``take(_:)`` is called for the records in order, each once, by the thread that inserts them.
/// None is made for a commit of fewer than ``handedOverFrom`` new records (every progress commit
/// of a running queue): those are encoded as they are inserted.
final class EncodedDefinitions: @unchecked Sendable {
    /// Fewer records than this are encoded as they are inserted: handing them over costs more.
    static let handedOverFrom = 64
    /// How many definitions are encoded and handed over at once.
    static let block = 128

    private let records: [StoredDownload]
    /// One slot for each record, written by the thread that claimed its block before it signals
    /// the block's semaphore, read by the inserting thread after its wait for it.
    private let slots: UnsafeMutableBufferPointer<Result<String, any Error>>
    /// Signalled once when a block's slots are written.
    private let encoded: [DispatchSemaphore]
    /// The blocks claimed so far, in order.
    private let claimed = Atomic<Int>(0)

    /// Starts encoding the definitions of `records` on another thread; `nil` when they are too few.
    init?(of records: [StoredDownload]) {
        guard records.count >= Self.handedOverFrom else { return nil }
        self.records = records
        slots = .allocate(capacity: records.count)
        encoded = (0..<(records.count + Self.block - 1) / Self.block).map { _ in DispatchSemaphore(value: 0) }
        // The closure holds `self`: the slots outlive the encoding, even when the inserts stop early.
        DispatchQueue.global().async {
            while self.encodeNextBlock() {}
        }
    }

    deinit {
        // Every block was claimed and written: the helper claims blocks until none is left, and
        // holds this object until then.
        _ = slots.deinitialize()
        slots.deallocate()
    }

    /// The definition of the record at `index`, once it is encoded.
    func take(_ index: Int) throws -> String {
        if index % Self.block == 0 {
            let block = index / Self.block
            // Encodes the blocks nobody has claimed yet, up to this one, rather than wait for them.
            while claimed.load(ordering: .acquiring) <= block, encodeNextBlock() {}
            encoded[block].wait()
        }
        return try slots[index].get()
    }

    /// Claims the next block and encodes it; false when every block is claimed.
    private func encodeNextBlock() -> Bool {
        let block = claimed.add(1, ordering: .acquiringAndReleasing).oldValue
        guard block < encoded.count else { return false }
        for index in block * Self.block..<min(records.count, (block + 1) * Self.block) {
            slots.initializeElement(
                at: index, to: Result { try StoredDownload.encodeDefinition(records[index].definition) })
        }
        encoded[block].signal()
        return true
    }
}
