import NIOPosix

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Resolves host names for a `socks5://` proxy, which is given addresses (a `socks5h://` one
/// resolves names itself).
enum HostResolution {
    /// A name that did not resolve: worth another attempt (the network may be back).
    struct Failure: Error {
        let host: String

        var message: String {
            "cannot resolve \(host): a socks5:// proxy is given addresses (socks5h:// resolves names)"
        }
    }

    /// The address of `host` as text: its first IPv4 address, else its first IPv6 one.
    /// - Throws: ``Failure`` when the name does not resolve.
    static func address(of host: String) async throws -> String {
        let addresses = try await NIOThreadPool.singleton.runIfActive { lookUp(host) }
        guard let address = addresses.first(where: { !$0.contains(":") }) ?? addresses.first else {
            throw Failure(host: host)
        }
        return address
    }

    /// Every address getaddrinfo gives for `host`, in its order.
    private static func lookUp(_ host: String) -> [String] {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        #if canImport(Darwin)
            hints.ai_socktype = SOCK_STREAM
        #else
            hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        #endif
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, nil, &hints, &list) == 0, let first = list else { return [] }
        defer { freeaddrinfo(first) }
        var addresses: [String] = []
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let current = entry {
            var buffer = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            if let address = current.pointee.ai_addr,
                getnameinfo(
                    address, current.pointee.ai_addrlen, &buffer, socklen_t(buffer.count), nil, 0, NI_NUMERICHOST) == 0
            {
                let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
                if !addresses.contains(text) { addresses.append(text) }
            }
            entry = current.pointee.ai_next
        }
        return addresses
    }
}
