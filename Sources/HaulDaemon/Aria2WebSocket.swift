import HTTPTypes
import Haul
import HummingbirdWebSocket
import NIOCore

/// aria2's interface over a WebSocket on `/jsonrpc`: calls answered as over HTTP, and the
/// notifications of the downloads' changes (`aria2.onDownloadStart`, …), which carry a GID only.
extension Aria2RPC {
    /// The WebSocket for a request to open one on ``path`` that the access rules let through
    /// (a page of another site cannot open one), while fewer than the daemon's cap of WebSockets
    /// are open; anything else is answered as HTTP.
    func upgrade(_ head: HTTPRequest, rules: AccessRules, connections: ConnectionLedger)
        -> ShouldUpgradeResult<WebSocketDataHandler<HTTP1WebSocketUpgradeChannel.Context>>
    {
        guard head.path?.split(separator: "?").first.map(String.init) == Self.path,
            rules.refusal(of: head, changesState: true) == nil,
            connections.openWebSockets < connections.limits.maximumWebSockets
        else { return .dontUpgrade }
        let maxMessageBytes = rules.maxBodyBytes
        return .upgrade([:]) { inbound, outbound, _ in
            try await serve(inbound, outbound, maxMessageBytes: maxMessageBytes)
        }
    }

    /// Answers the client's calls and sends it the notifications, until either side closes.
    private func serve(_ inbound: WebSocketInboundStream, _ outbound: WebSocketOutboundWriter, maxMessageBytes: Int)
        async throws
    {
        // A client that stops reading loses the oldest of what it has not read, not the daemon's memory.
        let events = manager.events(keepingNewest: Self.notificationBuffer)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                var notifier = Aria2Notifier()
                for await event in events {
                    guard let text = notifier.notification(for: event) else { continue }
                    try await outbound.write(.text(text))
                }
            }
            for try await message in inbound.messages(maxSize: maxMessageBytes) {
                let body: ByteBuffer
                switch message {
                case .text(let text): body = ByteBuffer(string: text)
                case .binary(let buffer): body = buffer
                }
                let answer = try JSONBody.encode(await answer(body).body)
                try await outbound.write(.text(String(buffer: answer)))
            }
            group.cancelAll()
        }
    }
}

extension Aria2RPC {
    /// Events held for a WebSocket client that has not read them.
    static let notificationBuffer = 1024
}

/// Turns the queue's events into aria2's notifications: one for each change of a download's state
/// that aria2 tells (a download that starts, pauses, is removed, completes or fails).
struct Aria2Notifier {
    /// The last notification sent for each download, so that a state written again is not told
    /// twice.
    private var told: [DownloadID: String] = [:]

    mutating func notification(for event: DownloadManagerEvent) -> String? {
        let id = event.download.id
        guard case .stateChanged = event.kind else {
            if case .removed = event.kind { told[id] = nil }
            return nil
        }
        let method: String
        switch event.download.state {
        case .running: method = "aria2.onDownloadStart"
        case .paused: method = "aria2.onDownloadPause"
        case .cancelled: method = "aria2.onDownloadStop"
        case .completed: method = "aria2.onDownloadComplete"
        case .failed: method = "aria2.onDownloadError"
        case .queued:
            told[id] = nil
            return nil
        }
        guard told[id] != method else { return nil }
        // Held for downloads seen on this connection; a long one starts over (at worst a state is told twice).
        if told.count >= 100_000 { told.removeAll() }
        told[id] = method
        return "{\"jsonrpc\":\"2.0\",\"method\":\"\(method)\",\"params\":[{\"gid\":\"\(Aria2RPC.gid(id))\"}]}"
    }
}
