import Haul
import NIOCore

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The API's OpenAPI document as the daemon serves it: the file in `Resources`, with the schema
/// of every field of a request (``DownloadRequest/fieldSchemas``) put into the schemas of a download
/// to add and of a download shown. The fields are described once, beside the code that reads and
/// writes them.
enum APIDocument {
    /// The document's schemas that hold a request's fields; a property a schema declares itself
    /// (`Download`'s `destination`: the file, once known) stays as it declares it.
    static let schemasWithRequestFields = ["NewDownload", "Download"]

    /// The document, assembled.
    static func assembled() throws -> ByteBuffer {
        var document = try JSONDecoder().decode(JSONValue.self, from: Data(PackageResources.openapi_json))
        for name in schemasWithRequestFields {
            guard case .object(var schema)? = document[path: ["components", "schemas", name]],
                case .object(var properties)? = schema["properties"]
            else { throw HaulError(.invalidArgument, "the API document has no schema \(name) with properties") }
            for (field, text) in DownloadRequest.fieldSchemas where properties[field] == nil {
                properties[field] = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
            }
            schema["properties"] = .object(properties)
            document[path: ["components", "schemas", name]] = .object(schema)
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return ByteBuffer(bytes: try encoder.encode(document))
    }
}

/// Any JSON value, integers kept exact.
enum JSONValue: Codable, Equatable, Sendable {
    case null
    case bool(Bool)
    case integer(Int64)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int64.self) {
            self = .integer(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .integer(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// The value of an object's member.
    subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members[key]
    }

    /// The value at a path of object members; setting creates no missing object on the way.
    subscript(path path: [String]) -> JSONValue? {
        get { path.reduce(self as JSONValue?) { value, key in value?[key] } }
        set {
            guard let first = path.first, case .object(var members) = self else { return }
            if path.count == 1 {
                members[first] = newValue
            } else {
                var child = members[first]
                child?[path: Array(path.dropFirst())] = newValue
                members[first] = child
            }
            self = .object(members)
        }
    }
}
