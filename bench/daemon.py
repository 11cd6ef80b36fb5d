#!/usr/bin/env python3
"""How `haul daemon` holds up under many clients and a long queue.

Starts the test server and a release `haul daemon` (3 downloads at once, each held to 200 KiB/s, so
the rest stay queued), then:
  1. queues 1,000 downloads and opens 100 event-stream clients, and reads the daemon's peak RSS
     after a while of progress events going to all of them;
  2. grows the queue to 10,000 downloads and times `GET /api/v1/downloads` (a page of 100, a page
     of 1,000) and `GET /api/v1/stats`, median of 20 each.
Prints a Markdown table.

    bench/daemon.py [--bin .build/release]
"""
import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=".build/release")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="haul-daemon-bench-")
    state, root = os.path.join(work, "state"), os.path.join(work, "files")
    os.makedirs(root)
    processes = []
    try:
        server = subprocess.Popen([os.path.join(args.bin, "haul-test-server"), "f.bin:100000000:204800"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        processes.append(server)
        files = server.stdout.readline().strip()
        daemon = subprocess.Popen([os.path.join(args.bin, "haul"), "daemon", "--listen", "127.0.0.1:0",
                                   "--state-dir", state, "--download-root", root, "-j", "3", "-x", "1",
                                   "--log-level", "warning"], stderr=subprocess.DEVNULL)
        processes.append(daemon)
        address = os.path.join(state, "daemon.address")
        for _ in range(300):
            if os.path.exists(address):
                break
            time.sleep(0.05)
        host, port = open(address).read().split()[0].removeprefix("http://").split(":")
        token = open(os.path.join(state, "daemon.token")).read().strip()
        headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}

        def call(method, path, body=None):
            connection = http.client.HTTPConnection(host, int(port), timeout=60)
            connection.request(method, "/api/v1" + path, body=json.dumps(body) if body else None, headers=headers)
            response = connection.getresponse()
            data = response.read()
            connection.close()
            if response.status >= 300:
                sys.exit(f"{method} {path}: {response.status} {data[:200]}")
            return json.loads(data) if data else None

        def add(first, count):
            for start in range(first, first + count, 500):
                items = [{"url": f"{files}/f.bin?n={n}", "destination": f"f{n}.bin"}
                         for n in range(start, min(first + count, start + 500))]
                call("POST", "/downloads", {"downloads": items})

        def vm(field):
            for line in open(f"/proc/{daemon.pid}/status"):
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
            return 0.0

        # 1. 1,000 queued, 100 listeners.
        started = time.monotonic()
        add(0, 1000)
        added_1000 = time.monotonic() - started
        received = [0] * 100
        stop = threading.Event()

        def listen(index):
            connection = http.client.HTTPConnection(host, int(port), timeout=60)
            connection.request("GET", "/api/v1/events", headers=headers)
            response = connection.getresponse()
            while not stop.is_set():
                line = response.fp.readline()
                if not line:
                    break
                if line.startswith(b"event: "):
                    received[index] += 1

        listeners = [threading.Thread(target=listen, args=(index,), daemon=True) for index in range(100)]
        for listener in listeners:
            listener.start()
        time.sleep(10)
        rss_1000 = vm("VmHWM:")
        events = sum(received)
        quiet = sum(1 for count in received if count == 0)

        # 2. 10,000 queued: list and stats.
        add(1000, 9000)
        total = call("GET", "/downloads?limit=1")["total"]

        def timed(path):
            samples = []
            for _ in range(20):
                begin = time.perf_counter()
                call("GET", path)
                samples.append((time.perf_counter() - begin) * 1000)
            return statistics.median(samples)

        page_100, page_1000, stats = timed("/downloads"), timed("/downloads?limit=1000"), timed("/stats")
        rss_10000 = vm("VmHWM:")
        stop.set()

        print(f"haul daemon under load ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores)\n")
        print("| measurement | figure | target |")
        print("|---|---|---|")
        print(f"| 1,000 downloads added (2 requests of 500) | {added_1000 * 1000:.0f} ms | |")
        print(f"| peak RSS, 1,000 queued, 100 event streams, 10 s | {rss_1000:.1f} MiB | < 150 MiB |")
        print(f"| events delivered in those 10 s (streams that got none) | {events} ({quiet}) | every stream |")
        print(f"| GET /api/v1/downloads, {total:,} recorded, page of 100 | {page_100:.1f} ms | < 100 ms |")
        print(f"| GET /api/v1/downloads?limit=1000, {total:,} recorded | {page_1000:.1f} ms | |")
        print(f"| GET /api/v1/stats, {total:,} recorded | {stats:.1f} ms | |")
        print(f"| peak RSS, {total:,} recorded | {rss_10000:.1f} MiB | |")
    finally:
        for process in reversed(processes):
            if process.stdin:
                process.stdin.close()
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
