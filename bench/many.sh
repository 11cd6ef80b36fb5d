#!/usr/bin/env bash
# Many downloads (issue 24): small files against curl and the other peers, and a queue of 100,000
# and 1,000,000 downloads. Prints Markdown tables; every figure that has a target in the issue is
# marked pass or fail beside it.
#
#   bench/many.sh                        everything: files 2000 20000, then queue 100000 1000000
#   bench/many.sh files [COUNT...]       small files only (default 2000 20000), http and https
#   bench/many.sh queue [COUNT...]       the queue only (default 100000 1000000)
#   RUNS=5 bench/many.sh files 2000      median of 5 runs instead of 3
#   SCHEMES=http bench/many.sh files     only plain HTTP (default: "http https")
#   QUEUE_TIMEOUT=120 bench/many.sh queue 1000000
#                                        stop a queue step of haul after this many seconds (300)
#   HAUL_BIN=/path/to/haul bench/many.sh measure another build of haul
#
# Small files: COUNT files of 16 KiB from nginx on loopback, 16 at a time, over http and over https
# with HTTP/2, by `haul get -i`, `curl -Z`, `curl -Z && sync -f .` (the durable peer: haul makes
# every file durable before it reports it complete), `aria2c -i -j 16`, `wget -i` and `wget2` (when
# it is installed; Debian has a package). Every tool's output must be byte-identical to the served
# files (diff -rq); the script stops at the first that is not. The tools run in rounds (each once a
# round, RUNS rounds), so that a drift of the machine's speed reaches them alike.
#
# The queue: `haul add -i` of COUNT downloads (wall time, peak RSS), the first page of `haul ls`
# (time until its first 101 lines arrive, process start included, and its peak RSS then), a page
# of `GET /api/v1/downloads` from `haul daemon` at offset 0 and near the end, and the daemon's
# memory after it has run that queue for 10 s, 16 at a time. The queued URLs are the 20,000 small
# files reused with a query string (`f7?n=123`), each with an `out=` name of its own, so the daemon
# really downloads them and the server needs no new files.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

runs="${RUNS:-3}"
schemes="${SCHEMES:-http https}"
queue_timeout="${QUEUE_TIMEOUT:-300}"
part=all
case "${1:-}" in
    files | queue) part="$1"; shift ;;
    "") ;;
    *) echo "usage: $0 [files [COUNT...] | queue [COUNT...]]" >&2; exit 64 ;;
esac
counts=("$@")

bench_install
command -v bc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc; }
command -v wget2 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wget2 \
    >/dev/null 2>&1 || true
bench_haul
# The directory of the small files the queue reuses: 20,000 of 16 KiB.
queue_files=20000

# pass_fail VALUE OP LIMIT: "pass" or "fail" for VALUE OP LIMIT (OP is <= or >=).
pass_fail() {
    if [ "$(echo "$1 $2 $3" | bc -l)" = 1 ]; then echo pass; else echo "**fail**"; fi
}

bench_settle

bench_start_nginx
daemon_pid=""
cleanup() {
    if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; fi
    bench_stop_nginx
}
trap cleanup EXIT

# files_table COUNT SCHEME: the small-files table for COUNT files over SCHEME (http or https).
files_table() {
    local count="$1" scheme="$2"
    local base="$BASE_URL" list="$DATA_DIR/many-$count-$scheme.txt" out="$DATA_DIR/out/many" state="$DATA_DIR/haul-state"
    local haul_tls="" curl_tls="" wget_tls="" title="$count files of 16 KiB over http, 16 at a time"
    bench_small_files "$count"
    if [ "$scheme" = https ]; then
        base="$TLS_URL"
        haul_tls="--ca-cert $CA_CERT" curl_tls="--http2 --cacert $CA_CERT" wget_tls="--ca-certificate=$CA_CERT"
        title="$count files of 16 KiB over https with HTTP/2 (haul, curl, wget2), 16 at a time"
    fi
    seq "$count" | sed "s|^|$base/many-$count/f|" > "$list"
    sed 's|^\(.*\)$|url = "\1"|' "$list" > "$list.curl"
    mkdir -p "$DATA_DIR/out"
    local labels=() commands=()
    labels+=("haul get -i -j 16")
    commands+=("$HAUL get -i $list -j 16 -d $out -q --state-dir $state $haul_tls")
    labels+=("curl -Z --parallel-max 16")
    commands+=("mkdir -p $out && cd $out && curl -sS $curl_tls -Z --parallel-max 16 --remote-name-all -K $list.curl")
    labels+=("curl -Z && sync -f .")
    commands+=("mkdir -p $out && cd $out && curl -sS $curl_tls -Z --parallel-max 16 --remote-name-all -K $list.curl && sync -f .")
    labels+=("aria2c -i -j 16")
    commands+=("aria2c -q $wget_tls -i $list -j 16 --allow-overwrite=true --file-allocation=none -d $out")
    labels+=("wget -i")
    commands+=("wget -q $wget_tls -i $list -P $out")
    local note=""
    if command -v wget2 >/dev/null; then
        labels+=("wget2 --max-threads=16 -i")
        commands+=("wget2 -q $wget_tls --max-threads=16 --no-hsts --no-hpkp --no-tcp-fastopen -i $list -P $out")
    else
        note="wget2 is not installed (apt-get install wget2 failed): left out."
    fi

    declare -A wall cpu rss results
    local label middle
    bench_rounds "$runs" "$DATA_DIR/www/many-$count" "$out" "$state"
    for label in "${labels[@]}"; do
        middle=$(printf '%s' "${results[$label]}" | sort -n | sed -n "$(((runs + 1) / 2))p")
        local w c r
        read -r w c r <<<"$middle"
        wall[$label]=$w cpu[$label]=$c rss[$label]=$r
    done
    bench_discard "$out" "$state"

    local curl_rate haul_rate rate
    curl_rate=$(echo "$count / ${wall[curl -Z --parallel-max 16]}" | bc -l)
    haul_rate=$(echo "$count / ${wall[haul get -i -j 16]}" | bc -l)
    echo "**$title**, median of $runs rounds ($(nproc) cores, $(date -u +%Y-%m-%d)):"
    echo
    echo "| tool | wall s | files/s | CPU ms per file | peak RSS MiB | × curl -Z |"
    echo "|---|---|---|---|---|---|"
    for label in "${labels[@]}"; do
        rate=$(echo "$count / ${wall[$label]}" | bc -l)
        printf '| %s | %.2f | %.0f | %.3f | %.1f | %.2f |\n' "$label" "${wall[$label]}" "$rate" \
            "$(echo "${cpu[$label]} * 1000 / $count" | bc -l)" "$(echo "${rss[$label]} / 1024" | bc -l)" \
            "$(echo "$rate / $curl_rate" | bc -l)"
    done
    echo
    printf 'Target: haul files/s ≥ curl -Z'"'"'s: %.0f against %.0f, %s.\n' "$haul_rate" "$curl_rate" \
        "$(pass_fail "$haul_rate" '>=' "$curl_rate")"
    [ -n "$note" ] && { echo; echo "$note"; }
    echo
}

# first_page HAUL STATE: seconds until `haul ls` has printed its header and 100 rows, process start
# included, and its peak RSS in KiB then ("SECONDS KIB"); the process is stopped after them. Uses
# `haul ls --limit 100` when this haul has it.
first_page() {
    local limit=""
    "$1" ls --help 2>/dev/null | grep -q -- --limit && limit="--limit 100"
    # shellcheck disable=SC2086
    timeout "$queue_timeout" python3 - "$1" ls --state-dir "$2" $limit <<'PY'
import subprocess, sys, time
begin = time.monotonic()
process = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)
lines = 0
while lines < 101 and process.stdout.readline():
    lines += 1
elapsed = time.monotonic() - begin
peak = 0
try:
    for line in open(f"/proc/{process.pid}/status"):
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1])
except OSError:
    pass
process.kill()
process.wait()
if peak == 0:
    # It had exited already: its peak is its children's maximum.
    import resource
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"{elapsed:.3f} {peak}")
PY
}

# vm PID FIELD: a /proc/PID/status field (VmHWM, VmRSS) in MiB.
vm() { awk -v field="$2:" '$1 == field { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

# api_page URL TOKEN: the median time in ms of 5 GETs of URL.
api_page() {
    local samples=()
    for _ in 1 2 3 4 5; do
        samples+=("$(curl -s -o /dev/null -m 60 -w '%{time_total}' -H "Authorization: Bearer $2" "$1")")
    done
    printf '%s\n' "${samples[@]}" | sort -n | sed -n 3p | awk '{ printf "%.1f", $1 * 1000 }'
}

# queue_table COUNT: the queue table for COUNT downloads.
queue_table() {
    local count="$1" work="$DATA_DIR/queue-$count"
    local add_target_s add_target_mib ls_target_s=0.3 ls_target_mib=100 api_target_ms=50 daemon_target_mib
    if [ "$count" -ge 1000000 ]; then
        add_target_s=20 add_target_mib=150 daemon_target_mib=150
    else
        add_target_s=2 add_target_mib=100 daemon_target_mib=100
    fi
    bench_small_files "$queue_files"
    bench_discard "$work"
    mkdir -p "$work/files"
    # Each URL a small file with a query string of its own and an out= name of its own: haul names
    # a file after the URL's path, so the query alone would give 20,000 names to a million files.
    awk -v count="$count" -v files="$queue_files" -v base="$BASE_URL/many-$queue_files" \
        'BEGIN { for (n = 1; n <= count; n++) printf "%s/f%d?n=%d\n  out=q%d\n", base, (n - 1) % files + 1, n, n }' \
        > "$work/list.txt"

    echo "**A queue of $count downloads** ($(nproc) cores, $(date -u +%Y-%m-%d)):"
    echo
    echo "| measurement | figure | target | |"
    echo "|---|---|---|---|"
    local wall kib status=0
    timeout "$queue_timeout" /usr/bin/time -f "%e %M" -o "$work/time.txt" \
        "$HAUL" add -i "$work/list.txt" -d "$work/files" --state-dir "$work/state" > "$work/ids.txt" || status=$?
    if [ "$status" != 0 ]; then
        echo "| \`haul add -i\` | stopped after ${queue_timeout} s (exit $status) | ≤ $add_target_s s | **fail** |"
        echo
        bench_discard "$work"
        return
    fi
    read -r wall kib < "$work/time.txt"
    [ "$(wc -l < "$work/ids.txt")" = "$count" ] || { echo "haul add printed $(wc -l < "$work/ids.txt") IDs, not $count" >&2; exit 1; }
    local mib
    mib=$(echo "$kib / 1024" | bc -l)
    printf '| `haul add -i`: wall time | %.2f s | ≤ %s s | %s |\n' "$wall" "$add_target_s" "$(pass_fail "$wall" '<=' "$add_target_s")"
    printf '| `haul add -i`: peak RSS | %.1f MiB | ≤ %s MiB | %s |\n' "$mib" "$add_target_mib" "$(pass_fail "$mib" '<=' "$add_target_mib")"

    local round seconds
    for round in "first, after the add" "again"; do
        if read -r seconds kib < <(first_page "$HAUL" "$work/state") && [ -n "${kib:-}" ]; then
            mib=$(echo "$kib / 1024" | bc -l)
            printf '| first 100 rows of `haul ls` (%s): time | %.3f s | ≤ %s s | %s |\n' "$round" "$seconds" \
                "$ls_target_s" "$(pass_fail "$seconds" '<=' "$ls_target_s")"
            printf '| first 100 rows of `haul ls` (%s): peak RSS | %.1f MiB | ≤ %s MiB | %s |\n' "$round" "$mib" \
                "$ls_target_mib" "$(pass_fail "$mib" '<=' "$ls_target_mib")"
        else
            echo "| first 100 rows of \`haul ls\` ($round) | stopped after ${queue_timeout} s | ≤ $ls_target_s s | **fail** |"
        fi
    done

    # The daemon on the same state directory runs the queue, 16 at a time.
    local started address="$work/state/daemon.address"
    started=$(date +%s.%N)
    "$HAUL" daemon --listen 127.0.0.1:0 --state-dir "$work/state" --download-root "$work/files" -j 16 \
        --log-level warning 2> "$work/daemon.log" &
    daemon_pid=$!
    for _ in $(seq $((queue_timeout * 10))); do
        [ -f "$address" ] && break
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ ! -f "$address" ]; then
        echo "| \`haul daemon\` | did not answer within ${queue_timeout} s | | **fail** |"
    else
        local ready url token
        ready=$(echo "$(date +%s.%N) - $started" | bc -l)
        url="$(cut -d' ' -f1 "$address")/api/v1/downloads"
        token="$("$HAUL" daemon --print-token --state-dir "$work/state")"
        printf '| `haul daemon`: start until it listens | %.2f s | | |\n' "$ready"
        local first last
        first=$(api_page "$url?limit=100&offset=0" "$token")
        last=$(api_page "$url?limit=100&offset=$((count - 100))" "$token")
        printf '| `GET /api/v1/downloads?limit=100&offset=0` (median of 5, while it runs the queue) | %s ms | ≤ %s ms | %s |\n' \
            "$first" "$api_target_ms" "$(pass_fail "$first" '<=' "$api_target_ms")"
        printf '| `GET /api/v1/downloads?limit=100&offset=%s` (likewise) | %s ms | ≤ %s ms | %s |\n' \
            "$((count - 100))" "$last" "$api_target_ms" "$(pass_fail "$last" '<=' "$api_target_ms")"
        local left
        left=$(echo "10 - ($(date +%s.%N) - $started - $ready)" | bc -l)
        [ "$(echo "$left > 0" | bc -l)" = 1 ] && sleep "$left"
        # Read at least 10 s after it listens; later when the pages above took longer.
        local hwm rss done_count
        hwm=$(vm "$daemon_pid" VmHWM)
        rss=$(vm "$daemon_pid" VmRSS)
        done_count=$(curl -s -m 60 -H "Authorization: Bearer $token" "$url?state=completed&limit=1" \
            | python3 -c 'import json, sys; print(json.load(sys.stdin)["total"])' 2>/dev/null || echo "?")
        printf '| `haul daemon` running the queue, -j 16, %.0f s after it listens: peak RSS (VmHWM) | %s MiB | ≤ %s MiB | %s |\n' \
            "$(echo "$(date +%s.%N) - $started - $ready" | bc -l)" "$hwm" "$daemon_target_mib" \
            "$(pass_fail "$hwm" '<=' "$daemon_target_mib")"
        printf '| `haul daemon`, likewise: RSS now (VmRSS) | %s MiB | ≤ %s MiB | %s |\n' \
            "$rss" "$daemon_target_mib" "$(pass_fail "$rss" '<=' "$daemon_target_mib")"
        echo "| downloads completed by then | $done_count | | |"
        # Spot check: what the daemon completed is the served file.
        local name
        for name in q1 q2 "q$queue_files"; do
            if [ -f "$work/files/$name" ]; then
                local n="${name#q}"
                cmp -s "$work/files/$name" "$DATA_DIR/www/many-$queue_files/f$(((n - 1) % queue_files + 1))" \
                    || { echo "the daemon's $name differs from the served file" >&2; exit 1; }
            fi
        done
    fi
    # SIGTERM: running downloads checkpoint. The time it takes to stop is reported; past the
    # timeout the daemon is killed.
    local stopping stopped=""
    stopping=$(date +%s.%N)
    kill "$daemon_pid" 2>/dev/null || true
    for _ in $(seq $((queue_timeout * 10))); do
        kill -0 "$daemon_pid" 2>/dev/null || { stopped=yes; break; }
        sleep 0.1
    done
    if [ -n "$stopped" ]; then
        printf '| `haul daemon`: SIGTERM until it exits | %.2f s | | |\n' "$(echo "$(date +%s.%N) - $stopping" | bc -l)"
    else
        kill -9 "$daemon_pid" 2>/dev/null || true
        echo "| \`haul daemon\`: SIGTERM until it exits | still running after ${queue_timeout} s: killed | | **fail** |"
    fi
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=""
    echo
    echo "State database: $(du -sh "$work/state" | cut -f1)."
    echo
    # Nothing of this table creates files after this, and its database is large: it goes now.
    rm -rf "$work"
}

if [ "$part" = all ] || [ "$part" = files ]; then
    file_counts=(2000 20000)
    [ "$part" = files ] && [ "${#counts[@]}" -gt 0 ] && file_counts=("${counts[@]}")
    for count in "${file_counts[@]}"; do
        for scheme in $schemes; do files_table "$count" "$scheme"; done
    done
fi
if [ "$part" = all ] || [ "$part" = queue ]; then
    queue_counts=(100000 1000000)
    [ "$part" = queue ] && [ "${#counts[@]}" -gt 0 ] && queue_counts=("${counts[@]}")
    for count in "${queue_counts[@]}"; do queue_table "$count"; done
fi
