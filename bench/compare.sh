#!/usr/bin/env bash
# Haul against curl, wget, aria2c and axel on the same files from a local nginx on loopback, in the
# same run. Prints a Markdown table with wall time, CPU time, peak RSS, throughput and the ratios to
# curl and to aria2c. Each command runs RUNS times (default 3); the table shows the median run.
# `sync` runs before every measurement so no tool pays for another's dirty pages.
#
#   bench/compare.sh [SIZE_MIB]              1. one file (default 4096 MiB), unthrottled
#   bench/compare.sh --throttled [SIZE_MIB]  2. one file (default 1024 MiB), nginx limits each connection to 20 MB/s
#   bench/compare.sh --many [COUNT]          3. COUNT files of 16 KiB (default 2000), 16 at a time
#   bench/compare.sh --https [SIZE_MIB]      4. one file (default 1024 MiB) over TLS, HTTP/2 where the tool speaks it
#   bench/compare.sh --https-many [COUNT]    5. as 3, over TLS with HTTP/2
#   bench/compare.sh --paced [SIZE_MIB]      6. one file (default 1024 MiB) over TLS with HTTP/2 offered, each
#                                               TCP connection held to 20 MiB/s (bench/paced_relay.py)
#   RUNS=5 bench/compare.sh 1024
#   HAUL_BIN=/path/to/haul bench/compare.sh ...   measure another build of haul
set -euo pipefail
source "$(dirname "$0")/lib.sh"

mode=single
case "${1:-}" in
    --throttled) mode=throttled; shift ;;
    --many) mode=many; shift ;;
    --https) mode=https; shift ;;
    --https-many) mode=https-many; shift ;;
    --paced) mode=paced; shift ;;
esac
runs="${RUNS:-3}"
bench_install
command -v bc >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bc; }
bench_haul
out="$DATA_DIR/out"
state="$DATA_DIR/haul-state"
mkdir -p "$out"

declare -a labels commands
add() { labels+=("$1"); commands+=("$2"); }

curl_label="curl -o"
case "$mode" in
    single | throttled | https | paced)
        if [ "$mode" = single ]; then size="${1:-4096}"; else size="${1:-1024}"; fi
        bench_file "compare.bin" "$size"
        path="compare.bin"
        [ "$mode" = throttled ] && path="slow/compare.bin"
        url="$BASE_URL/$path"
        [ "$mode" = https ] && url="$TLS_URL/$path"
        [ "$mode" = paced ] && url="$PACED_URL/$path"
        target="$out/compare.bin"
        units="$size"
        unit="MiB/s"
        haul="$HAUL get $url -o $target -q --state-dir $state"
        if [ "$mode" = paced ]; then
            title="One ${size} MiB file over TLS (HTTP/2 for haul and curl), each TCP connection held to 20 MiB/s"
            aria="aria2c -q --ca-certificate=$CA_CERT --allow-overwrite=true --file-allocation=none -d $out -o compare.bin"
            haul="$haul --ca-cert $CA_CERT"
            add "haul get -x 1" "$haul -x 1"
            add "haul get (default: 1, up to 4)" "$haul"
            add "haul get -x 4" "$haul -x 4"
            add "haul get -x 4 --no-http2" "$haul -x 4 --no-http2"
            add "curl -o" "curl -sS --http2 --cacert $CA_CERT -o $target $url"
            add "aria2c -x1" "$aria -x1 $url"
            add "aria2c -x4 -s4" "$aria -x4 -s4 $url"
            add "axel -n 4 -k" "axel -q -k -n 4 -o $target $url"
            aria_label="aria2c -x4 -s4"
        elif [ "$mode" = https ]; then
            title="One ${size} MiB file over TLS on loopback (HTTP/2 for haul and curl)"
            aria="aria2c -q --ca-certificate=$CA_CERT --allow-overwrite=true --file-allocation=none -d $out -o compare.bin"
            haul="$haul --ca-cert $CA_CERT"
            add "haul get -x 1" "$haul -x 1"
            add "haul get (default: 1, up to 4)" "$haul"
            add "haul get -x 4" "$haul -x 4"
            add "haul get -x 4 --no-http2" "$haul --no-http2 -x 4"
            add "haul get -x 8 --no-http2" "$haul -x 8 --no-http2"
            add "curl -o" "curl -sS --http2 --cacert $CA_CERT -o $target $url"
            add "curl -o && sync" "curl -sS --http2 --cacert $CA_CERT -o $target $url && sync $target"
            add "wget -O" "wget -q --ca-certificate=$CA_CERT -O $target $url"
            add "aria2c -x1" "$aria -x1 $url"
            add "aria2c -x8 -s8" "$aria -x8 -s8 $url"
            add "axel -n 8 -k" "axel -q -k -n 8 -o $target $url"
            aria_label="aria2c -x1"
        elif [ "$mode" = single ]; then
            title="One ${size} MiB file over loopback"
            add "haul get -x 1" "$haul -x 1"
            add "haul get (default: 1, up to 4)" "$haul"
            add "haul get -x 4" "$haul -x 4"
            add "haul get -x 8" "$haul -x 8"
            add "curl -o" "curl -sS -o $target $url"
            add "curl -o && sync" "curl -sS -o $target $url && sync $target"
            add "wget -O" "wget -q -O $target $url"
            add "aria2c -x1" "aria2c -q -x1 --allow-overwrite=true --file-allocation=none -d $out -o compare.bin $url"
            add "aria2c -x8 -s8" "aria2c -q -x8 -s8 --allow-overwrite=true --file-allocation=none -d $out -o compare.bin $url"
            add "axel -n 8" "axel -q -n 8 -o $target $url"
            aria_label="aria2c -x1"
        else
            title="One ${size} MiB file, nginx limit_rate 20m per connection"
            add "haul get -x 8" "$haul -x 8"
            add "aria2c -x8 -s8 -k1M" "aria2c -q -x8 -s8 -k1M --allow-overwrite=true --file-allocation=none -d $out -o compare.bin $url"
            add "axel -n 8" "axel -q -n 8 -o $target $url"
            add "curl -o" "curl -sS -o $target $url"
            aria_label="aria2c -x8 -s8 -k1M"
        fi
        check() { cmp -s "$target" "$DATA_DIR/www/compare.bin"; }
        clean() { rm -rf "$out"/compare.bin* "$state"; }
        ;;
    many | https-many)
        count="${1:-2000}"
        base="$BASE_URL"
        tls=""
        if [ "$mode" = https-many ]; then
            base="$TLS_URL"
            tls="yes"
        fi
        mkdir -p "$DATA_DIR/www/many"
        for i in $(seq "$count"); do
            [ -f "$DATA_DIR/www/many/f$i" ] || head -c 16384 /dev/urandom > "$DATA_DIR/www/many/f$i"
        done
        seq "$count" | sed "s|^|$base/many/f|" > "$DATA_DIR/many.txt"
        sed 's|^\(.*\)$|url = "\1"|' "$DATA_DIR/many.txt" > "$DATA_DIR/many.curl"
        title="$count files of 16 KiB, 16 at a time"
        haul_tls="" curl_tls="" aria_tls="" wget_tls=""
        if [ -n "$tls" ]; then
            title="$title, over TLS (HTTP/2 for haul and curl)"
            haul_tls="--ca-cert $CA_CERT" curl_tls="--cacert $CA_CERT"
            aria_tls="--ca-certificate=$CA_CERT" wget_tls="--ca-certificate=$CA_CERT"
        fi
        units="$count"
        unit="files/s"
        target="$out/many"
        add "haul get -i -j 16" "$HAUL get -i $DATA_DIR/many.txt -j 16 -d $target -q --state-dir $state $haul_tls"
        add "curl -Z --parallel-max 16" "mkdir -p $target && cd $target && curl -sS $curl_tls -Z --parallel-max 16 --remote-name-all -K $DATA_DIR/many.curl"
        add "curl -Z && sync" "mkdir -p $target && cd $target && curl -sS $curl_tls -Z --parallel-max 16 --remote-name-all -K $DATA_DIR/many.curl && sync -f ."
        add "aria2c -i -j 16" "aria2c -q $aria_tls -i $DATA_DIR/many.txt -j 16 --allow-overwrite=true --file-allocation=none -d $target"
        add "wget -i" "wget -q $wget_tls -i $DATA_DIR/many.txt -P $target"
        aria_label="aria2c -i -j 16"
        curl_label="curl -Z --parallel-max 16"
        check() { diff -rq "$target" "$DATA_DIR/www/many" >/dev/null; }
        # The previous run's files are moved aside, not deleted (see bench_discard).
        bench_settle
        clean() { bench_discard "$target" "$state"; }
        ;;
esac

bench_start_nginx
trap 'bench_stop_relay; bench_stop_nginx' EXIT
[ "$mode" = paced ] && bench_start_relay $((20 * 1024 * 1024))

declare -A median_wall median_cpu median_rss
for index in "${!labels[@]}"; do
    label="${labels[$index]}"
    results=()
    for _ in $(seq "$runs"); do
        clean
        line=$(measure "$label" sh -c "${commands[$index]}") || { echo "$label failed" >&2; exit 1; }
        check || { echo "$label: wrong bytes" >&2; exit 1; }
        results+=("${line#"$label "}")
    done
    middle=$(printf '%s\n' "${results[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p")
    read -r wall cpu rss <<<"$middle"
    median_wall[$label]=$wall
    median_cpu[$label]=$cpu
    median_rss[$label]=$rss
done
clean

curl_rate=$(echo "$units / ${median_wall[$curl_label]}" | bc -l)
aria_rate=$(echo "$units / ${median_wall[$aria_label]}" | bc -l)
echo "$title, median of $runs runs ($(nproc) cores, $(date -u +%Y-%m-%d))"
echo
echo "| tool | wall s | CPU s | peak RSS MiB | $unit | × curl | × aria2c |"
echo "|---|---|---|---|---|---|---|"
for label in "${labels[@]}"; do
    wall=${median_wall[$label]}
    rate=$(echo "$units / $wall" | bc -l)
    printf '| %s | %.2f | %.2f | %.1f | %.0f | %.2f | %.2f |\n' "$label" "$wall" "${median_cpu[$label]}" \
        "$(echo "${median_rss[$label]} / 1024" | bc -l)" "$rate" "$(echo "$rate / $curl_rate" | bc -l)" \
        "$(echo "$rate / $aria_rate" | bc -l)"
done
