import NIOSSL

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

extension DownloaderConfiguration.TLS {
    /// Checks that `path` is a readable PEM file holding at least one certificate, so that a wrong
    /// ``trustedCertificateFiles`` entry is reported before any download starts.
    /// - Throws: ``HaulError/Code/invalidArgument`` naming the file and what is wrong with it.
    public static func checkCertificateFile(_ path: String) throws {
        guard FileManager.default.isReadableFile(atPath: path) else {
            throw HaulError(.invalidArgument, "cannot read the certificate file \(path)")
        }
        let certificates: [NIOSSLCertificate]
        do {
            certificates = try NIOSSLCertificate.fromPEMFile(path)
        } catch {
            throw HaulError(.invalidArgument, "\(path) is not a PEM certificate file (\(error))", underlying: error)
        }
        guard !certificates.isEmpty else {
            throw HaulError(.invalidArgument, "\(path) holds no PEM certificate")
        }
    }
}
