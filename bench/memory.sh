#!/usr/bin/env bash
# Peak memory of `haul get` against file size: 1 GiB and 4 GiB from a local nginx, with curl beside it.
# Usage: bench/memory.sh [--short]   (--short uses 64 MiB and 256 MiB, for CI)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

small=1024
large=4096
if [ "${1:-}" = "--short" ]; then small=64; large=256; fi

bench_install
command -v bc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc; }
(cd "$ROOT_DIR" && swift build -c release --product haul >/dev/null 2>&1)
HAUL="$ROOT_DIR/.build/release/haul"

bench_file "small.bin" "$small"
bench_file "large.bin" "$large"
bench_start_nginx
trap bench_stop_nginx EXIT

out="$DATA_DIR/out"
mkdir -p "$out"
echo "| file | tool | wall s | CPU s | peak RSS MiB |"
echo "|---|---|---|---|---|"
for name in small large; do
    size=$([ "$name" = small ] && echo "$small" || echo "$large")
    rm -f "$out/$name.bin"*
    read -r _ wall cpu rss < <(measure haul "$HAUL" get "$BASE_URL/$name.bin" -o "$out/$name.bin" --quiet)
    cmp -s "$out/$name.bin" "$DATA_DIR/www/$name.bin" || { echo "haul: $name.bin differs"; exit 1; }
    printf '| %s MiB | haul get | %s | %s | %.1f |\n' "$size" "$wall" "$cpu" "$(echo "$rss / 1024" | bc -l)"
    rm -f "$out/$name.bin"
    read -r _ wall cpu rss < <(measure curl curl -sS -o "$out/$name.bin" "$BASE_URL/$name.bin")
    printf '| %s MiB | curl -o | %s | %s | %.1f |\n' "$size" "$wall" "$cpu" "$(echo "$rss / 1024" | bc -l)"
    rm -f "$out/$name.bin"
    # The durable reference: Haul flushes the file before giving it its final name.
    read -r _ wall cpu rss < <(measure curl-sync sh -c "curl -sS -o '$out/$name.bin' '$BASE_URL/$name.bin' && sync '$out/$name.bin'")
    printf '| %s MiB | curl -o && sync | %s | %s | %.1f |\n' "$size" "$wall" "$cpu" "$(echo "$rss / 1024" | bc -l)"
    rm -f "$out/$name.bin"
done
