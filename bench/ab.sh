#!/usr/bin/env bash
# Two builds of haul on the same small files, alternated run by run: the way to tell whether a change
# to one download's path made it faster, on a machine whose speed drifts by more than the change.
#
#   bench/ab.sh BEFORE AFTER              2,000 files of 16 KiB over http, 8 pairs of runs
#   RUNS=12 bench/ab.sh BEFORE AFTER      12 pairs
#   COUNT=20000 bench/ab.sh BEFORE AFTER  20,000 files
#   OUT=/dev/shm bench/ab.sh BEFORE AFTER write into this directory (default: bench/data/out):
#                                         a tmpfs leaves the disk's own noise out
#
# BEFORE and AFTER are haul binaries (copy each build aside: `cp .build/release/haul /tmp/haul-a`).
# Each run is `haul get -i LIST -j 16 -q` into a fresh directory with a fresh state directory;
# every run's files must be byte-identical to the served ones. Prints every run, then for each build
# the median wall time, user and system CPU, and the median ratio AFTER/BEFORE of the pairs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

if [ "$#" -ne 2 ]; then
    echo "usage: $0 BEFORE AFTER (two haul binaries)" >&2
    exit 64
fi
for binary in "$1" "$2"; do
    [ -x "$binary" ] || { echo "$binary is not an executable" >&2; exit 64; }
done
runs="${RUNS:-8}"
count="${COUNT:-2000}"
out_root="${OUT:-$DATA_DIR/out}"

bench_install
command -v bc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc; }
bench_small_files "$count"
list="$DATA_DIR/many-$count-http.txt"
seq "$count" | sed "s|^|$BASE_URL/many-$count/f|" > "$list"
bench_start_nginx
bench_settle
work="$out_root/haul-ab"
mkdir -p "$work"
cleanup() {
    bench_stop_nginx
    # Not deleted: the next script measures after a wait (see bench_discard).
    bench_discard "$work"
}
trap cleanup EXIT

# One run of binary $1 as build $2 (a or b): prints "BUILD WALL USER SYS".
run() {
    local out="$work/out" state="$work/state" line
    # Set aside, not deleted (see bench_discard).
    bench_discard "$out" "$state"
    # Start each run with no dirty pages left by the previous one (as measure does).
    sync
    line=$(/usr/bin/time -f "%e %U %S" "$1" get -i "$list" -j 16 -q -d "$out" --state-dir "$state" 2>&1 >/dev/null \
        | tail -n 1)
    diff -rq "$out" "$DATA_DIR/www/many-$count" >&2 || { echo "$1: the files differ from the served ones" >&2; exit 1; }
    echo "$2 $line"
}

# The median of the numbers on standard input, one a line.
median() {
    local values
    values=$(sort -n)
    printf '%s\n' "$values" | sed -n "$((($(printf '%s\n' "$values" | wc -l) + 1) / 2))p"
}

# Column $2 (2: wall, 3: user, 4: system) of build $1's runs, its median.
column() { printf '%s\n' "${results[@]}" | awk -v b="$1" -v c="$2" '$1 == b { print $c }' | median; }

results=()
for _ in $(seq "$runs"); do
    results+=("$(run "$1" a)" "$(run "$2" b)")
done
printf '%s\n' "${results[@]}"

echo
echo "$count files of 16 KiB over http, -j 16, $runs alternated pairs ($(nproc) cores, $(date -u +%Y-%m-%d)):"
echo
echo "| build | median wall s | median user s | median sys s |"
echo "|---|---|---|---|"
echo "| a: $1 | $(column a 2) | $(column a 3) | $(column a 4) |"
echo "| b: $2 | $(column b 2) | $(column b 3) | $(column b 4) |"
ratios=()
for index in $(seq 0 2 $((${#results[@]} - 1))); do
    read -r _ before _ _ <<<"${results[$index]}"
    read -r _ after _ _ <<<"${results[$((index + 1))]}"
    ratios+=("$(echo "$after / $before" | bc -l)")
done
printf '\nmedian of the pairs'"'"' wall-time ratios, b / a: %.3f\n' "$(printf '%s\n' "${ratios[@]}" | median)"
