#!/usr/bin/env bash
# The download queue at scale: enqueue N downloads into one manager (`haul add -i`), then list them
# (`haul ls`), reporting wall time and peak RSS. Nothing is downloaded: the URLs point at a closed port.
# Usage: bench/queue.sh [N]   (default 10000)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

count="${1:-10000}"
[ -x /usr/bin/time ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time; }
(cd "$ROOT_DIR" && swift build -c release --product haul >/dev/null 2>&1) || { echo "the release build failed"; exit 1; }
haul="$ROOT_DIR/.build/release/haul"

work="$DATA_DIR/queue"
rm -rf "$work"
mkdir -p "$work/files"
for i in $(seq "$count"); do echo "http://127.0.0.1:9/files/file-$i.bin"; done > "$work/list.txt"

# measure LABEL COMMAND...: prints "| LABEL | seconds | peak RSS MiB |"
measure() {
    local label="$1"
    shift
    /usr/bin/time -f "%e %M" -o "$work/time.txt" "$@" > "$work/out.txt"
    read -r seconds kib < "$work/time.txt"
    printf "| %s | %.2f s | %.1f MiB |\n" "$label" "$seconds" "$(echo "$kib / 1024" | bc -l)"
}

echo "| $count downloads | wall time | peak RSS |"
echo "|---|---|---|"
measure "haul add -i (enqueue all, one transaction)" "$haul" add -i "$work/list.txt" -d "$work/files" --state-dir "$work/state"
[ "$(wc -l < "$work/out.txt")" = "$count" ] || { echo "expected $count IDs"; exit 1; }
measure "haul ls (first: reconciles the records of the process that added them)" "$haul" ls --state-dir "$work/state"
measure "haul ls" "$haul" ls --state-dir "$work/state"
[ "$(wc -l < "$work/out.txt")" = "$((count + 1))" ] || { echo "expected $count rows"; exit 1; }
measure "haul ls --json" "$haul" ls --json --state-dir "$work/state"
measure "haul add -i again (every one already known)" "$haul" add -i "$work/list.txt" -d "$work/files" --state-dir "$work/state"
echo
echo "database: $(du -h "$work/state/downloads.sqlite" | cut -f1)"
