#!/usr/bin/env python3
"""Runs Examples/DownloadQueue as a user would: three downloads from the test server, the program
killed (SIGKILL) mid-transfer, then run again with the same arguments. The second run must find
what the first stored, finish every file, and each file must equal the server's bytes.

It runs once with each transport the program offers (`--transport`): Haul's own client, URLSession
with data tasks, and URLSession with download tasks. A download task's body is URLSession's until
the task ends, so with it the first run is killed while the server is still sending and the second
run fetches the files again; everything else is asserted alike.

    scripts/example-test.py [--bin .build/debug] [--transport haul|urlsession|urlsession-files]
"""
import argparse
import os
import shutil
import signal
import subprocess
import tempfile
import time

from checks import failer, sha256_of_file, sha256_of_url

DEADLINE = 60  # seconds any one step may take


fail = failer("example test")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=".build/debug")
    parser.add_argument("--transport", action="append", choices=TRANSPORTS)
    args = parser.parse_args()
    for transport in args.transport or TRANSPORTS:
        run(args.bin, transport)


TRANSPORTS = ["haul", "urlsession", "urlsession-files"]


def run(bin, transport):
    streams = transport != "urlsession-files"
    work = tempfile.mkdtemp(prefix="haul-example-")
    state, target = os.path.join(work, "state"), os.path.join(work, "files")
    os.makedirs(target)
    names = ["movie.mkv", "dataset.tar", "notes.txt"]
    server = subprocess.Popen(
        [os.path.join(bin, "haul-test-server"), "movie.mkv:6000000:1000000", "dataset.tar:4000000:800000",
         "notes.txt:30000"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        base = server.stdout.readline().strip()
        if not base.startswith("http://"):
            fail("the test server did not start")
        command = [os.path.join(bin, "download-queue-example"), "--transport", transport, state, target]
        command += [f"{base}/{n}" for n in names]

        # First run: killed once both large files have some of their bytes on disk (with download
        # tasks, once it has shown progress for a second, while the server is still sending).
        first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started = time.monotonic()
        end = started + DEADLINE
        partials = [os.path.join(target, name + ".haul.part") for name in names[:2]]
        while time.monotonic() < end:
            if streams and all(os.path.exists(p) and os.path.getsize(p) > 500_000 for p in partials):
                break
            if not streams and time.monotonic() - started > 1.5:
                break
            if first.poll() is not None:
                fail(f"the first run ended before it was killed: {first.stdout.read()}")
            time.sleep(0.05)
        else:
            fail("the first run stored too little in time")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=DEADLINE)
        shown = first.stdout.read()
        if "downloads:" not in shown:
            fail(f"the first run showed no progress: {shown!r}")
        if any(os.path.exists(os.path.join(target, name)) for name in names[:2]):
            fail("a final name appeared before its file was complete")

        # Second run: the same command finds the stored bytes and finishes.
        second = subprocess.run(command, capture_output=True, text=True, timeout=2 * DEADLINE)
        if second.returncode != 0:
            fail(f"the second run exited {second.returncode}: {second.stdout} {second.stderr}")
        for name in names[:2]:
            if streams and (f"{name}: queued" not in second.stdout or "already here" not in second.stdout):
                fail(f"the second run did not pick up {name}: {second.stdout}")
        for name in names:
            path = os.path.join(target, name)
            if f"saved {path}" not in second.stdout:
                fail(f"{name} is not reported saved: {second.stdout}")
            if sha256_of_file(path) != sha256_of_url(f"{base}/{name}"):
                fail(f"{name} differs from the server's file")
        print(f"example test ({transport}): passed; the program was killed mid-transfer and finished on the next run")
    finally:
        server.stdin.close()
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
