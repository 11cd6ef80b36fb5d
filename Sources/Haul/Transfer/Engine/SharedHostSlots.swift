/// Places on remote hosts shared by several downloaders, each on its own machine (a fleet's
/// workers): at most ``limit`` connections to one host over all of them. A request takes a place
/// before it is sent and gives it back once its answer is read; the downloader then keeps its
/// connection open at most ``idleTimeout``, so an implementation holds each place given back at
/// least that long before another downloader may take it (or takes it again for its own next
/// request to the host).
package protocol SharedHostSlots: Sendable {
    /// The most connections to one host, over every downloader sharing the places.
    var limit: Int { get }
    /// How long this downloader keeps an idle connection to a host open.
    var idleTimeout: Duration { get }
    /// Takes a place on `host` (scheme, name and port), waiting while there is none; `waiting` is
    /// called before it waits.
    /// - Throws: `CancellationError` when the task is cancelled first.
    func take(_ host: String, waiting: () -> Void) async throws -> Int
    /// Gives back place `slot` on `host`, which the request that took it no longer uses.
    func give(_ host: String, _ slot: Int)
}
