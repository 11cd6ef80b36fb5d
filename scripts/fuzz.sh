#!/usr/bin/env bash
# Fuzzing of the parsers that read what servers and users send (libFuzzer + AddressSanitizer).
#
#   scripts/fuzz.sh SECONDS [TARGET...]   fuzz each target (all by default) for SECONDS
#   scripts/fuzz.sh --replay              replay the seeds and every saved crash, without the fuzzer
#
# Targets: content-range, range, content-disposition, retry-after, digest, manifest, url.
# Seeds live in Tests/FuzzSeeds/TARGET; a crash is saved to Tests/FuzzSeeds/TARGET/crash-* so that it
# becomes a regression input that every later replay (and CI) runs.
set -euo pipefail
cd "$(dirname "$0")/.."

targets_all=(content-range range content-disposition retry-after digest manifest url)

if [ "${1:-}" = "--replay" ]; then
    swift build --product haul-fuzz >/dev/null 2>&1
    bin="$(swift build --show-bin-path)"
    for target in "${targets_all[@]}"; do
        "$bin/haul-fuzz" "$target" Tests/FuzzSeeds/"$target"/*
    done
    exit 0
fi

seconds="${1:?usage: $0 SECONDS [TARGET...] | --replay}"
shift
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=("${targets_all[@]}")

swift build --scratch-path .build-fuzz --product haul-fuzz \
    -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING >/dev/null 2>&1 \
    || swift build --scratch-path .build-fuzz --product haul-fuzz -Xswiftc -sanitize=fuzzer,address -Xswiftc -DFUZZING
fuzzer=.build-fuzz/debug/haul-fuzz

status=0
for target in "${targets[@]}"; do
    corpus=".build-fuzz/corpus/$target"
    mkdir -p "$corpus"
    log=".build-fuzz/$target.log"
    if HAUL_FUZZ_TARGET="$target" "$fuzzer" "$corpus" "Tests/FuzzSeeds/$target" \
        -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="Tests/FuzzSeeds/$target/" >"$log" 2>&1; then
        runs=$(grep -Eo 'Done [0-9]+ runs' "$log" | tail -1 | grep -Eo '[0-9]+' || echo "?")
        echo "fuzz: $target: $runs runs in ${seconds} s, no failure"
    else
        echo "fuzz: $target: FAILED; input saved in Tests/FuzzSeeds/$target/ (see $log)"
        tail -20 "$log"
        status=1
    fi
done
exit "$status"
