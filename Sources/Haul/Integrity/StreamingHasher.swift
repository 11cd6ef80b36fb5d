import Crypto
import NIOCore

/// Hashes bytes as they arrive with one or more algorithms at once.
struct StreamingHasher: Sendable {
    private enum Function: Sendable {
        case md5(Insecure.MD5)
        case sha1(Insecure.SHA1)
        case sha256(SHA256)
        case sha512(SHA512)
    }

    private var functions: [Function]
    /// Bytes hashed so far.
    private(set) var count: Int64 = 0
    let algorithms: Set<DigestAlgorithm>

    init(algorithms: Set<DigestAlgorithm>) {
        self.algorithms = algorithms
        functions = algorithms.sorted().map { algorithm in
            switch algorithm {
            case .md5: .md5(Insecure.MD5())
            case .sha1: .sha1(Insecure.SHA1())
            case .sha256: .sha256(SHA256())
            case .sha512: .sha512(SHA512())
            }
        }
    }

    var isEmpty: Bool { functions.isEmpty }

    mutating func update(_ bytes: UnsafeRawBufferPointer) {
        count += Int64(bytes.count)
        for index in functions.indices {
            switch functions[index] {
            case .md5(var function):
                function.update(bufferPointer: bytes)
                functions[index] = .md5(function)
            case .sha1(var function):
                function.update(bufferPointer: bytes)
                functions[index] = .sha1(function)
            case .sha256(var function):
                function.update(bufferPointer: bytes)
                functions[index] = .sha256(function)
            case .sha512(var function):
                function.update(bufferPointer: bytes)
                functions[index] = .sha512(function)
            }
        }
    }

    mutating func update(_ buffer: ByteBuffer) {
        buffer.withUnsafeReadableBytes { update($0) }
    }

    /// The digests of everything hashed, one per algorithm.
    func finalize() -> [Checksum] {
        functions.map { function in
            switch function {
            case .md5(let function): Checksum(algorithm: .md5, digest: Array(function.finalize()))
            case .sha1(let function): Checksum(algorithm: .sha1, digest: Array(function.finalize()))
            case .sha256(let function): Checksum(algorithm: .sha256, digest: Array(function.finalize()))
            case .sha512(let function): Checksum(algorithm: .sha512, digest: Array(function.finalize()))
            }
        }
    }
}
