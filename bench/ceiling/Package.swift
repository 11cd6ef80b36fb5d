// swift-tools-version:6.1
import PackageDescription

// What the HTTP client Haul is built on does alone with many small files: a measure of how near a
// download path can come to curl, apart from Haul (see bench/ceiling.sh). Not part of Haul's build.
let package = Package(
    name: "HaulCeiling",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
    ],
    targets: [
        .executableTarget(
            name: "haul-ceiling",
            dependencies: [
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        )
    ]
)
