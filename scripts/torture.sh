#!/usr/bin/env bash
# The torture suite: haul downloads one file while the test server injects random resets, stalls,
# short bodies, 503s, ignored ranges and version switches, and the haul process is SIGKILLed at
# random moments. After every kill the partial file must hold one version's exact bytes; the final
# run must produce the exact file. Then the same with two mirrors and the file's checksum: every
# server misbehaves, now and then a mirror starts serving another version of the same length, and
# the final run must produce exactly the checksum's file.
#
#   scripts/torture.sh --short          10 kills, 8 MiB, debug build, with one and with four
#                                       connections (what CI runs)
#   scripts/torture.sh --long [KILLS]   120 kills (or KILLS), 64 MiB, release build, likewise
#   SEED=123 scripts/torture.sh ...     replay a run
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:---short}"
case "$mode" in
    --short) kills=10; size=8; configuration=debug ;;
    --long) kills="${2:-120}"; size=64; configuration=release ;;
    *) echo "usage: $0 [--short | --long [KILLS]]" >&2; exit 64 ;;
esac

swift build -c "$configuration" --product haul >/dev/null 2>&1
swift build -c "$configuration" --product haul-torture >/dev/null 2>&1
bin="$(swift build -c "$configuration" --show-bin-path)"
seed="${SEED:-$(date +%s)}"
for mirrors in 0 2; do
    for connections in 1 4; do
        "$bin/haul-torture" --haul "$bin/haul" --kills "$kills" --size-mib "$size" --seed "$seed" \
            --connections "$connections" --mirrors "$mirrors"
    done
done
