import ArgumentParser
import Haul
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Runs downloads of a manager until they are all over, showing their progress; Ctrl-C or SIGTERM
/// stops them with a checkpoint. Shared by `get`, `resume` and `retry`.
enum QueueRun {
    /// Opens the manager on the state directory.
    static func openManager(
        _ state: StateOptions, _ transfer: TransferOptions, restoring: DownloadManager.Configuration.RestoredDownloads,
        verbose: Bool = false
    ) throws -> DownloadManager {
        try DownloadManager(
            stateDirectory: state.directory, configuration: transfer.managerConfiguration(restoring: restoring),
            downloaderConfiguration: transfer.downloaderConfiguration,
            logger: VerboseLogHandler.logger(verbose: verbose))
    }

    /// Runs `ids` to their end and exits with the documented code: 0 when every download is saved,
    /// else the code of the first one that is not.
    static func run(_ manager: DownloadManager, _ ids: [DownloadID], output: OutputOptions) async throws -> Never {
        let style: ProgressRenderer.Style
        if output.json {
            style = .json
        } else if output.quiet {
            style = .quiet
        } else {
            // A bar redrawn in place would tear the lines --verbose prints between its frames.
            style = isatty(STDERR_FILENO) != 0 && !output.verbose ? .terminal : .lines
        }
        var infos: [DownloadInfo] = []
        for id in ids {
            if let info = await manager.download(id) { infos.append(info) }
        }
        let single = infos.count == 1 ? ProgressRenderer(style: style, url: infos[0].url) : nil
        let queue = QueueRenderer(style: style, downloads: infos)
        if let single, infos[0].state == .completed {
            if style == .terminal || style == .lines {
                single.note("\(infos[0].destination ?? infos[0].name) is already complete")
            }
        }
        let events = manager.events()
        let signals = SignalWatcher(signals: [SIGINT, SIGTERM])
        let completion = CompletionBox()
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for await event in events {
                    guard let single else {
                        queue.handle(event)
                        continue
                    }
                    guard event.download.id == ids[0] else { continue }
                    switch event.kind {
                    case .transfer(let transfer):
                        single.handle(transfer)
                        if case .completed(let result) = transfer { completion.set(result) }
                    case .stateChanged where event.download.state == .paused && event.download.error != nil:
                        single.note("paused: \(event.download.error!.message); continues once there is room")
                    default:
                        break
                    }
                }
            }
            group.addTask {
                await withTaskGroup(of: Void.self) { runner in
                    runner.addTask { await manager.runUntilIdle() }
                    runner.addTask { await signals.next() }
                    // Whichever ends first: the queue ran out, or a signal asks to stop (cancelling
                    // checkpoints every running download before `runUntilIdle` returns).
                    await runner.next()
                    runner.cancelAll()
                }
                await manager.close()
            }
        }
        signals.stop()
        let interrupted = signals.received
        var final: [DownloadInfo] = []
        for id in ids {
            if let info = await manager.download(id) { final.append(info) }
        }
        if let single {
            let info = final.first
            if let result = completion.result {
                single.finish(result)
            } else if info?.state != .completed {
                single.fail(
                    interrupted != nil || info?.state == .queued
                        ? HaulError.interrupted : info?.error ?? HaulError.interrupted)
            }
        } else {
            queue.finish(interrupted: interrupted != nil)
        }
        if let interrupted {
            throw ExitCode(interrupted == SIGTERM ? ExitCodes.terminated : ExitCodes.interrupted)
        }
        for info in final where info.state != .completed {
            throw ExitCode(info.error.map { ExitCodes.code(for: $0.code) } ?? ExitCodes.unexpected)
        }
        throw ExitCode.success
    }
}

extension HaulError {
    static var interrupted: HaulError { HaulError(.cancelled, "stopped before the download finished") }
}

/// The result of a single download, handed from the event task to the end of the run.
private final class CompletionBox: Sendable {
    private let value = Mutex<DownloadResult?>(nil)
    var result: DownloadResult? { value.withLock { $0 } }
    func set(_ result: DownloadResult) { value.withLock { $0 = result } }
}
