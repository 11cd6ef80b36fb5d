#!/usr/bin/env bash
# A fleet's total rate (issue 25): how close workers sharing one queue in PostgreSQL keep to the
# fleet's --total-limit-rate, one worker against three, on the same files from nginx on loopback.
#
#   bench/fleet.sh                  12 files of 64 MiB, a limit of 40 MiB/s, -j 2 per worker
#   FILES=6 LIMIT_MIB=20 bench/fleet.sh
#   HAUL_BIN=/path/to/haul bench/fleet.sh
#
# It starts a PostgreSQL of its own (Debian's, as the postgres user when run as root) in a
# temporary folder, on a free port, and removes it at the end. Prints a Markdown table: wall time,
# the rate reached, and that rate over the limit; every file must end byte-identical.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

files="${FILES:-12}"
limit_mib="${LIMIT_MIB:-40}"
size_mib=64

bench_install
command -v bc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc; }
bench_haul
postgres_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$postgres_bin/initdb" ] || { echo "PostgreSQL's server is not installed (apt-get install postgresql)" >&2; exit 1; }

for index in $(seq "$files"); do bench_file "fleet-$index" "$size_mib"; done
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
    -o "-p $pg_port -k $work -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
daemons=()
cleanup() {
    for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    "${as_postgres[@]}" "$postgres_bin/pg_ctl" -D "$work/pg" -m fast stop >/dev/null 2>&1 || true
    bench_stop_nginx
    rm -rf "$work"
}
trap cleanup EXIT

# run WORKERS: a new database, WORKERS daemons on it, the files added through the first; prints
# the seconds until the queue has them all completed.
run() {
    local workers="$1" database="haul_$1_$RANDOM" started ended completed=0
    "${as_postgres[@]}" "$postgres_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U haul "$database"
    local queue="postgresql://haul@127.0.0.1:$pg_port/$database?sslmode=disable" out="$work/out-$workers"
    mkdir -p "$out"
    daemons=()
    for number in $(seq "$workers"); do
        "$HAUL" daemon --queue "$queue" --state-dir "$work/state-$workers-$number" --download-root "$out" \
            --listen 127.0.0.1:0 -j 2 --total-limit-rate "${limit_mib}M" 2>>"$work/daemon.log" &
        daemons+=($!)
    done
    local state="$work/state-$workers-1"
    for _ in $(seq 100); do [ -f "$state/daemon.address" ] && break; sleep 0.1; done
    local url token
    url="$(cut -d' ' -f1 < "$state/daemon.address")/api/v1"
    token=$("$HAUL" daemon --print-token --state-dir "$state")
    local items=""
    for index in $(seq "$files"); do items+="${items:+,}{\"url\": \"$BASE_URL/fleet-$index\"}"; done
    started=$(date +%s.%N)
    curl -sf -o /dev/null -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
        -d "{\"downloads\": [$items]}" "$url/downloads"
    while [ "$completed" != "$files" ]; do
        sleep 0.2
        completed=$(curl -sf -H "Authorization: Bearer $token" "$url/stats" \
            | python3 -c 'import json, sys; print(json.load(sys.stdin)["counts"]["completed"])')
    done
    ended=$(date +%s.%N)
    for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for index in $(seq "$files"); do
        cmp -s "$out/fleet-$index" "$DATA_DIR/www/fleet-$index" || { echo "fleet-$index differs" >&2; exit 1; }
    done
    rm -rf "$out"
    echo "$ended - $started" | bc -l
}

total_mib=$((files * size_mib))
echo "**A fleet's total rate** ($files files of $size_mib MiB, --total-limit-rate ${limit_mib}M on every worker, -j 2 each, $(nproc) cores, $(date +%F)):"
echo
echo "| workers | wall s | MiB/s reached | × the limit |"
echo "|---|---|---|---|"
for workers in 1 3; do
    seconds=$(run "$workers")
    rate=$(echo "$total_mib / $seconds" | bc -l)
    printf '| %s | %.2f | %.1f | %.2f |\n' "$workers" "$seconds" "$rate" "$(echo "$rate / $limit_mib" | bc -l)"
done
