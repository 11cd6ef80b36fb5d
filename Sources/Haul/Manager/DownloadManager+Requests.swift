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
        let request = reason.request
        // The owner let go of it meanwhile: act here.
        guard try store.setRequest(request, for: id, ifOwnedBy: owner) else {
            try reload(id)
            return false
        }
        let deadline = clock.now + timeout
        while clock.now < deadline {
            try await clock.sleep(for: .milliseconds(50))
            guard let record = try store.download(id) else {
                entries[id] = nil
                return true
            }
            if record.request == nil {
                try reload(id)
                return true
            }
            if !claim.isAlive(owner) {
                // The owner died before answering: the download is nobody's now, so act here.
                try store.clearRequest(for: id)
                try reload(id)
                return false
            }
        }
        try store.clearRequest(for: id)
        throw HaulError(
            .locked,
            "haul process (\(claim.describe(owner))) did not \(request.verb) download \(id) in time")
    }

    /// Asks the owners of many downloads at once (see ``askOwner(_:_:timeout:)``) and waits until
    /// each has answered, its owner is gone, or `timeout` has passed; a download whose owner is gone
    /// is stopped here.
    func askOwners(
        _ downloads: [(id: DownloadID, owner: String)], _ reason: StopReason, timeout: Duration = .seconds(30)
    ) async {
        var asked: [DownloadID: String] = [:]
        for (id, owner) in downloads {
            if claim.isAlive(owner), (try? store.setRequest(reason.request, for: id, ifOwnedBy: owner)) == true {
                asked[id] = owner
            } else {
                _ = try? await pauseOrStop(id, reason)
            }
        }
        let deadline = clock.now + timeout
        while !asked.isEmpty && clock.now < deadline {
            guard (try? await clock.sleep(for: .milliseconds(50))) != nil else { break }
            for (id, owner) in asked {
                let record = try? store.download(id)
                if record?.request != nil && claim.isAlive(owner) { continue }
                asked[id] = nil
                if record == nil { entries[id] = nil } else { try? reload(id, stored: record) }
                // The owner died before it answered: the download is nobody's now, so act here.
                if record?.request != nil {
                    try? store.clearRequest(for: id)
                    _ = try? await pauseOrStop(id, reason)
                }
            }
        }
        // Not answered in time: the request is withdrawn, as for one download.
        for id in asked.keys { try? store.clearRequest(for: id) }
    }

    /// Carries out `reason` for a download this manager may act on itself.
    private func pauseOrStop(_ id: DownloadID, _ reason: StopReason) async throws {
        switch reason {
        case .pause, .leaseLost: _ = try await pause(id)
        case .cancel: try await cancel(id)
        case .remove(let deletingFiles): try await remove(id, deletingFiles: deletingFiles)
        }
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
        guard var record = try stored ?? store.download(id) else {
            entries[id] = nil
            return
        }
        let original = record
        if let owner = record.owner, owner != claim.name, !claim.isAlive(owner) {
            record.owner = nil
            if record.state == .running { try record.move(to: .queued, at: Self.now) }
            Self.refreshFromDisk(&record, confinement: confinement)
        } else if entries[id] == nil, record.owner == nil || record.owner == claim.name, record.state != .running {
            Self.refreshFromDisk(&record, confinement: confinement)
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
        case .leaseLost: .pause
        }
    }
}

extension OwnerRequest {
    /// The request as a verb, for messages.
    var verb: String { self == .removeFiles ? "remove" : rawValue }
}
