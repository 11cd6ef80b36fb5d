# Shared helpers for Haul's benchmarks: a local nginx on loopback serving generated files.
# Sourced by the bench scripts; everything lives under bench/data (ignored by git).

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_DIR="$(cd "$BENCH_DIR/.." && pwd)"
DATA_DIR="${HAUL_BENCH_DATA:-$BENCH_DIR/data}"
PORT="${HAUL_BENCH_PORT:-8089}"
TLS_PORT="${HAUL_BENCH_TLS_PORT:-8489}"
BASE_URL="http://127.0.0.1:$PORT"
# The same files over TLS with HTTP/2 offered by ALPN; clients trust $CA_CERT.
TLS_URL="https://127.0.0.1:$TLS_PORT"
CA_CERT="$DATA_DIR/tls/authority.pem"

# Installs the peers and nginx with apt when they are missing.
bench_install() {
    local needed=()
    command -v nginx >/dev/null || needed+=(nginx)
    command -v curl >/dev/null || needed+=(curl)
    command -v wget >/dev/null || needed+=(wget)
    command -v aria2c >/dev/null || needed+=(aria2)
    command -v axel >/dev/null || needed+=(axel)
    [ -x /usr/bin/time ] || needed+=(time)
    if [ "${#needed[@]}" -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${needed[@]}"
    fi
}

# Sets HAUL to the haul to measure: $HAUL_BIN (another build, an earlier version say), else this
# checkout's release build, built here.
bench_haul() {
    if [ -n "${HAUL_BIN:-}" ]; then
        HAUL="$HAUL_BIN"
    else
        (cd "$ROOT_DIR" && swift build -c release --product haul >/dev/null 2>&1) \
            || { echo "the release build failed"; exit 1; }
        HAUL="$ROOT_DIR/.build/release/haul"
    fi
}

# bench_file NAME SIZE_MIB: a file of random bytes under $DATA_DIR/www, made once.
bench_file() {
    local path="$DATA_DIR/www/$1"
    mkdir -p "$DATA_DIR/www"
    if [ ! -f "$path" ] || [ "$(stat -c %s "$path")" != "$(($2 * 1024 * 1024))" ]; then
        head -c "$(($2 * 1024 * 1024))" /dev/urandom > "$path.tmp" && mv "$path.tmp" "$path"
    fi
}

# bench_small_files COUNT: $DATA_DIR/www/many-COUNT/f1 … fCOUNT, 16 KiB of random bytes each, made once.
bench_small_files() {
    python3 - "$DATA_DIR/www/many-$1" "$1" <<'PY'
import os, sys
folder, count = sys.argv[1], int(sys.argv[2])
os.makedirs(folder, exist_ok=True)
for index in range(1, count + 1):
    path = os.path.join(folder, f"f{index}")
    if not os.path.exists(path) or os.path.getsize(path) != 16384:
        with open(path + ".tmp", "wb") as file:
            file.write(os.urandom(16384))
        os.rename(path + ".tmp", path)
PY
}

# A certificate authority and a server certificate for 127.0.0.1 it signed, made once.
bench_certificates() {
    local dir="$DATA_DIR/tls"
    [ -f "$dir/server.pem" ] && return
    mkdir -p "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
        -subj "/CN=Haul bench authority" -keyout "$dir/authority.key" -out "$dir/authority.pem" 2>/dev/null
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" \
        -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$dir/server.ext"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/authority.pem" -CAkey "$dir/authority.key" \
        -CAcreateserial -days 3650 -extfile "$dir/server.ext" -out "$dir/server.pem" 2>/dev/null
}

# Starts nginx on 127.0.0.1:$PORT serving $DATA_DIR/www, and on $TLS_PORT the same over TLS with
# HTTP/2; `/slow/` is limited to 20 MB/s per connection (per stream over HTTP/2).
bench_start_nginx() {
    mkdir -p "$DATA_DIR/nginx/logs" "$DATA_DIR/www"
    bench_certificates
    cat > "$DATA_DIR/nginx/nginx.conf" <<CONF
worker_processes 1;
pid $DATA_DIR/nginx/nginx.pid;
error_log $DATA_DIR/nginx/logs/error.log;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    server {
        listen 127.0.0.1:$PORT;
        listen 127.0.0.1:$TLS_PORT ssl http2;
        ssl_certificate $DATA_DIR/tls/server.pem;
        ssl_certificate_key $DATA_DIR/tls/server.key;
        http2_max_concurrent_streams 128;
        root $DATA_DIR/www;
        location /slow/ { alias $DATA_DIR/www/; limit_rate 20m; }
    }
}
CONF
    bench_stop_nginx
    nginx -c "$DATA_DIR/nginx/nginx.conf" -p "$DATA_DIR/nginx"
    for _ in $(seq 50); do curl -sf -o /dev/null "$BASE_URL/" -r 0-0 2>/dev/null && break; sleep 0.1; done
    curl -s --cacert "$CA_CERT" --http2 -o /dev/null -w '%{http_version}' "$TLS_URL/" | grep -q '^2' \
        || { echo "nginx does not serve HTTP/2 over TLS" >&2; return 1; }
}

# bench_start_relay PORT RATE: bench/paced_relay.py on 127.0.0.1:PORT in front of nginx's TLS port,
# holding each TCP connection to RATE bytes per second. PACED_URL reaches the files through it.
PACED_PORT="${HAUL_BENCH_PACED_PORT:-8490}"
PACED_URL="https://127.0.0.1:$PACED_PORT"
bench_start_relay() {
    python3 "$BENCH_DIR/paced_relay.py" "$PACED_PORT" "$TLS_PORT" "$1" &
    RELAY_PID=$!
    for _ in $(seq 50); do
        curl -s --cacert "$CA_CERT" -o /dev/null "$PACED_URL/" 2>/dev/null && return
        sleep 0.1
    done
    echo "the pacing relay did not start" >&2
    return 1
}

bench_stop_relay() {
    [ -n "${RELAY_PID:-}" ] && kill "$RELAY_PID" 2>/dev/null
    true
}

bench_stop_nginx() {
    if [ -f "$DATA_DIR/nginx/nginx.pid" ]; then
        kill "$(cat "$DATA_DIR/nginx/nginx.pid")" 2>/dev/null || true
        sleep 0.3
    fi
}

# Where measured runs' files go (see bench_discard): deleted by the next script before it measures.
DISCARD_DIR="$DATA_DIR/discarded"

# bench_discard PATH...: moves each PATH out of the way instead of deleting it. On ext4 without a
# journal, creating a file skips one by one the inodes freed in the last 60 s (300 s while their
# inode table block is not yet written back: the kernel's `recently_deleted`): a profile of
# curl -Z right after 4,000 small files were deleted spent most of its time there, and a round of
# bench/many.sh after such a deletion ran every tool several times slower.
bench_discard() {
    local path
    mkdir -p "$DISCARD_DIR"
    for path in "$@"; do
        [ -e "$path" ] || continue
        # A tmpfs forgets at once, and a move to another file system would copy: deleted at once.
        if [ "$(stat -f -c %T "$path")" = tmpfs ] || [ "$(stat -c %d "$path")" != "$(stat -c %d "$DISCARD_DIR")" ]; then
            rm -rf "$path"
        else
            mv "$path" "$DISCARD_DIR/$RANDOM$RANDOM"
        fi
    done
    true
}

# bench_settle: deletes what earlier runs discarded, writes the inode tables back, then waits until
# those inodes no longer count as freshly freed, before anything is measured.
bench_settle() {
    if [ -d "$DISCARD_DIR" ] && [ -n "$(ls -A "$DISCARD_DIR")" ]; then
        rm -rf "$DISCARD_DIR"
        sync
        echo "(deleted the files of earlier runs; waiting 61 s before measuring, see bench_discard)" >&2
        sleep 61
    fi
}

# bench_rounds RUNS EXPECTED_DIR OUT [PATH...]: runs the caller's `commands` (named by its `labels`)
# round by round, each once a round, so that a drift of this machine's speed reaches them alike.
# Before each run OUT and the PATHs are discarded; after it OUT must equal EXPECTED_DIR. Appends each
# run's "wall cpu rss" line to the caller's associative array `results`, by label.
bench_rounds() {
    local runs="$1" expected="$2" out="$3" index label line
    shift 3
    for _ in $(seq "$runs"); do
        for index in "${!labels[@]}"; do
            label="${labels[$index]}"
            bench_discard "$out" "$@"
            line=$(measure "$label" sh -c "${commands[$index]}") || { echo "$label failed" >&2; exit 1; }
            diff -rq "$out" "$expected" >&2 \
                || { echo "$label: the files differ from the served ones (above)" >&2; exit 1; }
            results[$label]+="${line#"$label "}"$'\n'
        done
    done
}

# measure LABEL COMMAND...: runs the command under /usr/bin/time and prints "LABEL wall cpu maxrss_kib".
measure() {
    local label="$1"
    shift
    local report errors status=0
    report=$(mktemp)
    errors=$(mktemp)
    # Start each run with no dirty pages left by the previous one.
    sync
    /usr/bin/time -f "%e %U %S %M" -o "$report" "$@" >/dev/null 2>"$errors" || status=$?
    if [ "$status" -ne 0 ]; then
        # What the tool said, so that a failed run tells why (time's own line is in the report).
        echo "$label FAILED (exit $status): $*" >&2
        tail -n 5 "$errors" >&2
        rm -f "$report" "$errors"
        echo "$label FAILED"
        return 1
    fi
    read -r wall user system rss < "$report"
    rm -f "$report" "$errors"
    printf '%s %s %.2f %s\n' "$label" "$wall" "$(echo "$user + $system" | bc -l)" "$rss"
}
