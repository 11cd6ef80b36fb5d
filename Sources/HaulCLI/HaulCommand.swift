import ArgumentParser
import Haul

@main
struct HaulCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "haul",
        abstract: "Resumable, crash-safe file downloads.",
        discussion: """
            Re-run the same command after any interruption (Ctrl-C, a dropped connection, a killed process) \
            and Haul continues from the last stored byte, after checking that the server still has the same file.
            """,
        version: HaulVersion.current,
        subcommands: [
            Get.self, Add.self, List.self, Resume.self, Pause.self, Retry.self, Remove.self, Verify.self,
            DaemonCommand.self,
        ]
    )
}
