# Shared helpers for Haul's benchmarks: a local nginx on loopback serving generated files.
# Sourced by the bench scripts; everything lives under bench/data (ignored by git).

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_DIR="$(cd "$BENCH_DIR/.." && pwd)"
DATA_DIR="${HAUL_BENCH_DATA:-$BENCH_DIR/data}"
PORT="${HAUL_BENCH_PORT:-8089}"
BASE_URL="http://127.0.0.1:$PORT"

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

# bench_file NAME SIZE_MIB: a file of random bytes under $DATA_DIR/www, made once.
bench_file() {
    local path="$DATA_DIR/www/$1"
    mkdir -p "$DATA_DIR/www"
    if [ ! -f "$path" ] || [ "$(stat -c %s "$path")" != "$(($2 * 1024 * 1024))" ]; then
        head -c "$(($2 * 1024 * 1024))" /dev/urandom > "$path.tmp" && mv "$path.tmp" "$path"
    fi
}

# Starts nginx on 127.0.0.1:$PORT serving $DATA_DIR/www; `/slow/` is limited to 20 MB/s per connection.
bench_start_nginx() {
    mkdir -p "$DATA_DIR/nginx/logs" "$DATA_DIR/www"
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
        root $DATA_DIR/www;
        location /slow/ { alias $DATA_DIR/www/; limit_rate 20m; }
    }
}
CONF
    bench_stop_nginx
    nginx -c "$DATA_DIR/nginx/nginx.conf" -p "$DATA_DIR/nginx"
    for _ in $(seq 50); do curl -sf -o /dev/null "$BASE_URL/" -r 0-0 2>/dev/null && break; sleep 0.1; done
}

bench_stop_nginx() {
    if [ -f "$DATA_DIR/nginx/nginx.pid" ]; then
        kill "$(cat "$DATA_DIR/nginx/nginx.pid")" 2>/dev/null || true
        sleep 0.3
    fi
}

# measure LABEL COMMAND...: runs the command under /usr/bin/time and prints "LABEL wall cpu maxrss_kib".
measure() {
    local label="$1"
    shift
    local report
    report=$(mktemp)
    # Start each run with no dirty pages left by the previous one.
    sync
    /usr/bin/time -f "%e %U %S %M" -o "$report" "$@" >/dev/null 2>&1 || { echo "$label FAILED"; rm -f "$report"; return 1; }
    read -r wall user system rss < "$report"
    rm -f "$report"
    printf '%s %s %.2f %s\n' "$label" "$wall" "$(echo "$user + $system" | bc -l)" "$rss"
}
