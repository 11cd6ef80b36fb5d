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
exec {out}> >(tee "$log")
tee_pid=$!
# A session of its own, so that every process the command starts can be found and ended (those
# in process groups of their own too).
setsid stdbuf -oL "$@" >&"$out" 2>&1 &
leader=$!
end_all() {
    kill -KILL -- "-$leader" 2>/dev/null
    pkill -KILL -s "$leader" 2>/dev/null
}
trap 'end_all; exit 130' INT TERM
# Every line written before the script ends.
finish() {
    exec {out}>&-
    wait "$tee_pid" 2>/dev/null
    rm -f "$log"
}

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
                timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt" 2>&1 \
                    | grep -E "^Thread|^#|ptrace|denied" | cut -c1-200 | head -400
            else
                echo "   (gdb is not installed: no threads)"
            fi
        done
        end_all
        wait "$leader" 2>/dev/null
        finish
        exit 124
    fi
    sleep 2
done
wait "$leader"
status=$?
# Whatever the command left running (a process of its own group) ends with it.
pkill -KILL -s "$leader" 2>/dev/null
finish
exit "$status"
