#!/usr/bin/env python3
"""aria2's JSON-RPC interface of `haul daemon` (`POST /jsonrpc`, WebSocket `/jsonrpc`), against aria2 itself.

Starts the test server (`haul-test-server`) and `haul daemon` on free ports with a temporary state
directory; the daemon's token is the aria2 secret (`token:SECRET` as the first parameter).

Part A: aria2p (PyPI) drives the daemon as it drives aria2: adds a fast download, a throttled one
and one whose URL answers 404; follows their status names; pauses and resumes the throttled one,
removes it; checks the finished file's bytes and the global stats; listens to the notifications
over aria2p's WebSocket and checks each arrives with the right GID.

Part B: a differential against a real aria2c (same secret, the same test-server files): one
scripted sequence of raw JSON-RPC calls runs against aria2c, then against the daemon, and the SHAPE
of every answer is compared (object keys, JSON types, decimal strings where aria2 writes numbers,
error codes, HTTP status, a few values such as statuses, GIDs and "OK"). A difference must be in
KNOWN_DIFFERENCES (and each entry there must still occur), else the test fails.

    scripts/aria2-rpc-test.py [--bin .build/debug] [--dump DIR]
    scripts/aria2-rpc-test.py --self-check [--bin .build/debug]   # both parts against aria2c, no Haul

--self-check proves the harness: part A against an aria2c, part B with aria2c on both sides (no
difference may appear). It needs only haul-test-server from --bin. --dump writes each side's answers
of part B as JSON. Needs aria2c (Debian: aria2) and aria2p (PyPI; brings websocket-client).
"""
import argparse
import fnmatch
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

from checks import failer, sha256_of_file, sha256_of_url, stop_processes, waiter

DEADLINE = 20  # seconds any one expected state may take

fail = failer("aria2 rpc test")

try:
    import aria2p
    import websocket
except ImportError as error:
    fail(f"needs aria2p (PyPI) and websocket-client: {error}")

# Differences between aria2c's answers and the daemon's that are allowed: (step, json-path, reason).
# A step is the label printed with a difference (its method, then what it is about in brackets);
# both patterns are fnmatch patterns. Paths: `result.files[0].path`, `result[gid=A].status` (lists of
# downloads are matched by GID), `(http)` the HTTP status, `(content-type)`. A label's `[` is
# written `[[]` (fnmatch reads brackets as a set). Each entry is in docs/aria2-rpc.md, with why.
KNOWN_DIFFERENCES = [
    ("aria2.getOption*", "result.*", "Haul has only the options it implements; aria2 lists ~80 per download"),
    ("aria2.getGlobalOption", "result.*", "Haul has only the options it implements; aria2 lists 129"),
    ("aria2.tell*", "result*.bitfield", "Haul keeps no pieces of aria2's kind: no bitfield"),
    ("aria2.tell*", "result*.numPieces", "Haul keeps no pieces of aria2's kind: no numPieces"),
    ("aria2.tell*", "result*.pieceLength", "Haul keeps no pieces of aria2's kind: no pieceLength"),
    ("aria2.tellWaiting [[]after pauseAll]", "result",
     "a download paused while running keeps its place in Haul's line; aria2 moves it to the front"),
]

# Keys whose values aria2 writes as decimal strings: the daemon must too.
DECIMAL_KEYS = {"completedLength", "totalLength", "downloadSpeed", "uploadSpeed", "uploadLength", "connections",
                "numPieces", "pieceLength", "errorCode", "numActive", "numWaiting", "numStopped",
                "numStoppedTotal", "index", "length", "max-concurrent-downloads", "max-overall-download-limit"}
# Keys whose values must be equal on both sides (GIDs are compared by the name the sequence gave them).
EQUAL_KEYS = {"gid", "errorCode", "numActive", "numWaiting", "numStopped", "selected"}


wait_for = waiter(fail, DEADLINE)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Side:
    """One JSON-RPC server: aria2c or the daemon."""

    def __init__(self, name, port, secret, directory, kind):
        self.name, self.port, self.secret, self.directory, self.kind = name, port, secret, directory, kind
        self.url = f"http://127.0.0.1:{port}/jsonrpc"

    def post(self, body, timeout=DEADLINE):
        """(HTTP status, Content-Type, parsed JSON or None, text) of a POST of `body` (bytes)."""
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, headers, text = response.status, response.headers, response.read().decode()
        except urllib.error.HTTPError as error:
            status, headers, text = error.code, error.headers, error.read().decode()
        except OSError as error:
            fail(f"{self.name} did not answer a JSON-RPC request: {error}")
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        return status, (headers.get("Content-Type") or "").split(";")[0].strip(), parsed, text

    def call(self, method, params=(), token=True):
        """The `result` of a call, or None when it answered an error."""
        params = ([f"token:{self.secret}"] if token else []) + list(params)
        _, _, answer, _ = self.post(json.dumps({"jsonrpc": "2.0", "id": "poll", "method": method,
                                                "params": params}).encode())
        return answer.get("result") if isinstance(answer, dict) else None


def start_aria2c(work, secret, name, processes):
    directory = os.path.join(work, name)
    os.makedirs(directory)
    port = free_port()
    aria2c = shutil.which("aria2c") or fail("needs aria2c (Debian: aria2)")
    process = subprocess.Popen(
        [aria2c, "--enable-rpc", f"--rpc-listen-port={port}", f"--rpc-secret={secret}", f"--dir={directory}",
         "--no-conf", "--quiet", "--rpc-listen-all=false", f"--save-session={os.path.join(directory, 'session')}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    processes.append(process)

    def listening():
        if process.poll() is not None:
            fail(f"aria2c exited with {process.returncode}")
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    wait_for(f"{name} listens", listening)
    return Side(name, port, secret, directory, "aria2")


def start_haul(haul, work, processes):
    state, root = os.path.join(work, "state"), os.path.join(work, "haul-files")
    os.makedirs(root)
    log = open(os.path.join(work, "daemon.log"), "w")
    daemon = subprocess.Popen([haul, "daemon", "--listen", "127.0.0.1:0", "--state-dir", state,
                               "--download-root", root], stdout=log, stderr=subprocess.STDOUT)
    processes.append(daemon)
    address = os.path.join(state, "daemon.address")
    wait_for("the daemon writes its address", lambda: os.path.exists(address) and open(address).read().split())
    base = open(address).read().split()[0]
    token = subprocess.run([haul, "daemon", "--print-token", "--state-dir", state], capture_output=True,
                           text=True, check=True, timeout=DEADLINE).stdout.strip()
    side = Side("haul", int(base.rsplit(":", 1)[1]), token, root, "haul")
    side.base = base
    return side


# ---------------------------------------------------------------------------------------------
# Part A: aria2p drives the server.

def answers(side):
    """Fails unless `side` answers aria2.getVersion (a short reason, before anything else runs)."""
    status, _, answer, text = side.post(json.dumps({"jsonrpc": "2.0", "id": "hello", "method": "aria2.getVersion",
                                                    "params": [f"token:{side.secret}"]}).encode())
    if not isinstance(answer, dict) or not isinstance(answer.get("result"), dict):
        fail(f"{side.name} answers aria2.getVersion on POST /jsonrpc with HTTP {status}: {text[:200]!r}")


def part_a(side, files):
    directory = os.path.join(side.directory, "part-a")
    events = {kind: [] for kind in ("start", "pause", "stop", "complete", "error")}

    def recorder(kind):
        return lambda api, gid: events[kind].append(gid)

    # aria2p gives no sign that its WebSocket is open: see its connection being made.
    connected, refused = threading.Event(), []
    create_connection = websocket.create_connection

    def watched_create_connection(*arguments, **options):
        try:
            return create_connection(*arguments, **options)
        except Exception as error:  # aria2p's listener ends quietly on this one
            refused.append(str(error).split(" -+-+- ")[0][:200])
            raise ConnectionRefusedError(refused[-1])
        finally:
            connected.set()

    api = aria2p.API(aria2p.Client(host="http://127.0.0.1", port=side.port, secret=side.secret, timeout=DEADLINE))
    websocket.create_connection = watched_create_connection
    try:
        api.listen_to_notifications(threaded=True, timeout=1, on_download_start=recorder("start"),
                                    on_download_pause=recorder("pause"), on_download_stop=recorder("stop"),
                                    on_download_complete=recorder("complete"), on_download_error=recorder("error"))
        wait_for("aria2p opens its WebSocket", connected.is_set)
        if refused:
            fail(f"aria2p could not open ws://127.0.0.1:{side.port}/jsonrpc: {refused[0]}")
        time.sleep(0.2)  # the handshake's answer is read before the first message can be

        def status(download):
            return api.get_download(download.gid).status

        def add(name):
            try:
                download = api.add_uris([f"{files}/{name}"], {"dir": directory, "out": name})
            except Exception as error:
                fail(f"aria2p's add_uris of {name} failed: {error!r}")
            if not re.fullmatch(r"[0-9a-f]{16}", download.gid):
                fail(f"the GID of {name} is {download.gid!r}, not 16 lower-case hex digits")
            if side.kind == "haul" and int(download.gid, 16) <= 0:
                fail(f"the GID of {name} is {download.gid!r}, not a positive download ID")
            return download

        # Fast and failing first: they finish even when one download at a time runs.
        fast, missing, slow = add("a-fast.bin"), add("a-missing.bin"), add("a-slow.bin")
        if len({fast.gid, missing.gid, slow.gid}) != 3:
            fail(f"three downloads have the GIDs {fast.gid}, {missing.gid}, {slow.gid}")

        wait_for("a-fast.bin is complete", lambda: status(fast) == "complete")
        done = api.get_download(fast.gid)
        path = os.path.join(directory, "a-fast.bin")
        if str(done.files[0].path) != path or done.total_length != 400000 or done.completed_length != 400000:
            fail(f"the complete a-fast.bin reads path {done.files[0].path}, {done.completed_length} of "
                 f"{done.total_length} bytes")
        if sha256_of_file(path) != sha256_of_url(f"{files}/a-fast.bin"):
            fail("a-fast.bin on disk differs from the server's file")
        wait_for("a-missing.bin (404) is error", lambda: status(missing) == "error")
        failed = api.get_download(missing.gid)
        if not failed.error_code or failed.error_code == "0" or not failed.error_message:
            fail(f"the 404 download has errorCode {failed.error_code!r}, errorMessage {failed.error_message!r}")
        wait_for("a-slow.bin is active with bytes",
                 lambda: status(slow) == "active" and api.get_download(slow.gid).completed_length > 0)

        if side.kind == "haul":  # the GID is the download's ID in Haul's own API
            request = urllib.request.Request(side.base + "/api/v1/downloads",
                                             headers={"Authorization": "Bearer " + side.secret})
            with urllib.request.urlopen(request, timeout=DEADLINE) as response:
                listed = {str(d["id"]): d for d in json.load(response)["downloads"]}
            entry = listed.get(str(int(fast.gid, 16)))
            if not entry or entry.get("name") != "a-fast.bin" or entry.get("state") != "completed":
                fail(f"GID {fast.gid} is not a-fast.bin's download ID in /api/v1/downloads: {entry}")

        shown = {d.gid: d.status for d in api.get_downloads()}
        expected = {fast.gid: "complete", missing.gid: "error", slow.gid: "active"}
        if shown != expected:
            fail(f"get_downloads shows {shown}, not {expected}")

        if api.pause([api.get_download(slow.gid)]) != [True]:
            fail("pausing a-slow.bin failed")
        wait_for("a-slow.bin is paused", lambda: status(slow) == "paused")
        if slow.gid not in [d.gid for d in api.get_downloads() if d.status == "paused"]:
            fail("get_downloads does not list the paused a-slow.bin")
        if api.resume([api.get_download(slow.gid)]) != [True]:
            fail("resuming a-slow.bin failed")
        wait_for("a-slow.bin is active again", lambda: status(slow) == "active")

        stats = api.get_stats()
        if (stats.num_active, stats.num_waiting, stats.num_stopped) != (1, 0, 2):
            fail(f"get_stats counts {stats.num_active} active, {stats.num_waiting} waiting, "
                 f"{stats.num_stopped} stopped, not 1, 0, 2")

        # aria2p removes, then drops the download's result: it is gone, or (if the removal had not
        # finished yet) left as "removed"; either way in no list of running or waiting downloads.
        if api.remove([api.get_download(slow.gid)]) != [True]:
            fail("removing a-slow.bin failed")

        def removed():
            if any(d.gid == slow.gid for d in api.get_downloads() if d.status != "removed"):
                return False
            try:
                return status(slow) == "removed"
            except aria2p.ClientException as error:
                return error.code == 1
        wait_for("a-slow.bin is removed (gone, or status removed)", removed)
        if side.kind == "haul":
            wait_for("a-slow.bin's partial data is deleted",
                     lambda: not any(n.startswith("a-slow.bin") for n in os.listdir(directory)))

        # The notifications, with the right GIDs.
        for kind, gid, name in [("start", fast.gid, "a-fast.bin"), ("complete", fast.gid, "a-fast.bin"),
                                ("error", missing.gid, "a-missing.bin"), ("start", slow.gid, "a-slow.bin"),
                                ("pause", slow.gid, "a-slow.bin"), ("stop", slow.gid, "a-slow.bin")]:
            wait_for(f"onDownload{kind.capitalize()} arrives for {name}", lambda: gid in events[kind])
        for kind, gids in [("complete", [missing.gid, slow.gid]), ("error", [fast.gid, slow.gid]),
                           ("stop", [fast.gid, missing.gid]), ("pause", [fast.gid, missing.gid])]:
            if set(gids) & set(events[kind]):
                fail(f"onDownload{kind.capitalize()} arrived for {set(gids) & set(events[kind])}: {events}")

        if not api.purge():
            fail("purge_download_result did not answer OK")
        if api.get_downloads():
            fail(f"after removing and purging, get_downloads shows {[(d.gid, d.status) for d in api.get_downloads()]}")
        if not os.path.exists(path):
            fail("purging the download results deleted the complete a-fast.bin")
    finally:
        websocket.create_connection = create_connection
        api.stop_listening()
    print(f"aria2 rpc test: part A (aria2p against {side.name}) passed")


# ---------------------------------------------------------------------------------------------
# Part B: one sequence against two servers, answers compared by shape.

class Stop(Exception):
    """The server under test did not reach a state the sequence waits for."""


class Session:
    """The sequence's calls against one side, recorded."""

    def __init__(self, side, files, strict):
        self.side, self.files, self.strict = side, files, strict
        self.gids, self.records, self.count = {}, [], 0
        self.directory = os.path.join(side.directory, "part-b")

    def gid(self, name):
        return self.gids.get(name, "ffffffffffffff00")  # an add that failed: a GID nothing has

    def send(self, label, method, body):
        status, content_type, answer, text = self.side.post(body)
        self.records.append({"label": label, "method": method, "http": status, "content-type": content_type,
                             "answer": answer if answer is not None or not text else {"(not JSON)": text[:200]}})
        return answer

    def call(self, method, params=(), label=None, token=True, secret=None):
        self.count += 1
        params = ([secret or f"token:{self.side.secret}"] if token else []) + list(params)
        body = json.dumps({"jsonrpc": "2.0", "id": f"b{self.count}", "method": method, "params": params}).encode()
        answer = self.send(f"{method} [{label}]" if label else method, method, body)
        return answer.get("result") if isinstance(answer, dict) else None

    def raw(self, label, body):
        return self.send(label, label, body)

    def note(self, label, value):
        """A fact found outside JSON-RPC (a file on disk), compared as is."""
        self.records.append({"label": label, "method": "(check)", "fact": value})

    def add(self, name, label, file, options):
        result = self.call("aria2.addUri", [[f"{self.files}/{file}"], {"dir": self.directory, **options}], label)
        if isinstance(result, str):
            self.gids[name] = result

    def state(self, name):
        return self.side.call("aria2.tellStatus", [self.gid(name), ["gid", "status", "totalLength",
                                                                    "completedLength"]]) or {}

    def wait(self, what, condition):
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            if condition():
                return
            time.sleep(0.05)
        if self.strict:
            fail(f"{self.side.name} (the reference) did not reach: {what}")
        raise Stop(f"{self.side.name} did not reach within {DEADLINE} s: {what}")

    def running(self, name):
        state = self.state(name)
        return state.get("status") == "active" and int(state.get("completedLength") or 0) > 0 \
            and int(state.get("totalLength") or 0) > 0

    def all_are(self, names, status):
        return lambda: all(self.state(name).get("status") == status for name in names)


FAST_SIZE = 300000


def sequence(s, fast_sha256):
    """Every call of part B, in order, against one side. Waits poll tellStatus (not recorded)."""
    s.call("system.listMethods", [], token=False)
    s.call("system.listNotifications", [], token=False)
    s.call("aria2.getVersion")
    s.call("aria2.getGlobalOption")
    s.call("aria2.changeGlobalOption", [{"max-concurrent-downloads": "1", "max-overall-download-limit": "0"}])
    s.call("aria2.getGlobalStat", label="nothing yet")

    # A complete download, added with most options aria2 clients send.
    s.add("F", "fast, options", "b-fast.bin", {"out": "b-fast.bin", "split": "2", "max-connection-per-server": "2",
                                               "checksum": "sha-256=" + fast_sha256, "header": ["X-A: b"]})
    s.wait("F is complete", s.all_are(["F"], "complete"))
    s.call("aria2.tellStatus", [s.gid("F")], "complete")
    s.call("aria2.tellStatus", [s.gid("F"), ["gid", "status", "totalLength", "completedLength", "files",
                                             "no-such-key"]], "complete, keys")
    s.call("aria2.getFiles", [s.gid("F")], "complete")
    s.call("aria2.getUris", [s.gid("F")], "complete")
    s.call("aria2.getOption", [s.gid("F")], "complete")
    s.call("aria2.getServers", [s.gid("F")], "complete")
    path = os.path.join(s.directory, "b-fast.bin")
    s.note("b-fast.bin on disk", os.path.exists(path) and sha256_of_file(path) == fast_sha256)

    # One running (A), one added paused (P), two waiting (W, V): one download at a time.
    s.add("A", "throttled", "b-slow-a.bin", {"out": "b-slow-a.bin"})
    s.wait("A is active with bytes", lambda: s.running("A"))
    s.add("P", "pause true", "b-slow-p.bin", {"out": "b-slow-p.bin", "pause": "true"})
    s.add("W", "waiting", "b-slow-w.bin", {"out": "b-slow-w.bin"})
    s.add("V", "waiting", "b-slow-v.bin", {"out": "b-slow-v.bin"})
    s.wait("P is paused", s.all_are(["P"], "paused"))
    s.wait("W and V are waiting", s.all_are(["W", "V"], "waiting"))
    s.call("aria2.tellStatus", [s.gid("A")], "active")
    s.call("aria2.tellStatus", [s.gid("A"), ["gid", "status", "totalLength", "connections", "dir"]], "active, keys")
    s.call("aria2.tellStatus", [s.gid("P")], "paused")
    s.call("aria2.tellStatus", [s.gid("W")], "waiting")
    s.call("aria2.tellActive")
    s.call("aria2.tellActive", [["gid", "status", "completedLength"]], "keys")
    s.call("aria2.tellWaiting", [0, 10])
    s.call("aria2.tellWaiting", [0, 10, ["gid", "status"]], "keys")
    s.call("aria2.tellWaiting", [-1, 2, ["gid", "status"]], "negative offset")
    s.call("aria2.tellWaiting", [1, 1, ["gid"]], "offset 1, num 1")
    s.call("aria2.tellWaiting", [10, 5, ["gid"]], "offset past the end")
    s.call("aria2.tellStopped", [0, 10])
    s.call("aria2.tellStopped", [0, 10, ["gid", "status"]], "keys")
    s.call("aria2.getServers", [s.gid("A")], "active")
    s.call("aria2.getServers", [s.gid("P")], "paused")
    s.call("aria2.getUris", [s.gid("A")], "active")
    s.call("aria2.getFiles", [s.gid("A")], "active")
    s.call("aria2.getOption", [s.gid("A")], "active")
    s.call("aria2.changeOption", [s.gid("A"), {"max-download-limit": "500K"}])
    s.call("aria2.getGlobalStat", label="1 active, 3 waiting, 1 stopped")

    # The waiting queue's order.
    s.call("aria2.changePosition", [s.gid("V"), 0, "POS_SET"], "POS_SET")
    s.call("aria2.changePosition", [s.gid("V"), 1, "POS_CUR"], "POS_CUR")
    s.call("aria2.changePosition", [s.gid("V"), 0, "POS_END"], "POS_END")
    s.call("aria2.changePosition", [s.gid("V"), 0, "POS_SIDEWAYS"], "bad how")
    s.call("aria2.changePosition", [s.gid("A"), 0, "POS_SET"], "active download")
    s.call("aria2.tellWaiting", [0, 10, ["gid"]], "order after changePosition")

    # Pausing and resuming.
    s.call("aria2.pause", [s.gid("A")])
    s.wait("A is paused", s.all_are(["A"], "paused"))
    s.call("aria2.tellStatus", [s.gid("A"), ["gid", "status"]], "after pause")
    s.call("aria2.pause", [s.gid("A")], "already paused")
    s.wait("W or V takes the free slot", lambda: len(s.side.call("aria2.tellActive", [["gid"]]) or []) == 1)
    s.call("aria2.unpause", [s.gid("A")])
    s.wait("A is waiting (no free slot)", s.all_are(["A"], "waiting"))
    s.call("aria2.tellStatus", [s.gid("A"), ["gid", "status"]], "after unpause")
    s.call("aria2.unpause", [s.gid("A")], "not paused")
    s.call("aria2.pauseAll")
    s.wait("all four are paused", s.all_are(["A", "P", "W", "V"], "paused"))
    s.call("aria2.tellWaiting", [0, 10, ["gid", "status"]], "after pauseAll")
    s.call("aria2.tellActive", [["gid"]], "after pauseAll")
    s.call("aria2.changeGlobalOption", [{"max-concurrent-downloads": "5"}], "5 at once")
    s.call("aria2.unpauseAll")
    s.wait("all four are active", s.all_are(["A", "P", "W", "V"], "active"))
    s.call("aria2.forcePause", [s.gid("W")])
    s.wait("W is paused", s.all_are(["W"], "paused"))
    s.call("aria2.forcePauseAll")
    s.wait("all four are paused", s.all_are(["A", "P", "W", "V"], "paused"))
    s.call("aria2.unpauseAll", label="after forcePauseAll")
    s.wait("all four are active", lambda: all(s.running(name) for name in "APWV"))
    s.call("aria2.getGlobalStat", label="4 active, 1 stopped")

    # Removing, failing, dropping results.
    s.call("aria2.remove", [s.gid("A")])
    s.wait("A is removed", s.all_are(["A"], "removed"))
    s.call("aria2.tellStatus", [s.gid("A")], "removed")
    s.call("aria2.remove", [s.gid("A")], "already removed")
    s.call("aria2.getUris", [s.gid("A")], "removed")
    s.call("aria2.forceRemove", [s.gid("W")])
    s.wait("W is removed", s.all_are(["W"], "removed"))
    s.add("E", "404", "b-missing.bin", {"out": "b-missing.bin"})
    s.wait("E is error", s.all_are(["E"], "error"))
    s.call("aria2.tellStatus", [s.gid("E")], "404 error")
    s.call("aria2.tellStatus", [s.gid("E"), ["gid", "status", "errorCode", "errorMessage"]], "404 error, keys")
    s.call("aria2.tellStopped", [0, 10], "complete, removed, error")
    s.call("aria2.tellStopped", [0, 10, ["gid", "status", "errorCode"]], "keys")
    s.call("aria2.tellStopped", [-1, 2, ["gid", "status"]], "negative offset")
    s.call("aria2.getGlobalStat", label="2 active, 4 stopped")
    s.call("aria2.removeDownloadResult", [s.gid("E")])
    s.call("aria2.tellStatus", [s.gid("E")], "result removed")
    s.call("aria2.removeDownloadResult", [s.gid("P")], "active download")
    s.call("aria2.purgeDownloadResult")
    s.call("aria2.tellStopped", [0, 10, ["gid"]], "after purge")
    s.note("b-fast.bin after purge", os.path.exists(path))
    s.call("aria2.saveSession")

    # system.*, batches and errors.
    s.call("system.multicall", [[
        {"methodName": "aria2.getVersion", "params": [f"token:{s.side.secret}"]},
        {"methodName": "aria2.tellStatus", "params": [f"token:{s.side.secret}", "0123456789abcdef"]},
        {"methodName": "aria2.getGlobalStat", "params": ["token:wrong"]},
        {"methodName": "aria2.tellStatus", "params": [f"token:{s.side.secret}", s.gid("F"), ["gid", "status"]]},
    ]], "mixed", token=False)
    s.call("system.multicall", [[{"methodName": "system.multicall", "params": [[]]}]], "nested", token=False)
    s.call("system.multicall", ["not a list"], "bad params", token=False)
    s.call("aria2.tellStatus", ["0123456789abcdef"], "unknown GID")
    s.call("aria2.pause", ["0123456789abcdef"], "unknown GID")
    s.call("aria2.tellStatus", ["zz"], "bad GID")
    s.call("aria2.tellStatus", [s.gid("F")], "wrong secret", secret="token:wrong")
    s.call("aria2.tellStatus", [s.gid("F")], "no secret", token=False)
    s.call("aria2.noSuchMethod", [], "unknown method")
    s.call("aria2.tellStatus", [123], "GID a number")
    s.call("aria2.tellWaiting", ["a", "b"], "strings for numbers")
    s.call("aria2.addUri", ["http://127.0.0.1:9/x"], "URIs a string")
    s.call("aria2.addUri", [[]], "no URIs")
    s.call("aria2.addTorrent", ["Z2FyYmFnZQ=="], "garbage")
    s.call("aria2.addMetalink", ["Z2FyYmFnZQ=="], "garbage")
    s.call("aria2.getPeers", [s.gid("P")], "HTTP download")
    secret = f"token:{s.side.secret}"
    s.raw("(parse error)", b'{"jsonrpc": "2.0", "id": 1, "method": ')
    s.raw("(params not an array)", json.dumps({"jsonrpc": "2.0", "id": "p", "method": "aria2.getVersion",
                                              "params": {"a": secret}}).encode())
    s.raw("(no method)", b'{"jsonrpc": "2.0", "id": "m", "params": []}')
    s.raw("(no id)", json.dumps({"jsonrpc": "2.0", "method": "aria2.getVersion", "params": [secret]}).encode())
    s.raw("(empty batch)", b"[]")
    s.raw("(batch)", json.dumps([
        {"jsonrpc": "2.0", "id": "x1", "method": "aria2.getVersion", "params": [secret]},
        {"jsonrpc": "2.0", "id": "x2", "method": "aria2.tellStatus", "params": [secret, "0123456789abcdef"]},
        {"jsonrpc": "2.0", "method": "aria2.getGlobalStat", "params": [secret]}]).encode())

    # Last: a download removed while paused (aria2 forgets it).
    s.call("aria2.pause", [s.gid("V")], "before removal")
    s.wait("V is paused", s.all_are(["V"], "paused"))
    s.call("aria2.remove", [s.gid("V")], "paused")
    s.wait("V is not running or waiting", lambda: s.state("V").get("status") not in ("paused", "active", "waiting"))
    s.call("aria2.tellStatus", [s.gid("V"), ["gid", "status"]], "removed while paused")
    s.call("aria2.forceRemove", [s.gid("P")], "cleanup")


def run_sequence(side, files, fast_sha256, strict):
    session = Session(side, files, strict)
    try:
        sequence(session, fast_sha256)
        stopped = None
    except Stop as stop:
        stopped = str(stop)
    return session, stopped


def kind_of(value, key):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        if key in DECIMAL_KEYS:
            return "decimal string" if re.fullmatch(r"-?\d+", value) else "non-decimal string"
        return "string"
    return "array" if isinstance(value, list) else "object"


def named(value, names):
    """`value` with each GID string replaced by the name the sequence gave its download."""
    if isinstance(value, str):
        return f"<{names[value]}>" if value in names else value
    if isinstance(value, list):
        return [named(item, names) for item in value]
    if isinstance(value, dict):
        return {key: named(item, names) for key, item in value.items()}
    return value


def compare(ours, theirs, path, key, out, a, b):
    """Appends (path, message) for each way `theirs` (side b) differs in shape from `ours` (side a)."""
    kind, other = kind_of(ours, key), kind_of(theirs, key)
    if kind != other:
        out.append((path, f"{a}: {kind} {json.dumps(ours)[:60]}, {b}: {other} {json.dumps(theirs)[:60]}"))
        return
    if kind == "object":
        for name in sorted(set(ours) | set(theirs)):
            where = f"{path}.{name}" if path else name
            if name not in theirs:
                out.append((where, f"only {a} has it"))
            elif name not in ours:
                out.append((where, f"only {b} has it"))
            else:
                compare(ours[name], theirs[name], where, name, out, a, b)
        if "gid" in ours and "status" in ours and "status" in theirs and ours["status"] != theirs["status"]:
            out.append((f"{path}.status", f"{a}: {ours['status']!r}, {b}: {theirs['status']!r}"))
        return
    if kind == "array":
        if not ours or not theirs:
            return
        if all(isinstance(x, dict) and "gid" in x for x in ours + theirs):  # downloads: by GID, and in order
            mine, yours = [x["gid"] for x in ours], [x["gid"] for x in theirs]
            for gid in [g for g in mine if g not in yours]:
                out.append((f"{path}[gid={gid.strip('<>')}]", f"only {a} lists it"))
            for gid in [g for g in yours if g not in mine]:
                out.append((f"{path}[gid={gid.strip('<>')}]", f"only {b} lists it"))
            if set(mine) == set(yours) and mine != yours:
                out.append((path, f"order {a}: {mine}, {b}: {yours}"))
            for item in ours:
                match = [x for x in theirs if x["gid"] == item["gid"]]
                if match:
                    compare(item, match[0], f"{path}[gid={item['gid'].strip('<>')}]", key, out, a, b)
        elif len(ours) == len(theirs):
            for index, (item, their) in enumerate(zip(ours, theirs)):
                compare(item, their, f"{path}[{index}]", key, out, a, b)
        else:  # lists of one kind of thing (URIs, servers): each like the first of ours
            for their in theirs:
                compare(ours[0], their, f"{path}[]", key, out, a, b)
        return
    equal = key in EQUAL_KEYS or kind == "number" or ours == "OK" or theirs == "OK" \
        or (isinstance(ours, str) and ours.startswith("<") and ours.endswith(">"))
    if equal and ours != theirs:
        out.append((path, f"{a}: {ours!r}, {b}: {theirs!r}"))


def differences(reference, tested):
    """(label, method, path, message) for each difference between two runs of the sequence."""
    found = []
    a, b = reference.side.name, tested.side.name
    names_a = {gid: name for name, gid in reference.gids.items()}
    names_b = {gid: name for name, gid in tested.gids.items()}
    for ours, theirs in zip(reference.records, tested.records):
        label, out = ours["label"], []
        if theirs["label"] != label:
            found.append((label, ours["method"], "", f"the sequences went apart ({theirs['label']})"))
            break
        if "fact" in ours:
            if ours["fact"] != theirs["fact"]:
                out.append(("(fact)", f"{a}: {ours['fact']}, {b}: {theirs['fact']}"))
        else:
            for field in ("http", "content-type"):
                if ours[field] != theirs[field]:
                    out.append((f"({field})", f"{a}: {ours[field]}, {b}: {theirs[field]}"))
            compare(named(ours["answer"], names_a), named(theirs["answer"], names_b), "", None, out, a, b)
        found.extend((label, ours["method"], path, message) for path, message in dict.fromkeys(out))
    return found


def known(label, method, path):
    for entry in KNOWN_DIFFERENCES:
        if (fnmatch.fnmatchcase(label, entry[0]) or fnmatch.fnmatchcase(method, entry[0])) \
                and fnmatch.fnmatchcase(path, entry[1]):
            return entry
    return None


def part_b(reference, tested, files, fast_sha256, allowed, dump):
    ours, stopped = run_sequence(reference, files, fast_sha256, strict=True)
    theirs, stopped = run_sequence(tested, files, fast_sha256, strict=False)
    if dump:
        os.makedirs(dump, exist_ok=True)
        for session in (ours, theirs):
            with open(os.path.join(dump, f"{session.side.name}.json"), "w") as file:
                json.dump({"gids": session.gids, "records": session.records}, file, indent=2)
    unexpected, used = [], set()
    for label, method, path, message in differences(ours, theirs):
        entry = known(label, method, path) if allowed else None
        if entry:
            used.add(entry)
        else:
            unexpected.append(f"{label}: {path or '(answer)'}: {message}")
    for line in unexpected:
        print(f"  difference: {line}")
    if stopped:
        fail(f"part B stopped after {len(theirs.records)} of {len(ours.records)} answers: {stopped}"
             + (f" ({len(unexpected)} differences before)" if unexpected else ""))
    if unexpected:
        fail(f"{len(unexpected)} differences between {reference.name} and {tested.name} not in KNOWN_DIFFERENCES")
    if allowed:
        stale = [entry for entry in KNOWN_DIFFERENCES if entry not in used]
        if stale:
            fail(f"KNOWN_DIFFERENCES entries that never occurred: {[entry[:2] for entry in stale]}")
    print(f"aria2 rpc test: part B ({len(ours.records)} answers, {reference.name} against {tested.name}) passed")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=".build/debug")
    parser.add_argument("--self-check", action="store_true",
                        help="aria2c in place of the daemon: proves the harness finds no difference")
    parser.add_argument("--dump", help="write part B's answers of each side as JSON into this directory")
    args = parser.parse_args()
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="haul-aria2-rpc-")
    processes = []
    try:
        server = subprocess.Popen(
            [os.path.join(args.bin, "haul-test-server"), "a-fast.bin:400000", "a-slow.bin:30000000:50000",
             f"b-fast.bin:{FAST_SIZE}", "b-slow-a.bin:30000000:50000", "b-slow-p.bin:30000000:50000",
             "b-slow-w.bin:30000000:50000", "b-slow-v.bin:30000000:50000"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        processes.append(server)
        files = server.stdout.readline().strip()
        if not files.startswith("http://"):
            fail("the test server did not start")
        fast_sha256 = sha256_of_url(files + "/b-fast.bin")

        if args.self_check:
            tested = start_aria2c(work, "aria2-rpc-self-check-secret", "aria2c-tested", processes)
        else:
            tested = start_haul(os.path.join(args.bin, "haul"), work, processes)
        reference = start_aria2c(work, tested.secret, "aria2c", processes)

        answers(reference)
        answers(tested)
        part_a(tested, files)
        part_b(reference, tested, files, fast_sha256, allowed=not args.self_check, dump=args.dump)
        print(f"aria2 rpc test: passed in {time.monotonic() - started:.0f} s")
    finally:
        stop_processes(processes)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
