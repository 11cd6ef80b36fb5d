#!/usr/bin/env bash
# A fleet (issue 25): workers sharing one queue in PostgreSQL, on files from nginx on loopback.
#
#   bench/fleet.sh               both parts below
#   bench/fleet.sh small         COUNT small files (16 KiB) with one, two and three workers, -j 16
#                                each: files/s, and from pg_stat_statements the database round
#                                trips per download and how long a claim of queued downloads takes
#   bench/fleet.sh rate          the fleet's --total-limit-rate: 12 files of 64 MiB under 40 MiB/s,
#                                one worker against three: the rate reached over the limit
#   COUNT=10000 FILES=12 LIMIT_MIB=40 HAUL_BIN=/path/to/haul bench/fleet.sh
#
# It starts a PostgreSQL of its own (Debian's, as the postgres user when run as root) in a
# temporary folder, on a free port, and removes it at the end. Prints Markdown tables; every file
# must end byte-identical.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

part="${1:-all}"
case "$part" in small | rate | all) ;; *) echo "usage: $0 [small | rate]" >&2; exit 64 ;; esac
files="${FILES:-12}"
limit_mib="${LIMIT_MIB:-40}"
size_mib=64
count="${COUNT:-10000}"

bench_install
command -v bc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc; }
bench_haul
postgres_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$postgres_bin/initdb" ] || { echo "PostgreSQL's server is not installed (apt-get install postgresql)" >&2; exit 1; }

if [ "$part" != small ]; then
    for index in $(seq "$files"); do bench_file "fleet-$index" "$size_mib"; done
fi
if [ "$part" != rate ]; then
    # The small files bench/many.sh serves too: many-20000/f1 … f20000, 16 KiB each.
    bench_small_files 20000
fi
bench_start_nginx

work=$(mktemp -d)
chmod 755 "$work"
as_postgres=()
if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$work"
    as_postgres=(runuser -u postgres --)
fi
pg_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${as_postgres[@]}" "$postgres_bin/initdb" -D "$work/pg" -U haul --auth=trust --no-sync --no-instructions >/dev/null
"${as_postgres[@]}" "$postgres_bin/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w \
    -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1 -c fsync=off -c shared_preload_libraries=pg_stat_statements" \
    start >/dev/null
sql() { "${as_postgres[@]}" "$postgres_bin/psql" -h 127.0.0.1 -p "$pg_port" -U haul -d "$1" -tAq -c "$2"; }
daemons=()
cleanup() {
    for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    "${as_postgres[@]}" "$postgres_bin/pg_ctl" -D "$work/pg" -m fast stop >/dev/null 2>&1 || true
    bench_stop_nginx
    rm -rf "$work"
}
trap cleanup EXIT

# run WORKERS URLS OPTIONS...: a new database, WORKERS daemons on it with OPTIONS, the URLs of the
# file URLS added through the first (2,000 a request); prints the seconds until the queue has them
# all completed, then the database round trips per download and the mean time of a claim in ms.
run() {
    local workers="$1" urls="$2" database="haul_$1_$RANDOM" started ended completed=0 total
    shift 2
    total=$(wc -l < "$urls")
    "${as_postgres[@]}" "$postgres_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U haul "$database"
    sql "$database" "CREATE EXTENSION pg_stat_statements"
    local queue="postgresql://haul@127.0.0.1:$pg_port/$database?sslmode=disable" out="$work/out-$workers"
    mkdir -p "$out"
    daemons=()
    for number in $(seq "$workers"); do
        "$HAUL" daemon --queue "$queue" --state-dir "$work/state-$workers-$number" --download-root "$out" \
            --listen 127.0.0.1:0 "$@" 2>>"$work/daemon.log" &
        daemons+=($!)
    done
    for number in $(seq "$workers"); do
        for _ in $(seq 100); do [ -f "$work/state-$workers-$number/daemon.address" ] && break; sleep 0.1; done
    done
    local state="$work/state-$workers-1"
    local url token
    url="$(cut -d' ' -f1 < "$state/daemon.address")/api/v1"
    token=$("$HAUL" daemon --print-token --state-dir "$state")
    sql "$database" "SELECT pg_stat_statements_reset()" >/dev/null
    started=$(date +%s.%N)
    split -l 2000 "$urls" "$work/chunk-"
    for chunk in "$work"/chunk-*; do
        python3 -c 'import json, sys; print(json.dumps({"downloads": [{"url": line.strip()} for line in open(sys.argv[1]) if line.strip()]}))' \
            "$chunk" > "$work/body.json"
        curl -sf -o /dev/null -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
            --data-binary "@$work/body.json" "$url/downloads"
        rm "$chunk"
    done
    while [ "$completed" != "$total" ]; do
        sleep 0.2
        completed=$(curl -sf -H "Authorization: Bearer $token" "$url/stats" \
            | python3 -c 'import json, sys; print(json.load(sys.stdin)["counts"]["completed"])')
    done
    ended=$(date +%s.%N)
    local calls claim
    calls=$(sql "$database" "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")
    claim=$(sql "$database" "SELECT coalesce(round((sum(total_exec_time) / nullif(sum(calls), 0))::numeric, 3), 0) FROM pg_stat_statements WHERE query LIKE '%SKIP LOCKED%'")
    for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    echo "$(echo "$ended - $started" | bc -l) $(echo "$calls / $total" | bc -l) $claim"
}

if [ "$part" != rate ]; then
    head -n "$count" < <(for index in $(seq 20000); do echo "$BASE_URL/many-20000/f$index"; done) > "$work/small.txt"
    echo "**$count small files (16 KiB) on a fleet** (-j 16 per worker, $(nproc) cores, $(date +%F)):"
    echo
    echo "| workers | wall s | files/s | database statements per download | mean claim (ms, server side) |"
    echo "|---|---|---|---|---|"
    for workers in 1 2 3; do
        read -r seconds per claim < <(run "$workers" "$work/small.txt" -j 16)
        for index in $(seq "$count"); do
            cmp -s "$work/out-$workers/f$index" "$DATA_DIR/www/many-20000/f$index" || { echo "f$index differs" >&2; exit 1; }
        done
        bench_discard "$work/out-$workers"
        printf '| %s | %.2f | %.0f | %.1f | %s |\n' "$workers" "$seconds" "$(echo "$count / $seconds" | bc -l)" "$per" "$claim"
    done
    echo
fi

if [ "$part" != small ]; then
    for index in $(seq "$files"); do echo "$BASE_URL/fleet-$index"; done > "$work/big.txt"
    total_mib=$((files * size_mib))
    echo "**A fleet's total rate** ($files files of $size_mib MiB, --total-limit-rate ${limit_mib}M on every worker, -j 2 each, $(nproc) cores, $(date +%F)):"
    echo
    echo "| workers | wall s | MiB/s reached | × the limit |"
    echo "|---|---|---|---|"
    for workers in 1 3; do
        read -r seconds _ _ < <(run "$workers" "$work/big.txt" -j 2 --total-limit-rate "${limit_mib}M")
        for index in $(seq "$files"); do
            cmp -s "$work/out-$workers/fleet-$index" "$DATA_DIR/www/fleet-$index" || { echo "fleet-$index differs" >&2; exit 1; }
        done
        bench_discard "$work/out-$workers"
        rate=$(echo "$total_mib / $seconds" | bc -l)
        printf '| %s | %.2f | %.1f | %.2f |\n' "$workers" "$seconds" "$rate" "$(echo "$rate / $limit_mib" | bc -l)"
    done
fi
