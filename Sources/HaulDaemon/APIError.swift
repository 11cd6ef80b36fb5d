import HTTPTypes
import Haul
import Hummingbird
import NIOCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

extension HaulError.Code {
    /// Credentials were to go to a haul daemon on another machine, over plain HTTP: refused.
    public static let credentialsForRemoteDaemon = HaulError.Code("credentialsForRemoteDaemon")
}

/// An error the API answers with: an HTTP status and a JSON body
/// `{"error": {"code": "...", "message": "..."}}`. Library failures keep their ``HaulError`` code;
/// the API's own refusals (a missing token, a foreign host) have codes of their own.
struct APIError: HTTPResponseError {
    let status: HTTPResponse.Status
    let code: String
    private(set) var message: String
    var headers: HTTPFields = [:]
    /// The download the error is about, when it is another than the one asked for.
    var downloadID: DownloadID?

    init(_ status: HTTPResponse.Status, _ code: String, _ message: String, headers: HTTPFields = [:]) {
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
    }

    /// The answer to a library failure: bad input is 400, a path outside the download roots 403, an
    /// unknown ID 404, a download in the wrong state (or a destination taken) 409, anything else 500.
    init(_ error: HaulError) {
        let status: HTTPResponse.Status =
            switch error.code {
            case .invalidArgument, .invalidURL, .unsupportedScheme: .badRequest
            case .unknownDownload: .notFound
            case .outsideDownloadRoot: .forbidden
            case .invalidState, .destinationExists, .locked: .conflict
            case .insufficientSpace: .init(code: 507, reasonPhrase: "Insufficient Storage")
            default: .internalServerError
            }
        self.init(status, error.code.name, error.message)
        downloadID = error.downloadID
    }

    /// The same error with `context` (the item of a request it is about) before its message.
    func prefixed(_ context: String) -> APIError {
        var error = self
        error.message = "\(context): \(message)"
        return error
    }

    static func unauthorized() -> APIError {
        APIError(
            .unauthorized, "unauthorized", "a valid token is needed: Authorization: Bearer TOKEN",
            headers: [.wwwAuthenticate: #"Bearer realm="haul""#])
    }

    static func badRequest(_ message: String) -> APIError { APIError(.badRequest, "invalidArgument", message) }

    func response(from request: Request, context: some RequestContext) throws -> Response {
        var headers = self.headers
        headers[.contentType] = "application/json; charset=utf-8"
        headers[.cacheControl] = "no-store"
        let body = ErrorResponse(error: .init(code: code, message: message, downloadId: downloadID?.rawValue))
        return Response(status: status, headers: headers, body: .init(byteBuffer: try JSONBody.encode(body)))
    }
}

/// The body of every error answer.
struct ErrorResponse: Codable, Sendable {
    struct Detail: Codable, Sendable, Equatable {
        var code: String
        var message: String
        /// For `destinationExists`: the download that has the destination.
        var downloadId: Int64?
    }
    var error: Detail
}

/// JSON in and out of the API.
enum JSONBody {
    /// `value` as the API writes JSON; requests' secret headers only when `includingSecrets`
    /// (a client's body for a daemon on the same machine).
    static func encode(_ value: some Encodable, includingSecrets: Bool = false) throws -> ByteBuffer {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        if includingSecrets { encoder.userInfo[DownloadRequest.includesSecrets] = true }
        return ByteBuffer(bytes: try encoder.encode(value))
    }

    static func response(_ value: some Encodable, status: HTTPResponse.Status = .ok) throws -> Response {
        Response(
            status: status,
            headers: [.contentType: "application/json; charset=utf-8", .cacheControl: "no-store"],
            body: .init(byteBuffer: try encode(value)))
    }

    /// The request's body decoded as `type`; 413 past `limit` bytes, 400 when it is not that JSON.
    static func decode<Value: Decodable>(_ type: Value.Type, from request: Request, limit: Int) async throws -> Value {
        try decode(type, from: try await collect(request, limit: limit))
    }

    /// The request's body; 413 past `limit` bytes (a body sent in chunks has no length to check first).
    static func collect(_ request: Request, limit: Int) async throws -> ByteBuffer {
        do {
            return try await request.body.collect(upTo: limit)
        } catch is NIOTooManyBytesError {
            throw APIError.bodyTooLarge(limit)
        }
    }

    /// `buffer` decoded as `type`; 400 when it is not that JSON.
    static func decode<Value: Decodable>(_ type: Value.Type, from buffer: ByteBuffer) throws -> Value {
        do {
            return try JSONDecoder().decode(type, from: Data(buffer.readableBytesView))
        } catch let error as DecodingError {
            throw APIError.badRequest("the body is not the JSON expected: \(error.summary)")
        }
    }
}

extension APIError {
    static func bodyTooLarge(_ limit: Int) -> APIError {
        APIError(.contentTooLarge, "bodyTooLarge", "the request body is larger than \(limit) bytes")
    }
}

extension DecodingError {
    /// One line: what was wrong, and where.
    var summary: String {
        let (context, what): (DecodingError.Context, String) =
            switch self {
            case .typeMismatch(let type, let context): (context, "expected \(type)")
            case .valueNotFound(let type, let context): (context, "missing \(type) value")
            case .keyNotFound(let key, let context): (context, "missing field \"\(key.stringValue)\"")
            // A reason the decoder was given (`a time of day is HH:MM`) says more than "malformed".
            case .dataCorrupted(let context):
                (context, context.debugDescription.hasPrefix("a ") ? context.debugDescription : "malformed")
            @unknown default: (DecodingError.Context(codingPath: [], debugDescription: ""), "malformed")
            }
        let path = context.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: ".")
        return path.isEmpty ? what : "\(what) at \(path)"
    }
}
