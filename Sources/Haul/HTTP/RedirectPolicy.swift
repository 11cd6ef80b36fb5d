/// Decides where a redirect may lead and which request headers may follow it.
package enum RedirectPolicy {
    /// Resolves `location` against `current` and returns the next URL and the headers to send there.
    ///
    /// Refuses other schemes than http and https, and https → http unless allowed. Secret headers
    /// (`isSecret`) are dropped as soon as the redirect leaves the origin (scheme, host and port) and
    /// stay dropped.
    package static func follow(
        location: String, from current: DownloadURL, headers: [(String, String)], allowHTTPSToHTTP: Bool,
        isSecret: (String) -> Bool
    ) throws -> (DownloadURL, [(String, String)]) {
        let next: DownloadURL
        do {
            next = try DownloadURL(resolving: location, against: current.url)
        } catch let error as HaulError {
            throw HaulError(error.code, "redirect from \(current.string) refused: \(error.message)")
        }
        if current.isHTTPS && !next.isHTTPS && !allowHTTPSToHTTP {
            throw HaulError(.redirectRefused, "redirect from https to http refused: \(next.string)")
        }
        return (next, Self.headers(headers, from: current, to: next, isSecret: isSecret))
    }

    /// `headers` as they may go to `to` when they were given for `from`: without the secret ones
    /// once the origin (scheme, host and port) differs.
    static func headers(
        _ headers: [(String, String)], from: DownloadURL, to: DownloadURL, isSecret: (String) -> Bool
    ) -> [(String, String)] {
        guard to.origin != from.origin else { return headers }
        return headers.filter { !isSecret($0.0) }
    }
}
