// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "Haul",
    // The lowest versions the code needs: Synchronization's Mutex (the standard library's lock, used
    // throughout) first shipped with macOS 15, iOS 18, tvOS 18 and visionOS 2; Observation needs less.
    platforms: [.macOS(.v15), .iOS(.v18), .tvOS(.v18), .visionOS(.v2)],
    products: [
        .library(name: "Haul", targets: ["Haul"]),
        .library(name: "HaulURLSession", targets: ["HaulURLSession"]),
        .library(name: "HaulTestServer", targets: ["HaulTestServer"]),
        .library(name: "HaulDaemon", targets: ["HaulDaemon"]),
        .library(name: "HaulPostgreSQL", targets: ["HaulPostgreSQL"]),
        .executable(name: "haul", targets: ["HaulCLI"]),
        .executable(name: "haul-torture", targets: ["HaulTorture"]),
        .executable(name: "haul-fuzz", targets: ["HaulFuzz"]),
        .executable(name: "haul-test-server", targets: ["HaulTestServerTool"]),
        .executable(name: "download-queue-example", targets: ["DownloadQueueExample"]),
    ],
    // An app that depends on the Haul library only turns the trait off (`traits: []`): the daemon's
    // and the command's packages (Hummingbird, PostgresNIO, ArgumentParser…) are then not resolved.
    traits: [
        .default(enabledTraits: ["Tools"]),
        .trait(name: "Tools", description: "The haul command, its daemon and their test tools."),
    ],
    dependencies: [
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-nio-http2.git", from: "1.46.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        // A queue several daemons share (the fleet): its client, in a module of its own, so an app
        // that embeds Haul does not build it.
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        // The daemon's HTTP server. Its default traits pull in swift-configuration, which Haul does not use.
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1", traits: []),
        // aria2's notifications reach its clients over a WebSocket on the daemon's listener.
        .package(url: "https://github.com/hummingbird-project/hummingbird-websocket.git", from: "2.8.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        // Already built for Hummingbird; the daemon names its HTTP/1 conversion handler to sit before it.
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        // `swift package generate-documentation`: builds only when documentation is generated.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin.git", from: "1.5.0"),
    ],
    targets: [
        .target(
            name: "Haul",
            dependencies: [
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "HeapModule", package: "swift-collections"),
                .product(name: "GRDB", package: "GRDB.swift"),
                // SQLite's own calls, for binding many records' values without GRDB's arguments.
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                "CHaulSystem",
            ]
        ),
        .target(name: "CHaulSystem"),
        // A transport on URLSession, apart so that Haul alone does not link FoundationNetworking on Linux.
        .target(
            name: "HaulURLSession",
            dependencies: ["Haul", .product(name: "NIOCore", package: "swift-nio")]
        ),
        .target(
            name: "HaulPostgreSQL",
            dependencies: [
                "Haul",
                .product(name: "PostgresNIO", package: "postgres-nio", condition: .when(traits: ["Tools"])),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "HaulDaemon",
            dependencies: [
                "Haul", "CHaulSystem", "HaulPostgreSQL",
                .product(name: "Hummingbird", package: "hummingbird", condition: .when(traits: ["Tools"])),
                .product(name: "HummingbirdCore", package: "hummingbird", condition: .when(traits: ["Tools"])),
                .product(
                    name: "HummingbirdWebSocket", package: "hummingbird-websocket", condition: .when(traits: ["Tools"])),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras", condition: .when(traits: ["Tools"])),
                .product(name: "HTTPTypes", package: "swift-http-types", condition: .when(traits: ["Tools"])),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(
                    name: "ServiceLifecycle", package: "swift-service-lifecycle", condition: .when(traits: ["Tools"])),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            resources: [
                .embedInCode("Resources/openapi.json"), .embedInCode("Resources/index.html"),
                .embedInCode("Resources/app.js"), .embedInCode("Resources/app.css"),
            ]
        ),
        .target(
            name: "HaulTestServer",
            dependencies: [
                "CHaulSystem",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]
        ),
        // The `haul` executable; named apart from the `Haul` library so no two paths differ only by case.
        .executableTarget(
            name: "HaulCLI",
            dependencies: [
                "Haul", "HaulDaemon", "HaulPostgreSQL",
                .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"])),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "HaulTorture",
            dependencies: [
                "HaulTestServer",
                .product(name: "ArgumentParser", package: "swift-argument-parser", condition: .when(traits: ["Tools"])),
            ]
        ),
        .executableTarget(name: "HaulTestServerTool", dependencies: ["HaulTestServer"]),
        // An app-style program on the app-facing API only; scripts/example-test.py runs it in CI.
        .executableTarget(
            name: "DownloadQueueExample", dependencies: ["Haul", "HaulURLSession"], path: "Examples/DownloadQueue"),
        .target(name: "CLibFuzzer"),
        .executableTarget(
            name: "HaulFuzz",
            dependencies: ["Haul", "HaulTestServer", "CLibFuzzer"]
        ),
        .testTarget(
            name: "HaulTests",
            dependencies: [
                "Haul", "HaulTestServer", "HaulDaemon", "HaulPostgreSQL", "HaulURLSession",
                .product(name: "PostgresNIO", package: "postgres-nio", condition: .when(traits: ["Tools"])),
                .product(name: "HummingbirdTesting", package: "hummingbird", condition: .when(traits: ["Tools"])),
                .product(name: "HTTPTypes", package: "swift-http-types", condition: .when(traits: ["Tools"])),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "HaulCLITests",
            dependencies: [
                "HaulCLI", "Haul", "HaulTestServer", "HaulPostgreSQL", "CHaulSystem",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
    ]
)
