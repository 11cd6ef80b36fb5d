import Hummingbird
import NIOCore

/// The context of every request the daemon answers: JSON in and out as the API writes it (sorted
/// keys, ISO 8601 dates, no caching; a body that is not the JSON expected is a one-line 400), and
/// the body limit (413 past it).
struct DaemonRequestContext: RequestContext {
    var coreContext: CoreRequestContextStorage
    /// The largest body a route reads; the daemon's first middleware sets it from its options.
    var maxBodyBytes = 1 << 20

    init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
    }

    var maxUploadSize: Int { maxBodyBytes }
    var requestDecoder: APIDecoder { APIDecoder() }
    var responseEncoder: APIEncoder { APIEncoder() }
}

/// Decodes a request's JSON body as the API reads it.
struct APIDecoder: RequestDecoder {
    func decode<Value: Decodable>(_ type: Value.Type, from request: Request, context: some RequestContext)
        async throws -> Value
    {
        try JSONBody.decode(type, from: try await JSONBody.collect(request, limit: context.maxUploadSize))
    }
}

/// Encodes a route's answer as the API writes it.
struct APIEncoder: ResponseEncoder {
    func encode(_ value: some Encodable, from request: Request, context: some RequestContext) throws -> Response {
        try JSONBody.response(value)
    }
}

extension Request {
    /// The body decoded as `type`, or `nil` when there is none.
    func decodeIfPresent<Value: Decodable>(as type: Value.Type, context: DaemonRequestContext) async throws -> Value? {
        let buffer = try await JSONBody.collect(self, limit: context.maxUploadSize)
        guard buffer.readableBytes > 0 else { return nil }
        return try JSONBody.decode(type, from: buffer)
    }
}
