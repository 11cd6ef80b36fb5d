#!/usr/bin/env bash
# What an app that depends on the Haul library alone fetches: a package of its own depends on this
# checkout by path with `traits: []` and is resolved; none of the packages only the daemon and the
# command use (Hummingbird, PostgresNIO, ArgumentParser, WebSocket) may be among what it resolves.
#
#   scripts/library-footprint.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
app="$(mktemp -d /tmp/haul-library-app.XXXXXX)"
trap 'rm -rf "$app"' EXIT
mkdir -p "$app/Sources/App"
cat > "$app/Package.swift" <<MANIFEST
// swift-tools-version:6.1
import PackageDescription
let package = Package(
    name: "App",
    platforms: [.macOS(.v15)],
    dependencies: [.package(path: "$root", traits: [])],
    targets: [
        .executableTarget(
            name: "App",
            dependencies: [
                .product(name: "Haul", package: "$(basename "$root")"),
                .product(name: "HaulURLSession", package: "$(basename "$root")"),
            ])
    ]
)
MANIFEST
echo 'import Haul' > "$app/Sources/App/main.swift"
(cd "$app" && timeout 600 swift package resolve > resolve.log 2>&1) || { cat "$app/resolve.log"; exit 1; }
resolved="$(ls "$app/.build/checkouts")"
count="$(echo "$resolved" | wc -l)"
for tool in hummingbird hummingbird-websocket postgres-nio swift-argument-parser swift-websocket; do
    if echo "$resolved" | grep -qx "$tool"; then
        echo "library footprint: FAILED: a library-only app resolves $tool"
        exit 1
    fi
done
echo "library footprint: passed; a library-only app resolves $count packages, none of the tools' own"
