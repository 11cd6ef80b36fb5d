import Haul
import Synchronization

#if canImport(FoundationNetworking)
    import Foundation
    import FoundationNetworking
#else
    import Foundation
#endif

#if canImport(Darwin)
    // Not compiled where Haul is built and tested (Linux, whose URLSession has no background
    // sessions): see the article "Background downloads on iOS".

    extension URLSessionTransport {
        /// A transport on a background session: the system carries each request on while the app
        /// is suspended or after it was killed, in download tasks whose bodies are moved into
        /// `directory`. Make it once, early in every launch, with the same identifier and directory:
        /// the tasks of earlier launches are then matched to their downloads by description.
        ///
        /// - Parameters:
        ///   - identifier: the session's identifier, the same in every launch (one per app or
        ///     extension).
        ///   - directory: where finished bodies wait for their downloads (it must exist).
        ///   - isDiscretionary: whether the system may wait for a good moment (power, Wi-Fi).
        public static func background(identifier: String, directory: String, isDiscretionary: Bool = false)
            -> URLSessionTransport
        {
            let configuration = URLSessionConfiguration.background(withIdentifier: identifier)
            configuration.isDiscretionary = isDiscretionary
            return URLSessionTransport(configuration: configuration, mode: .files(directory: directory))
        }

        /// Call from the app delegate's
        /// `application(_:handleEventsForBackgroundURLSession:completionHandler:)`: the handler is
        /// called once the session has delivered the events it woke the app for.
        public static func handleEvents(
            forBackgroundURLSession identifier: String, completionHandler: @escaping @MainActor () -> Void
        ) {
            BackgroundEvents.shared.wait(for: identifier, completionHandler)
        }

        /// For SwiftUI's `.backgroundTask(.urlSession(identifier))`: returns once the session has
        /// delivered the events it woke the app for.
        public static func handleEvents(forBackgroundURLSession identifier: String) async {
            await withCheckedContinuation { continuation in
                handleEvents(forBackgroundURLSession: identifier) { continuation.resume() }
            }
        }
    }

    extension TaskRouter {
        func urlSessionDidFinishEvents(forBackgroundURLSession session: URLSession) {
            guard let identifier = session.configuration.identifier else { return }
            BackgroundEvents.shared.finished(identifier)
        }
    }
#endif

/// The handlers the system gave for each background session, called once its events are delivered.
/// Events delivered before the app handed over its handler are remembered: a handler that comes later
/// is called at once.
final class BackgroundEvents: Sendable {
    static let shared = BackgroundEvents()
    private struct State {
        var handlers: [String: [@MainActor () -> Void]] = [:]
        var delivered: Set<String> = []
    }

    private let state = Mutex(State())

    func wait(for identifier: String, _ handler: @escaping @MainActor () -> Void) {
        let now = state.withLock { state -> Bool in
            if state.delivered.remove(identifier) != nil { return true }
            state.handlers[identifier, default: []].append(handler)
            return false
        }
        if now { Self.call([handler]) }
    }

    func finished(_ identifier: String) {
        let waiting = state.withLock { state -> [@MainActor () -> Void] in
            guard let waiting = state.handlers.removeValue(forKey: identifier), !waiting.isEmpty else {
                state.delivered.insert(identifier)
                return []
            }
            return waiting
        }
        Self.call(waiting)
    }

    /// Calls `handlers` on the main actor, where the system expects them.
    private static func call(_ handlers: [@MainActor () -> Void]) {
        guard !handlers.isEmpty else { return }
        Task { @MainActor in for handler in handlers { handler() } }
    }
}
