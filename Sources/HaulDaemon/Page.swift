import HTTPTypes
import Hummingbird
import NIOCore

/// The daemon's web page: plain HTML, CSS and a script, embedded in the binary, served without a
/// token (they hold no data; the script asks for the token and sends it with every API call).
enum Page {
    /// The page's files by path, with their content types.
    static let files: [String: (type: String, body: ByteBuffer)] = [
        "/": ("text/html; charset=utf-8", ByteBuffer(bytes: PackageResources.index_html)),
        "/app.js": ("text/javascript; charset=utf-8", ByteBuffer(bytes: PackageResources.app_js)),
        "/app.css": ("text/css; charset=utf-8", ByteBuffer(bytes: PackageResources.app_css)),
    ]

    /// What the browser may do with the page: its own scripts, styles and API only; no framing.
    static let contentSecurityPolicy =
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        + "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

    static func register<Context: RequestContext>(on router: Router<Context>) {
        for (path, file) in files {
            router.get(RouterPath(path)) { _, _ in
                Response(
                    status: .ok, headers: [.contentType: file.type, .cacheControl: "no-cache"],
                    body: .init(byteBuffer: file.body))
            }
        }
    }
}

/// Headers on every answer: the page's Content-Security-Policy, no framing, no sniffing, no referrer.
struct SecurityHeaders<Context: RequestContext>: RouterMiddleware {
    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response)
        async throws -> Response
    {
        var response: Response
        do {
            response = try await next(request, context)
        } catch let error as any HTTPResponseError {
            response = try error.response(from: request, context: context)
        }
        response.headers[.contentSecurityPolicy] = Page.contentSecurityPolicy
        response.headers[HTTPField.Name("X-Frame-Options")!] = "DENY"
        response.headers[.xContentTypeOptions] = "nosniff"
        response.headers[HTTPField.Name("Referrer-Policy")!] = "no-referrer"
        return response
    }
}
