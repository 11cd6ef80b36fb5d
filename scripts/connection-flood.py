#!/usr/bin/env python3
"""Holds thousands of idle and half-sent connections against a `haul daemon` and checks that its API
still answers, that it holds no more connections than its cap, and that its memory comes back once
they are gone.

    scripts/connection-flood.py [--bin DIR] [--idle N] [--partial N]

Prints the figures (daemon RSS, open descriptors, the API call's time) and exits 1 with one line
per broken rule. CI runs it with the defaults (3,000 of each); it needs nothing but Python.
"""
import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import failer  # noqa: E402

fail = failer("connection flood")

CAP = 1024  # ConnectionLimits.maximumConnections, the daemon's default


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def api(url, token, path="/api/v1/stats", timeout=10):
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {token}"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        body = answer.read()
        return answer.status, time.monotonic() - started, body


def metric(url, token, name):
    _, _, body = api(url, token, "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return int(line.split()[1])
    return -1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=".build/debug")
    parser.add_argument("--idle", type=int, default=3000)
    parser.add_argument("--partial", type=int, default=3000)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.idle + args.partial + 200
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(wanted, soft)), hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    count = min(args.idle + args.partial, soft - 200)

    work = tempfile.mkdtemp(prefix="haul-flood-")
    os.makedirs(work + "/files")
    log = open(work + "/daemon.log", "w")
    daemon = subprocess.Popen(
        [args.bin + "/haul", "daemon", "--listen", "127.0.0.1:0", "--state-dir", work + "/state",
         "--download-root", work + "/files", "--log-level", "warning"], stderr=log)
    held = []
    problems = []
    try:
        address = work + "/state/daemon.address"
        for _ in range(300):
            if os.path.exists(address):
                break
            time.sleep(0.05)
        else:
            fail("the daemon did not start: " + open(work + "/daemon.log").read())
        url = open(address).read().split()[0]
        port = int(url.rsplit(":", 1)[1])
        token = subprocess.check_output(
            [args.bin + "/haul", "daemon", "--print-token", "--state-dir", work + "/state"], text=True).strip()
        for _ in range(20):
            api(url, token)
        before_rss, before_fds = rss_kib(daemon.pid), descriptors(daemon.pid)

        for index in range(count):
            connection = socket.create_connection(("127.0.0.1", port), timeout=10)
            if index % 2 == 1:
                connection.sendall(b"GET /api/v1/stats HTTP/1.1\r\nHost: 127.0.0")
            held.append(connection)
        time.sleep(1)
        status, seconds, _ = api(url, token)
        held_fds = descriptors(daemon.pid)
        held_rss = rss_kib(daemon.pid)
        open_connections = metric(url, token, "haul_api_connections")
        if status != 200 or seconds > 5:
            problems.append(f"the API answered {status} after {seconds:.2f} s with {count} connections held")
        if open_connections > CAP or held_fds > before_fds + CAP + 64:
            problems.append(f"the daemon holds {open_connections} connections, {held_fds} descriptors")

        for connection in held:
            connection.close()
        held = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and metric(url, token, "haul_api_connections") > 2:
            time.sleep(0.2)
        for _ in range(20):
            api(url, token)
        after_rss, after_fds = rss_kib(daemon.pid), descriptors(daemon.pid)
        if after_fds > before_fds + 8:
            problems.append(f"descriptors did not come back: {before_fds} before, {after_fds} after")
        if after_rss > before_rss + 64 * 1024:
            problems.append(f"memory did not come back: {before_rss} KiB before, {after_rss} KiB after")
        print(json.dumps({
            "connections": count, "apiSeconds": round(seconds, 3), "openWhileHeld": open_connections,
            "descriptors": {"before": before_fds, "held": held_fds, "after": after_fds},
            "rssKiB": {"before": before_rss, "held": held_rss, "after": after_rss},
        }))
    finally:
        for connection in held:
            connection.close()
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(work, ignore_errors=True)
    for problem in problems:
        print("connection flood: " + problem, file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
