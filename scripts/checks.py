"""What the scripts that run haul as users do share: a one-line failure and the SHA-256 of what a
server serves or a file holds."""
import hashlib
import subprocess
import sys
import time
import urllib.request


def failer(name):
    """A function that prints `NAME: FAILED: message` and exits 1."""
    def fail(message):
        print(f"{name}: FAILED: {message}", file=sys.stderr)
        sys.exit(1)
    return fail


def sha256_of_url(url, timeout=30):
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        while chunk := response.read(1 << 16):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 16):
            digest.update(chunk)
    return digest.hexdigest()


def poll(condition, timeout, interval=0.05):
    """The first true value of `condition` within `timeout` seconds, else None; an exception (an
    element re-rendered while it is read, a page still loading) counts as not yet."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = condition()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(interval)
    return None


def waiter(fail, deadline):
    """`wait_for(what, condition, timeout=deadline)`: `condition`'s first true value, or `fail`
    naming what did not happen in time."""
    def wait_for(what, condition, timeout=deadline):
        value = poll(condition, timeout)
        if not value:
            fail(f"timed out waiting until {what}")
        return value
    return wait_for


def stop_processes(processes):
    """Ends the processes a test started, the last first: standard input closed, SIGTERM, and
    SIGKILL for one still there after 10 s."""
    for process in reversed(processes):
        if process.stdin:
            process.stdin.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
