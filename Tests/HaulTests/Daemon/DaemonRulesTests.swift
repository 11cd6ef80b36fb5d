import Haul
import NIOHTTP1
import Testing

@testable import HaulDaemon

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `/api/v1/rules`: the schedules and rules, changed at run time and kept across restarts.
@Suite(.timeLimit(.minutes(1)))
struct DaemonRulesTests {
    struct State: Decodable {
        struct Now: Decodable {
            var limitRate: Int64?
            var startsDownloads: Bool
        }
        var rules: QueueRules
        var now: Now
    }

    static let rules = #"""
        {"speedLimits": [{"from": "00:00", "to": "00:00", "limitRate": 4096}],
         "sites": [{"host": "*.example.com", "connections": 2, "directory": "example"}],
         "categories": [{"name": "Images", "extensions": ["iso"], "directory": "images"}]}
        """#

    @Test func rulesSetThroughTheAPIHoldAtOnceAndAfterARestart() async throws {
        try await withTemporaryDirectory { directory in
            let state = directory + "/state"
            try await withDaemon(stateDirectory: state) { daemon in
                let empty = try await daemon.send(.GET, "/api/v1/rules").json(State.self)
                #expect(empty.rules == QueueRules() && empty.now.limitRate == nil && empty.now.startsDownloads)
                let set = try await daemon.send(.PUT, "/api/v1/rules", json: Self.rules)
                #expect(set.status == 200, "\(set.body)")
                // A window of the whole day holds now.
                #expect(try set.json(State.self).now.limitRate == 4096)
                #expect(await daemon.daemon.manager.rulesInForce.bytesPerSecond == 4096)
                // The rules apply to what is added from now on.
                let id = try await daemon.add(#"{"url": "http://cdn.example.com/a.iso"}"#)[0]
                let added = try await daemon.send(.GET, "/api/v1/downloads/\(id)").body
                #expect(added.contains(#""connections":2"#) && added.contains(daemon.root + "/example"), "\(added)")
            }
            // The next daemon on the state directory has them.
            try await withDaemon(stateDirectory: state) { daemon in
                let kept = try await daemon.send(.GET, "/api/v1/rules").json(State.self)
                #expect(kept.rules.sites.first?.host == "*.example.com" && kept.now.limitRate == 4096)
            }
        }
    }

    @Test func rulesThatCannotHoldOrLeadOutsideTheRootsChangeNothing() async throws {
        try await withDaemon { daemon in
            for (body, status) in [
                (#"{"speedLimits": [{"from": "24:00", "to": "01:00", "limitRate": 1}]}"#, 400),
                (#"{"startWindows": [{"days": ["Mon"], "from": "01:00", "to": "02:00"}]}"#, 400),
                (#"{"sites": [{"host": "x", "connections": 65}]}"#, 400),
                (#"{"categories": [{"name": "up", "extensions": ["a"], "directory": "../../etc"}]}"#, 400),
                (#"{"categories": [{"name": "out", "extensions": ["a"], "directory": "/etc"}]}"#, 403),
                (#"{"sites": [{"host": "x", "directory": ".ssh"}]}"#, 403),
            ] {
                let answer = try await daemon.send(.PUT, "/api/v1/rules", json: body)
                #expect(answer.status == status, "\(body): \(answer.body)")
            }
            #expect(try await daemon.send(.GET, "/api/v1/rules").json(State.self).rules == QueueRules())
            #expect(!FileManager.default.fileExists(atPath: daemon.stateDirectory + "/" + DaemonFiles.rulesName))
        }
    }

    @Test func aRulesFileThatDoesNotHoldRulesStopsTheStartInOneLine() async throws {
        try await withTemporaryDirectory { directory in
            let state = directory + "/state"
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
            try Data(#"{"startWindows": [{"from": "1 am"}]}"#.utf8).write(
                to: URL(fileURLWithPath: state + "/" + DaemonFiles.rulesName))
            let error = await #expect(throws: HaulError.self) {
                try await withDaemon(stateDirectory: state) { _ in }
            }
            #expect(error?.message.contains("rules.json does not hold rules") == true, "\(error?.message ?? "")")
        }
    }
}
