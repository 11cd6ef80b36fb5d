#!/usr/bin/env bash
# One file from several mirrors against one mirror, Haul and aria2c (the peer that takes several
# URLs of one file) and curl, in the same run. Three test servers (haul-test-server) serve the same
# file, each held to RATE bytes per second over all its connections, like a mirror's uplink: one
# mirror's time is SIZE / RATE whatever the number of connections, and three mirrors together can
# take about a third of it. Prints a Markdown table with the median wall time, CPU, peak RSS and the
# ratio to the same tool on one mirror.
#
#   bench/mirrors.sh [SIZE_MIB] [RATE_MIB_PER_S]     default 64 MiB at 20 MiB/s per mirror
#   RUNS=5 bench/mirrors.sh 64 20
#   HAUL_BIN=/path/to/haul bench/mirrors.sh          measure another build of haul
set -euo pipefail
source "$(dirname "$0")/lib.sh"

size="${1:-64}"
rate_mib="${2:-20}"
runs="${RUNS:-3}"
bench_install
command -v bc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc; }
(cd "$ROOT_DIR" && swift build -c release --product haul-test-server >/dev/null 2>&1) \
    || { echo "the release build of haul-test-server failed"; exit 1; }
SERVER="$ROOT_DIR/.build/release/haul-test-server"
bench_haul
out="$DATA_DIR/mirrors"
state="$DATA_DIR/mirrors-state"
rm -rf "$out" "$state"
mkdir -p "$out"

# Three servers; each runs until its standard input (a pipe this script holds open) closes.
bytes=$((size * 1024 * 1024))
rate=$((rate_mib * 1024 * 1024))
urls=()
pids=()
for i in 1 2 3; do
    fifo="$out/server$i.in"
    mkfifo "$fifo"
    "$SERVER" --bandwidth "$rate" "mirrored.bin:$bytes" < "$fifo" > "$out/server$i.url" &
    pids+=($!)
    exec {holder}>"$fifo"
    eval "holder$i=$holder"
done
stop_servers() {
    for i in 1 2 3; do eval "exec {holder$i}>&-" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_servers EXIT
for i in 1 2 3; do
    for _ in $(seq 100); do [ -s "$out/server$i.url" ] && break; sleep 0.1; done
    urls+=("$(head -n 1 "$out/server$i.url")/mirrored.bin")
done

# The reference bytes and their checksum, from the first server (this takes one mirror's time).
curl -sS -o "$out/reference.bin" "${urls[0]}"
checksum="sha-256=$(sha256sum "$out/reference.bin" | cut -d' ' -f1)"
target="$out/mirrored.bin"

declare -a labels commands
add() { labels+=("$1"); commands+=("$2"); }
haul="$HAUL get -o $target -q --state-dir $state --checksum $checksum"
aria="aria2c -q --allow-overwrite=true --file-allocation=none -d $out -o mirrored.bin"
add "haul get (1 mirror)" "$haul ${urls[0]}"
add "haul get --mirror ×2 (3 mirrors)" "$haul ${urls[0]} --mirror ${urls[1]} --mirror ${urls[2]}"
add "aria2c -x3 -s3 (1 mirror)" "$aria -x3 -s3 ${urls[0]}"
add "aria2c -s3 URL×3 (3 mirrors)" "$aria -s3 ${urls[0]} ${urls[1]} ${urls[2]}"
# aria2 counts connections per host, and the three mirrors are all 127.0.0.1: -x3 lets it open one
# to each.
add "aria2c -x3 -s3 URL×3 (3 mirrors)" "$aria -x3 -s3 ${urls[0]} ${urls[1]} ${urls[2]}"
add "curl -o (1 mirror)" "curl -sS -o $target ${urls[0]}"

declare -A median_wall median_cpu median_rss
for index in "${!labels[@]}"; do
    label="${labels[$index]}"
    results=()
    for _ in $(seq "$runs"); do
        rm -rf "$out"/mirrored.bin* "$state"
        line=$(measure "$label" sh -c "${commands[$index]}") || { echo "$label failed" >&2; exit 1; }
        cmp -s "$target" "$out/reference.bin" || { echo "$label wrote a wrong file" >&2; exit 1; }
        results+=("${line#"$label" }")
    done
    sorted=$(printf '%s\n' "${results[@]}" | sort -n -k1)
    middle=$(echo "$sorted" | sed -n "$(((runs + 1) / 2))p")
    read -r wall cpu rss <<< "$middle"
    median_wall[$label]=$wall
    median_cpu[$label]=$cpu
    median_rss[$label]=$rss
done

one_mirror=$(echo "$size / $rate_mib" | bc -l)
echo "One ${size} MiB file, each of 3 mirrors held to ${rate_mib} MiB/s over all its connections (one mirror alone: $(printf '%.2f' "$one_mirror") s), median of $runs runs ($(nproc) cores, $(date -u +%Y-%m-%d))"
echo
echo "| command | wall s | CPU s | peak RSS MiB | MiB/s | × one mirror's time |"
echo "|---|---|---|---|---|---|"
for label in "${labels[@]}"; do
    wall=${median_wall[$label]}
    printf '| %s | %.2f | %.2f | %.1f | %.1f | %.2f |\n' "$label" "$wall" "${median_cpu[$label]}" \
        "$(echo "${median_rss[$label]} / 1024" | bc -l)" "$(echo "$size / $wall" | bc -l)" \
        "$(echo "$wall / $one_mirror" | bc -l)"
done
