import ArgumentParser
import Haul

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

struct Verify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Check a download on disk, without the network.",
        discussion: """
            For an unfinished download (FILE.haul.part and its manifest exist), every piece is checked \
            against the hash recorded when it was written; the next `haul get` fetches only the damaged \
            pieces again (or, when the server's validator does not allow single ranges, everything from the \
            first damaged piece on). For a complete FILE, give --checksum.
            Exit codes: 0 intact, 16 damaged or mismatched, others as for `haul get`.
            """
    )

    @Argument(help: "The downloaded file (or the destination of an unfinished download).")
    var file: String

    @Option(help: ArgumentHelp("The checksum a complete file must have, as ALG=HEX.", valueName: "alg=hex"))
    var checksum: String?

    func run() async throws {
        do {
            let paths = try? DownloadPaths.open(file)
            if let paths, paths.folder.exists(paths.manifestName) {
                guard checksum == nil else {
                    throw HaulError(
                        .invalidArgument,
                        "\(file) is still downloading; --checksum applies once it is complete (haul get checks it then)"
                    )
                }
                try await verifyPartial()
            } else if access(file, F_OK) == 0 {
                try await verifyComplete()
            } else {
                throw HaulError(.fileSystem, "\(file) does not exist, and neither does an unfinished download of it")
            }
        } catch let error as HaulError {
            Output.standardError("haul: error: \(error.messageWithHint)\n")
            throw ExitCode(ExitCodes.code(for: error.code))
        }
    }

    private func verifyPartial() async throws {
        let report = try await DownloadVerifier.verifyPartial(destination: file)
        let pieces = "\(report.piecesChecked) pieces of \(ByteCount.format(report.pieceSize))"
        if report.damagedPieces.isEmpty {
            var line = "haul: \(file): unfinished download, \(pieces) checked, all intact"
            if report.bytesUnchecked > 0 {
                line += "; \(ByteCount.format(report.bytesUnchecked)) have no piece hash yet"
            }
            Output.standardOutput(line + "\n")
            return
        }
        let ranges = report.damagedPieces.prefix(10).map { index in
            let start = Int64(index) * report.pieceSize
            return "piece \(index) (\(ByteCount.format(start))–\(ByteCount.format(start + report.pieceSize)))"
        }
        let more = report.damagedPieces.count > 10 ? " and \(report.damagedPieces.count - 10) more" : ""
        Output.standardOutput(
            "haul: \(file): \(report.damagedPieces.count) of \(pieces) damaged: \(ranges.joined(separator: ", "))\(more); "
                + "kept \(ByteCount.format(report.bytesKept)); run haul get again to fetch the rest\n"
        )
        throw ExitCode(ExitCodes.code(for: .checksumMismatch))
    }

    private func verifyComplete() async throws {
        guard let checksum else {
            throw HaulError(.invalidArgument, "nothing to check \(file) against: give --checksum ALG=HEX")
        }
        let expected = try Checksum(parsing: checksum)
        let actual = try await DownloadVerifier.checksum(ofFile: file, algorithm: expected.algorithm)
        guard actual == expected else {
            throw HaulError(
                .checksumMismatch,
                "checksum mismatch: \(expected.algorithm.rawValue) of \(file) is \(actual.hex), expected \(expected.hex)"
            )
        }
        Output.standardOutput("haul: \(file): \(expected.algorithm.rawValue) matches\n")
    }
}
