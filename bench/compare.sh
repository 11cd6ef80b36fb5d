#!/usr/bin/env bash
# One large file over loopback from a local nginx: haul against curl, wget, aria2c and axel, on the
# same file in the same run. Prints a Markdown table with wall time, CPU time, peak RSS, throughput
# and the ratio of each tool's throughput to curl's. Each tool runs RUNS times (default 3); the
# table shows the median run. `sync` runs before every measurement so no tool pays for another's
# dirty pages.
#
#   bench/compare.sh [SIZE_MIB]        default 4096
#   RUNS=5 bench/compare.sh 1024
set -euo pipefail
source "$(dirname "$0")/lib.sh"

size="${1:-4096}"
runs="${RUNS:-3}"
bench_install
command -v bc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc; }
(cd "$ROOT_DIR" && swift build -c release --product haul >/dev/null 2>&1)
HAUL="$ROOT_DIR/.build/release/haul"

bench_file "compare.bin" "$size"
bench_start_nginx
trap bench_stop_nginx EXIT
url="$BASE_URL/compare.bin"
out="$DATA_DIR/out"
mkdir -p "$out"

# tool label, then the command; the output file is always $out/compare.bin
declare -a labels commands
add() { labels+=("$1"); commands+=("$2"); }
add "haul get" "$HAUL get $url -o $out/compare.bin -q"
add "curl -o" "curl -sS -o $out/compare.bin $url"
add "curl -o && sync" "curl -sS -o $out/compare.bin $url && sync $out/compare.bin"
add "wget -O" "wget -q -O $out/compare.bin $url"
add "aria2c -x1" "aria2c -q -x1 --allow-overwrite=true --file-allocation=none -d $out -o compare.bin $url"
add "aria2c -x8 -s8" "aria2c -q -x8 -s8 --allow-overwrite=true --file-allocation=none -d $out -o compare.bin $url"
add "axel -n 8" "axel -q -n 8 -o $out/compare.bin $url"

declare -A median_wall median_cpu median_rss
for index in "${!labels[@]}"; do
    label="${labels[$index]}"
    results=()
    for _ in $(seq "$runs"); do
        rm -f "$out"/compare.bin*
        line=$(measure "$label" sh -c "${commands[$index]}") || { echo "$label failed" >&2; exit 1; }
        cmp -s "$out/compare.bin" "$DATA_DIR/www/compare.bin" || { echo "$label: wrong bytes" >&2; exit 1; }
        results+=("${line#"$label "}")
    done
    middle=$(printf '%s\n' "${results[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p")
    read -r wall cpu rss <<<"$middle"
    median_wall[$label]=$wall
    median_cpu[$label]=$cpu
    median_rss[$label]=$rss
done
rm -f "$out"/compare.bin*

curl_rate=$(echo "$size / ${median_wall["curl -o"]}" | bc -l)
echo "One ${size} MiB file over loopback, median of $runs runs ($(nproc) cores, $(date -u +%Y-%m-%d))"
echo
echo "| tool | wall s | CPU s | peak RSS MiB | MiB/s | × curl |"
echo "|---|---|---|---|---|---|"
for label in "${labels[@]}"; do
    wall=${median_wall[$label]}
    rate=$(echo "$size / $wall" | bc -l)
    printf '| %s | %.2f | %.2f | %.1f | %.0f | %.2f |\n' "$label" "$wall" "${median_cpu[$label]}" \
        "$(echo "${median_rss[$label]} / 1024" | bc -l)" "$rate" "$(echo "$rate / $curl_rate" | bc -l)"
done
