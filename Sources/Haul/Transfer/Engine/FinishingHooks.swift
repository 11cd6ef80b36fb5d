/// What a download's caller (the queue) is told while the download's file is being finished: every
/// byte is written and checked, and what is left is to make it durable and give it its final name
/// (see ``FileFinisher``).
package struct FinishingHooks: Sendable {
    /// Runs once, as the complete file is handed to the finisher, before its data flush. The transfer
    /// is over: a queue starts its next download here instead of waiting for the flush and the rename.
    package var handedOver: @Sendable () async -> Void
    /// Runs once the data is durable, right before the rename, with the file's final path: a queue
    /// records there that the file is its download's own, in one transaction with the files
    /// finishing beside it. (Some downloads reach it without a `started` event: one that finds its
    /// file complete in a partial file another process left.)
    package var beforeRename: @Sendable (_ destination: String) async -> Void

    /// Hooks that run `handedOver` and `beforeRename` (by default, nothing).
    package init(
        handedOver: @escaping @Sendable () async -> Void = {},
        beforeRename: @escaping @Sendable (_ destination: String) async -> Void = { _ in }
    ) {
        self.handedOver = handedOver
        self.beforeRename = beforeRename
    }
}
