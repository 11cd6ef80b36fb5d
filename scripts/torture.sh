#!/usr/bin/env bash
# The torture suite: haul downloads one file while the test server injects random resets, stalls,
# short bodies, 503s, ignored ranges and version switches, and the haul process is SIGKILLed at
# random moments. After every kill the partial file must hold one version's exact bytes; the final
# run must produce the exact file. Then the same with two mirrors and the file's checksum: every
# server misbehaves, now and then a mirror starts serving another version of the same length, and
# the final run must produce exactly the checksum's file. Then many small files (`--files`): haul
# downloads them from one input file, 16 at a time, and is SIGKILLed 20–400 ms after it starts;
# after every kill each final name must be absent or exact, each partial file consistent, and each
# download `haul ls --json` reports completed there and exact; the final run must complete them all.
#
#   scripts/torture.sh --short          10 kills, 8 MiB, debug build, with one and with four
#                                       connections (what CI runs); then 200 small files, 5 kills
#   scripts/torture.sh --long [KILLS]   120 kills (or KILLS), 64 MiB, release build, likewise;
#                                       then 2,000 small files, 20 kills
#   scripts/torture.sh --files [N] [KILLS]
#                                       only the small files: N (2000) files, KILLS (20) kills,
#                                       debug build (CONFIGURATION=release for the release build)
#   SEED=123 scripts/torture.sh ...     replay a run
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:---short}"
case "$mode" in
    --short) kills=10; size=8; configuration=debug; files=200; file_kills=5 ;;
    --long) kills="${2:-120}"; size=64; configuration=release; files=2000; file_kills=20 ;;
    --files) kills=0; configuration="${CONFIGURATION:-debug}"; files="${2:-2000}"; file_kills="${3:-20}" ;;
    *) echo "usage: $0 [--short | --long [KILLS] | --files [N] [KILLS]]" >&2; exit 64 ;;
esac

swift build -c "$configuration" --product haul >/dev/null 2>&1
swift build -c "$configuration" --product haul-torture >/dev/null 2>&1
bin="$(swift build -c "$configuration" --show-bin-path)"
seed="${SEED:-$(date +%s)}"
# Every run has a time limit (the torture also limits each haul it starts), so a hang fails the run.
if [ "$kills" -gt 0 ]; then
    for mirrors in 0 2; do
        for connections in 1 4; do
            timeout 3600 "$bin/haul-torture" --haul "$bin/haul" --kills "$kills" --size-mib "$size" \
                --seed "$seed" --connections "$connections" --mirrors "$mirrors"
        done
    done
fi
timeout 1800 "$bin/haul-torture" --haul "$bin/haul" --files "$files" --kills "$file_kills" --seed "$seed"
