#!/usr/bin/env bash
# Runs a test command with a deadline, its output line by line, so that a run that hangs ends
# and says where: past SECONDS it prints the tests that started and never ended, and the
# threads of every process the command started, then ends them all and exits with 124.
#
# Usage: scripts/with-deadline.sh SECONDS COMMAND [ARGUMENT...]
#
# Without it a test run that hangs is ended only by the machine's own limit, and its last
# lines are lost: piped, the test runner's output is written in blocks of 4 KiB.
set -uo pipefail

if [ "$#" -lt 2 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
    echo "usage: $0 SECONDS COMMAND [ARGUMENT...]" >&2
    exit 64
fi
deadline=$1
shift

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# A session of its own, so that every process the command starts can be found and ended.
setsid stdbuf -oL -eL "$@" > >(tee "$log") 2>&1 &
leader=$!

started=$SECONDS
while kill -0 "$leader" 2>/dev/null; do
    if [ $((SECONDS - started)) -ge "$deadline" ]; then
        echo "== the command ran past its deadline of ${deadline} s: $*"
        echo "== tests started and never ended:"
        python3 - "$log" <<'EOF'
import re, sys
started, ended = [], set()
for line in open(sys.argv[1], errors="replace"):
    begun = re.search(r"Test (.+?) started\.", line)
    if begun and "case passing" not in line:
        started.append(begun.group(1))
    over = re.search(r"Test (.+?) (passed|failed|skipped)", line)
    if over:
        ended.add(over.group(1))
for name in started:
    if name not in ended:
        print("   ", name)
EOF
        echo "== the processes of the command, and their threads:"
        for pid in $(pgrep -s "$leader"); do
            echo "-- $(ps -o pid=,etime=,args= -p "$pid" | cut -c1-200)"
            if command -v gdb >/dev/null; then
                timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt" 2>/dev/null \
                    | grep -E "^Thread|^#" | cut -c1-200 | head -400
            fi
        done
        kill -KILL -- "-$leader" 2>/dev/null
        wait "$leader" 2>/dev/null
        exit 124
    fi
    sleep 2
done
wait "$leader"
