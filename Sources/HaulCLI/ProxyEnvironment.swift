import Haul

/// The proxies `haul` uses, chosen as curl chooses them: `--proxy` over the environment;
/// `http_proxy` for http URLs (lower case only: a CGI program's `HTTP_PROXY` comes from a request
/// header), `https_proxy` or `HTTPS_PROXY` for https ones, `all_proxy` or `ALL_PROXY` for both when
/// those are not set; `--no-proxy` over `no_proxy` or `NO_PROXY`. The library reads no environment.
enum ProxyEnvironment {
    /// The settings for `environment` and the options given.
    /// - Throws: ``HaulError/Code/invalidArgument`` naming the variable or option that does not hold
    ///   a proxy URL (with its password hidden).
    static func settings(_ environment: [String: String], proxy: String?, noProxy: String?) throws -> ProxySettings {
        func named(_ names: String...) -> (String, String)? {
            for name in names { if let value = environment[name], !value.isEmpty { return (name, value) } }
            return nil
        }
        func parse(_ source: (String, String)?) throws -> Proxy? {
            guard let (name, value) = source else { return nil }
            do {
                return try Proxy(parsing: value)
            } catch let error as HaulError {
                throw HaulError(.invalidArgument, "\(name): \(error.message)")
            }
        }
        let exceptions = (noProxy ?? named("no_proxy", "NO_PROXY")?.1 ?? "").split(separator: ",").map {
            String($0).trimmingCharacters(in: " \t")
        }.filter { !$0.isEmpty }
        if let proxy {
            // `--proxy ""` turns every proxy off, as in curl.
            let chosen = try parse(proxy.isEmpty ? nil : ("--proxy", proxy))
            return ProxySettings(http: chosen, https: chosen, noProxy: exceptions)
        }
        let all = try parse(named("all_proxy", "ALL_PROXY"))
        return ProxySettings(
            http: try parse(named("http_proxy")) ?? all, https: try parse(named("https_proxy", "HTTPS_PROXY")) ?? all,
            noProxy: exceptions)
    }
}
