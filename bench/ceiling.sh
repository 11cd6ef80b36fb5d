#!/usr/bin/env bash
# How near can a download path built on AsyncHTTPClient come to curl on many small files? Runs, in
# rounds on the same files: haul, bench/ceiling (the HTTP client alone: fetch, write, and with
# --durable flush each file and rename it, as haul does), bench/ceiling --bare (HTTP/1.1 straight on
# SwiftNIO, each file flushed, or files made durable in batches with one syncfs each, or neither),
# curl -Z and curl -Z && sync.
#
#   bench/ceiling.sh                  2,000 files of 16 KiB over http, 16 at a time, 5 rounds
#   SCHEME=https bench/ceiling.sh     over TLS: HTTP/2 for haul, AsyncHTTPClient and curl --http2;
#                                     the bare client has HTTP/1.1 over TLS, 16 connections
#   COUNT=20000 RUNS=3 bench/ceiling.sh
#
# bench/ceiling is a package of its own (not part of Haul's build); it is built here, in release.
# Every run's files are checked against the served ones.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

runs="${RUNS:-5}"
count="${COUNT:-2000}"
scheme="${SCHEME:-http}"

bench_install
command -v bc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc; }
bench_haul
(cd "$BENCH_DIR/ceiling" && swift build -c release >/dev/null 2>&1) || { echo "bench/ceiling does not build" >&2; exit 1; }
ceiling="$BENCH_DIR/ceiling/.build/release/haul-ceiling"
bench_small_files "$count"
base="$BASE_URL" haul_tls="" curl_tls="" ceiling_tls=""
if [ "$scheme" = https ]; then
    base="$TLS_URL" haul_tls="--ca-cert $CA_CERT" curl_tls="--http2 --cacert $CA_CERT" ceiling_tls="--ca-cert $CA_CERT"
fi
list="$DATA_DIR/ceiling-$count-$scheme.txt"
seq "$count" | sed "s|^|$base/many-$count/f|" > "$list"
sed 's|^\(.*\)$|url = "\1"|' "$list" > "$list.curl"
bench_start_nginx
bench_settle
work="$DATA_DIR/out/ceiling"
mkdir -p "$work"
cleanup() {
    bench_stop_nginx
    # Not deleted: the next script measures after a wait (see bench_discard).
    bench_discard "$work"
}
trap cleanup EXIT

out="$work/out"
labels=("haul get -i -j 16" "AsyncHTTPClient alone, each file flushed" "AsyncHTTPClient alone"
    "bare NIO HTTP/1.1, each file flushed" "bare NIO HTTP/1.1, a syncfs per batch" "bare NIO HTTP/1.1"
    "curl -Z --parallel-max 16" "curl -Z && sync -f .")
commands=(
    "$HAUL get -i $list -j 16 -q -d $out --state-dir $work/state $haul_tls"
    "mkdir -p $out && $ceiling $list $out --durable --jobs 16 $ceiling_tls"
    "mkdir -p $out && $ceiling $list $out --jobs 16 $ceiling_tls"
    "mkdir -p $out && $ceiling $list $out --bare --durable --jobs 16 $ceiling_tls"
    "mkdir -p $out && $ceiling $list $out --bare --batch --jobs 16 $ceiling_tls"
    "mkdir -p $out && $ceiling $list $out --bare --jobs 16 $ceiling_tls"
    "mkdir -p $out && cd $out && curl -sS $curl_tls -Z --parallel-max 16 --remote-name-all -K $list.curl"
    "mkdir -p $out && cd $out && curl -sS $curl_tls -Z --parallel-max 16 --remote-name-all -K $list.curl && sync -f ."
)

declare -A results
bench_rounds "$runs" "$DATA_DIR/www/many-$count" "$out" "$work/state"

# The median of field $2 (1: wall, 2: CPU) of $1's runs.
median() {
    printf '%s' "${results[$1]}" | awk -v f="$2" '{ print $f }' | sort -n | sed -n "$(((runs + 1) / 2))p"
}
curl_wall=$(median "curl -Z --parallel-max 16" 1)
echo "**$count files of 16 KiB over $scheme, 16 at a time**, median of $runs rounds ($(nproc) cores, $(date -u +%Y-%m-%d)):"
echo
echo "| tool | wall s | CPU s | files/s | × curl -Z |"
echo "|---|---|---|---|---|"
for label in "${labels[@]}"; do
    wall=$(median "$label" 1)
    printf '| %s | %s | %s | %.0f | %.2f |\n' "$label" "$wall" "$(median "$label" 2)" \
        "$(echo "$count / $wall" | bc -l)" "$(echo "$curl_wall / $wall" | bc -l)"
done
