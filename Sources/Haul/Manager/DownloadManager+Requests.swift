/// Pausing, cancelling or removing a download that another process's manager runs: the request is
/// written into the download's record, that manager carries it out within a
/// ``DownloadManager/Configuration/stateUpdateInterval`` and clears it, and the asking side waits for
/// the record to show the result.
extension DownloadManager {
    /// Asks the live manager of another process that owns `id` to stop it; returns `false` when no
    /// other live manager owns it (the caller then acts itself).
    func askOwner(_ id: DownloadID, _ reason: StopReason, timeout: Duration = .seconds(30)) async throws -> Bool {
        try learn(id)
        guard let entry = entries[id], let owner = entry.record.owner, owner != claim.name, claim.isAlive(owner)
        else { return false }
        let answer = try await askOwners([(id, owner)], reason, timeout: timeout)
        guard answer.unanswered.isEmpty else {
            throw HaulError(
                .locked,
                "haul process (\(claim.describe(owner))) did not \(reason.request.verb) download \(id) in time")
        }
        return answer.actHere.isEmpty
    }

    /// What the owners asked by ``askOwners(_:_:timeout:)`` came to.
    struct OwnersAnswer {
        /// Downloads this manager acts on itself: their owner let go of them, or died before it
        /// answered (they are nobody's now).
        var actHere: [DownloadID] = []
        /// Downloads whose owner did not answer in time; the request was withdrawn.
        var unanswered: [DownloadID] = []
    }

    /// Writes `reason`'s request into the record of each download while its owner (a live manager
    /// of another process or worker) still owns it, and waits until each owner has carried it out
    /// at its next tick, is gone, or `timeout` has passed.
    func askOwners(
        _ downloads: [(id: DownloadID, owner: String)], _ reason: StopReason, timeout: Duration = .seconds(30)
    ) async throws -> OwnersAnswer {
        var answer = OwnersAnswer()
        var asked: [DownloadID: String] = [:]
        for (id, owner) in downloads {
            if claim.isAlive(owner), try store.setRequest(reason.request, for: id, ifOwnedBy: owner) {
                asked[id] = owner
            } else {
                // The owner let go of it meanwhile.
                try reload(id)
                answer.actHere.append(id)
            }
        }
        let deadline = clock.now + timeout
        while !asked.isEmpty && clock.now < deadline {
            try await clock.sleep(for: .milliseconds(50))
            for (id, owner) in asked {
                guard let record = try store.download(id) else {
                    asked[id] = nil
                    entries[id] = nil
                    continue
                }
                if record.request == nil {
                    asked[id] = nil
                    try reload(id, stored: record)
                } else if !claim.isAlive(owner) {
                    asked[id] = nil
                    try store.clearRequest(for: id)
                    try reload(id)
                    answer.actHere.append(id)
                }
            }
        }
        for id in asked.keys { try store.clearRequest(for: id) }
        answer.unanswered = Array(asked.keys)
        return answer
    }

    /// Carries out the requests other processes wrote for downloads this manager owns.
    func applyRequests() async {
        let owner = claim.name
        let pending = (try? store.pendingRequests(for: owner)) ?? []
        for (id, request) in pending {
            switch request {
            case .pause: _ = try? await pause(id)
            case .cancel: try? await cancel(id)
            case .remove: try? await remove(id, deletingFiles: false)
            case .removeFiles: try? await remove(id, deletingFiles: true)
            }
            // The outcome is written first (a download that stopped saves its state with the next
            // group commit): the asking side reads it from the record once the request is cleared.
            writeWaiting()
            // Cleared in any case, so the asking side stops waiting.
            try? store.clearRequest(for: id)
        }
    }

    /// Replaces the in-memory entry with the stored record (`stored`, when the caller just read
    /// it); a download whose owner died comes back queued (or as it was, when it was not running)
    /// and nobody's. A record no live manager owns is made to agree with the disk as it is read
    /// (a finished file that vanished, a partial file that moved on or went), unless this manager
    /// holds it already.
    func reload(_ id: DownloadID, stored: StoredDownload? = nil) throws {
        var folders = OpenFolders(confinement: confinement)
        try reload(id, stored: stored, folders: &folders)
    }

    /// ``reload(_:stored:)`` looking at the disk through `folders`: downloads reloaded one after
    /// another open their directory once.
    func reload(_ id: DownloadID, stored: StoredDownload?, folders: inout OpenFolders) throws {
        guard var record = try stored ?? store.download(id) else {
            entries[id] = nil
            return
        }
        let original = record
        if let owner = record.owner, owner != claim.name, !claim.isAlive(owner) {
            record.owner = nil
            if record.state == .running { try record.move(to: .queued, at: Self.now) }
            Self.refreshFromDisk(&record, folders: &folders)
        } else if entries[id] == nil, record.owner == nil || record.owner == claim.name, record.state != .running {
            Self.refreshFromDisk(&record, folders: &folders)
        }
        if record != original {
            record.updatedAt = Self.now
            try write([record])
        }
        var entry = entries[id] ?? Entry(record: record)
        record.keepSecrets(of: entry.record)
        entry.record = record
        entries[id] = entry
    }
}

extension DownloadManager.StopReason {
    /// What the record's `request` column asks for this reason.
    var request: OwnerRequest {
        switch self {
        case .pause: .pause
        case .cancel: .cancel
        case .remove(let deletingFiles): deletingFiles ? .removeFiles : .remove
        // A worker's own: never asked of another.
        case .leaseLost, .outsideStartWindow: .pause
        }
    }
}

extension OwnerRequest {
    /// The request as a verb, for messages.
    var verb: String { self == .removeFiles ? "remove" : rawValue }
}
