#!/usr/bin/env python3
"""The browser extension (contrib/browser) in a real browser: headless Chromium through WebDriver.

Starts the test server (`haul-test-server`, files with known bytes, one throttled), a small page
server in this process (a page that sets a cookie and links to files it serves, recording the
headers each request of a file carried) and `haul daemon --allow-origin chrome-extension://ID`
on free ports with a temporary state directory, loads the unpacked extension into Chromium, then:

1. fills the options page (address, token), saves, and "Test connection" reports the daemon;
2. turns on capture for `.iso`, clicks a download link on the page: the extension cancels the
   browser's download and sends it to the daemon, which fetches it with the page's cookie and the
   page as Referer under the link's `download` name; the browser's own download never finishes;
   cookies would go to a loopback daemon only; a download under the minimum size stays the browser's;
3. sends a link the way the context menu does (by message: WebDriver cannot click the browser's
   own menu) and finds the menu entry registered; the daemon completes it;
4. the badge shows 1 while a throttled download runs, the badge alarm exists, and a wrong token
   makes "Test connection" show the daemon's refusal;
5. in aria2 JSON-RPC mode, a link sent completes in the daemon (GID = ID in hex), with its name,
   cookie and Referer;
6. a captured download the daemon refuses (wrong token) is left to the browser, which finishes it,
   and the badge shows "!".

A screenshot of the options page goes to OUT/options.png.

    scripts/extension-test.py [--bin .build/debug] [--out .build/extension-test]

The extension's ID in Chromium is fixed by the public key in its manifest ("key"):
benmmfklhafibfchhcojdhmdaikmklck (the first 32 hex digits of the SHA-256 of the DER key, 0-f
written a-p). The test computes it again and fails when the two differ.

Needs chromium, chromium-driver (Debian) and selenium (PyPI), as scripts/browser-test.py.
"""
import argparse
import base64
import hashlib
import http.server
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from checks import failer, poll, sha256_of_file, sha256_of_url, stop_processes, waiter

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

DEADLINE = 30  # seconds any one expected state may take
EXTENSION_ID = "benmmfklhafibfchhcojdhmdaikmklck"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXTENSION = os.path.join(ROOT, "contrib", "browser")

fail = failer("extension test")


wait_for = waiter(fail, DEADLINE)


def wait_for_quietly(condition, timeout=DEADLINE):
    """Whether `condition` held within `timeout`, for a caller that says more when it did not."""
    return bool(poll(condition, timeout))


def extension_id(manifest_path):
    """Chromium's ID of an extension with a "key": its public key's SHA-256, 32 hex digits as a-p."""
    key = base64.b64decode(json.load(open(manifest_path))["key"])
    return "".join(chr(ord("a") + int(digit, 16)) for digit in hashlib.sha256(key).hexdigest()[:32])


# --- The page server: a page with a cookie and download links, files whose requests it records ---

FILES = {}  # path -> bytes
REQUESTS = []  # (path, headers) of every request of a file, in order
REQUESTS_LOCK = threading.Lock()


def file_bytes(seed, size):
    return random.Random(seed).randbytes(size)


PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>Files</title></head><body>
<h1>Files</h1>
<p><a id="capture" href="/files/image.iso" download="report-2026.iso">report (iso)</a></p>
<p><a id="small" href="/files/small.iso" download="small.iso">small (iso)</a></p>
<p><a id="fallback" href="/files/fallback.iso" download="fallback.iso">fallback (iso)</a></p>
</body></html>
"""


class PageHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.answer(head=True)

    def do_GET(self):
        self.answer(head=False)

    def answer(self, head):
        path = urllib.parse.urlsplit(self.path).path
        if path == "/page.html":
            body = PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Set-Cookie", "session=abc123; Path=/")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        if path not in FILES:
            self.send_error(404)
            return
        with REQUESTS_LOCK:
            REQUESTS.append((path, {name.lower(): value for name, value in self.headers.items()}))
        data = FILES[path]
        start, end = 0, len(data)
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and "," not in ranged:
            first, _, last = ranged[len("bytes="):].partition("-")
            if first.isdigit() and int(first) < len(data):
                start = int(first)
                end = min(len(data), int(last) + 1) if last.isdigit() else len(data)
        self.send_response(206 if (start, end) != (0, len(data)) else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest()[:16] + '"')
        self.send_header("Content-Length", str(end - start))
        if (start, end) != (0, len(data)):
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        # About a second for 2 MiB: a browser download nobody cancels would finish well within the
        # test, so one that never appears was really cancelled.
        try:
            for offset in range(start, end, 65536):
                self.wfile.write(data[offset:min(end, offset + 65536)])
                time.sleep(0.02)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser's download, cancelled


def requests_of(path, by_haul):
    with REQUESTS_LOCK:
        return [headers for (requested, headers) in REQUESTS
                if requested == path and headers.get("user-agent", "").startswith("haul/") == by_haul]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=".build/debug")
    parser.add_argument("--out", default=".build/extension-test")
    args = parser.parse_args()
    started = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    haul = os.path.join(args.bin, "haul")
    if extension_id(os.path.join(EXTENSION, "manifest.json")) != EXTENSION_ID:
        fail(f"the manifest's key gives the ID {extension_id(os.path.join(EXTENSION, 'manifest.json'))}, "
             f"not {EXTENSION_ID}: update the test and contrib/browser/README.md")
    for name in ("background.js", "options.js"):
        if re.search(r"\bconsole\.\w+\(", open(os.path.join(EXTENSION, name)).read()):
            fail(f"contrib/browser/{name} writes to the console, where a token could end up")
    work = tempfile.mkdtemp(prefix="haul-extension-")
    state = os.path.join(work, "state")
    root = os.path.join(work, "files")
    browser_downloads = os.path.join(work, "browser-downloads")
    os.makedirs(root)
    os.makedirs(browser_downloads)
    processes = []
    driver = None
    page_server = None
    try:
        # The test server: a file for the context menu's path, a throttled one for the badge.
        server = subprocess.Popen(
            [os.path.join(args.bin, "haul-test-server"), "menu.bin:300000", "slow.bin:50000000:100000"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        processes.append(server)
        files_url = server.stdout.readline().strip()
        if not files_url.startswith("http://"):
            fail("the test server did not start")

        # The page server.
        for number, name in enumerate(["image.iso", "aria.bin", "fallback.iso", "small.iso"]):
            FILES["/files/" + name] = file_bytes(number, 2 * 1024 * 1024 + number)
        page_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), PageHandler)
        page_server.daemon_threads = True
        threading.Thread(target=page_server.serve_forever, daemon=True).start()
        site = f"http://127.0.0.1:{page_server.server_address[1]}"
        page_url = site + "/page.html"

        log = open(os.path.join(args.out, "daemon.log"), "w")
        daemon = subprocess.Popen(
            [haul, "daemon", "--listen", "127.0.0.1:0", "--state-dir", state, "--download-root", root,
             "--allow-origin", f"chrome-extension://{EXTENSION_ID}"],
            stdout=log, stderr=subprocess.STDOUT)
        processes.append(daemon)
        wait_for("the daemon writes its address",
                 lambda: daemon.poll() is not None or os.path.exists(os.path.join(state, "daemon.address")))
        if daemon.poll() is not None:
            log.flush()
            last = (open(os.path.join(args.out, "daemon.log")).read().strip().splitlines() or [""])[-1]
            fail(f"the daemon exited with {daemon.returncode} (does this haul have daemon --allow-origin?): {last}")
        base = open(os.path.join(state, "daemon.address")).read().split()[0]
        token = subprocess.run([haul, "daemon", "--print-token", "--state-dir", state],
                               capture_output=True, text=True, check=True, timeout=DEADLINE).stdout.strip()

        def api(path, method="GET"):
            request = urllib.request.Request(base + "/api/v1" + path, method=method,
                                             headers={"Authorization": "Bearer " + token})
            with urllib.request.urlopen(request, timeout=DEADLINE) as response:
                return json.load(response) if response.status != 204 else None

        def download_of(url):
            found = [d for d in api("/downloads?limit=1000")["downloads"] if d["url"] == url]
            return found[-1] if found else None

        def completed(what, find):
            """Waits until the download `find()` returns completes; fails at once when it fails."""
            def check():
                download = find()
                if download and download["state"] in ("failed", "cancelled"):
                    fail(f"{what} {download['state']} in the daemon: {download.get('error')}")
                return download if download and download["state"] == "completed" else None
            return wait_for(f"{what} completes in the daemon", check)

        # Chromium with the extension, downloading into a folder of its own.
        options = Options()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,900",
                         "--disable-dev-shm-usage", f"--load-extension={EXTENSION}",
                         f"--disable-extensions-except={EXTENSION}"]:
            options.add_argument(argument)
        options.add_experimental_option("prefs", {
            "download.default_directory": browser_downloads,
            "download.prompt_for_download": False,
            "download.directory_upgrade": True,
            "safebrowsing.enabled": False,
        })
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                                  options=options)
        driver.set_page_load_timeout(DEADLINE)
        driver.set_script_timeout(DEADLINE)

        def in_extension(script, *arguments):
            """Runs `script` on the extension's page; it ends by calling done(value)."""
            return driver.execute_async_script(
                "const done = arguments[arguments.length - 1];\n" + script, *arguments)

        def message(body):
            return in_extension(
                "chrome.runtime.sendMessage(arguments[0], (answer) => done(answer || "
                "{ok: false, error: String(chrome.runtime.lastError && chrome.runtime.lastError.message)}));",
                body)

        def badge():
            return in_extension("chrome.action.getBadgeText({}, done);")

        def status():
            element = driver.find_element(By.ID, "status")
            return element.get_attribute("class"), element.text

        def fill(field, value):
            element = driver.find_element(By.ID, field)
            element.clear()
            element.send_keys(value)

        def save():
            driver.find_element(By.ID, "save").click()
            wait_for("the options are saved", lambda: status() == ("ok", "Saved."))

        def test_connection():
            driver.find_element(By.ID, "test").click()
            return wait_for("Test connection answers", lambda: status()[0] in ("ok", "error") and status())

        # 1. The options page: address and token saved, and "Test connection" reports the daemon.
        options_page = f"chrome-extension://{EXTENSION_ID}/options.html"
        driver.get(options_page)
        wait_for("the options page shows the extension's origin", lambda: driver.find_element(
            By.ID, "allow-origin").text == f"haul daemon --allow-origin chrome-extension://{EXTENSION_ID}")
        options_tab = driver.current_window_handle
        fill("address", base)
        fill("token", token)
        save()
        stored = in_extension("chrome.storage.local.get(null, done);")
        if stored.get("address") != base or stored.get("token") != token or stored.get("protocol") != "haul":
            fail(f"the options page stored {dict(stored, token='…')}")
        kind, text = test_connection()
        if kind != "ok" or not text.startswith("Connected to Haul"):
            fail(f"Test connection showed {kind}: {text!r}")
        driver.save_screenshot(os.path.join(args.out, "options.png"))
        print(f"1. the options page saves the address and token; Test connection: {text}")

        # 2. Capture: the browser's download of an .iso goes to the daemon instead.
        driver.find_element(By.ID, "capture-enabled").click()
        fill("capture-extensions", "zip, ISO")
        fill("capture-min-bytes", "1000000")
        save()
        driver.switch_to.new_window("tab")
        page_tab = driver.current_window_handle
        driver.get(page_url)
        if not driver.get_cookie("session"):
            fail("the page's cookie was not set")
        driver.find_element(By.ID, "capture").click()
        image_url = site + "/files/image.iso"
        download = completed("the captured download", lambda: download_of(image_url))
        path = os.path.join(root, "report-2026.iso")
        if download["name"] != "report-2026.iso" or not os.path.exists(path):
            fail(f"the captured download is named {download['name']!r}, not the link's download name "
                 f"report-2026.iso; the root holds {os.listdir(root)}")
        if sha256_of_file(path) != hashlib.sha256(FILES["/files/image.iso"]).hexdigest():
            fail("the captured file differs from the page server's")
        by_haul = requests_of("/files/image.iso", by_haul=True)
        if not by_haul:
            fail("the page server saw no request of the file from haul")
        for headers in by_haul:
            if headers.get("cookie") != "session=abc123" or headers.get("referer") != page_url:
                fail(f"haul asked for the file with Cookie {headers.get('cookie')!r} and Referer "
                     f"{headers.get('referer')!r}, not the page's session=abc123 and {page_url}")
        # The browser's own download: it began (the page server saw it), then it went away.
        if not requests_of("/files/image.iso", by_haul=False):
            fail("the browser never asked for the file: the click did not start a download")
        driver.switch_to.window(options_tab)
        time.sleep(1.5)  # longer than the browser needs to fetch the whole file, had it gone on
        left = in_extension("chrome.downloads.search({}, done);")
        if any(item.get("state") == "complete" for item in left) or any(
                item.get("url") == image_url for item in left):
            fail(f"the browser's download is still listed: {left}")
        if os.listdir(browser_downloads):
            fail(f"the browser's download folder holds {os.listdir(browser_downloads)}: its download was not "
                 "cancelled")
        if "abc123" in json.dumps(api("/downloads?limit=1000")):
            fail("the daemon shows the cookie, which it should hold as a secret header")
        # Cookies go to a daemon on this machine only.
        for address, cookie in [("http://127.0.0.1:6842", True), ("http://127.9.8.7:1", True), ("http://localhost:1", True),
                                ("http://[::1]:6842/", True), ("https://LOCALHOST", True),
                                ("http://192.0.2.1:6842", False), ("http://127.0.0.1.example:6842", False),
                                ("http://localhost.example", False), ("http://[::ffff:7f00:1]:6842", False),
                                ("http://10.0.0.1", False)]:
            preview = message({"type": "preview", "url": image_url, "referrer": page_url, "address": address})
            expected = ["Referer", "Cookie (secret)"] if cookie else ["Referer"]
            if preview.get("headers") != expected:
                fail(f"for a daemon at {address} the extension would send {preview}, not {expected}")
        print("2. a captured .iso went to the daemon with the page's cookie and Referer, under the link's "
              "download name; the browser's own download was cancelled and erased; cookies go to loopback only")

        # A download under the minimum size stays the browser's.
        fill("capture-min-bytes", "3000000")
        save()
        driver.switch_to.window(page_tab)
        driver.find_element(By.ID, "small").click()
        small = os.path.join(browser_downloads, "small.iso")
        wait_for("the browser downloads small.iso (under the minimum) itself", lambda: os.path.exists(small)
                 and sha256_of_file(small) == hashlib.sha256(FILES["/files/small.iso"]).hexdigest())
        if download_of(site + "/files/small.iso") or requests_of("/files/small.iso", by_haul=True):
            fail("small.iso, under the minimum size, went to the daemon")
        driver.switch_to.window(options_tab)
        print("2b. a download under the minimum size was left to the browser")

        # 3. The context menu: its entry is registered, and its function sends a link.
        menus = message({"type": "menus"})
        if not menus.get("ok") or menus.get("menus") != ["haul-download-link"]:
            fail(f"the background reports the context-menu entries {menus}")
        menu_url = files_url + "/menu.bin"
        # This message reaches downloadLink(), the same function the menu entry's click calls.
        answer = message({"type": "download-link", "url": menu_url, "referrer": page_url})
        if not answer.get("ok") or not answer.get("id"):
            fail(f"sending a link as the context menu does answered {answer}")
        completed("the context menu's download", lambda: api(f"/downloads/{answer['id']}"))
        if sha256_of_file(os.path.join(root, "menu.bin")) != sha256_of_url(menu_url):
            fail("menu.bin differs from the test server's file")
        print("3. the context-menu entry is registered, and its function sent a link the daemon completed")

        # 4. The badge: 1 while a throttled download runs; the alarm that refreshes it; a wrong token.
        message({"type": "refresh-badge"})
        if badge() != "":
            fail(f"the badge reads {badge()!r} with nothing running")
        slow_url = files_url + "/slow.bin"
        answer = message({"type": "download-link", "url": slow_url, "referrer": page_url})
        if not answer.get("ok"):
            fail(f"sending slow.bin answered {answer}")
        # Within seconds: refreshed after the send, not only by the alarm every 30 s.
        wait_for("the badge reads 1 while slow.bin runs", lambda: badge() == "1", timeout=10)
        alarm = in_extension("chrome.alarms.get('haul-badge', done);")
        if not alarm or alarm.get("periodInMinutes") != 0.5:
            fail(f"the badge's alarm is {alarm}")
        api(f"/downloads/{answer['id']}?deleteFiles=true", "DELETE")
        if message({"type": "refresh-badge"}).get("running") != 0 or badge() != "":
            fail(f"the badge reads {badge()!r} once slow.bin is removed")
        fill("token", "wrong-token-0123456789abcdef0123")
        kind, text = test_connection()
        if kind != "error" or "401" not in text or "unauthorized" not in text:
            fail(f"Test connection with a wrong token showed {kind}: {text!r}")
        fill("token", token)
        print(f"4. the badge read 1 while a download ran, and its alarm is set; a wrong token: {text}")

        # 5. aria2's JSON-RPC: a link goes through aria2.addUri, with its name, cookie and Referer.
        Select(driver.find_element(By.ID, "protocol")).select_by_value("aria2")
        save()
        kind, text = test_connection()
        if kind != "ok" or "aria2 JSON-RPC" not in text:
            fail(f"Test connection over aria2 JSON-RPC showed {kind}: {text!r}")
        aria_url = site + "/files/aria.bin"
        answer = message({"type": "download-link", "url": aria_url, "referrer": page_url,
                          "fileName": "aria-named.bin"})
        if not answer.get("ok") or len(answer.get("gid") or "") != 16:
            fail(f"sending a link over aria2 JSON-RPC answered {answer}")
        download = completed("the aria2 download", lambda: api(f"/downloads/{int(answer['gid'], 16)}"))
        if download["url"] != aria_url or download["name"] != "aria-named.bin":
            fail(f"GID {answer['gid']} is {download['url']} named {download['name']}")
        if sha256_of_file(os.path.join(root, "aria-named.bin")) != hashlib.sha256(FILES["/files/aria.bin"]).hexdigest():
            fail("aria-named.bin differs from the page server's file")
        for headers in requests_of("/files/aria.bin", by_haul=True):
            if headers.get("cookie") != "session=abc123" or headers.get("referer") != page_url:
                fail(f"over aria2 JSON-RPC haul sent Cookie {headers.get('cookie')!r}, "
                     f"Referer {headers.get('referer')!r}")
        print(f"5. over aria2 JSON-RPC ({text}) a link completed as GID {answer['gid']}, "
              "with its name, cookie and Referer")

        # 6. A captured download the daemon refuses stays the browser's: it finishes it itself.
        Select(driver.find_element(By.ID, "protocol")).select_by_value("haul")
        fill("token", "wrong-token-0123456789abcdef0123")
        fill("capture-min-bytes", "")
        save()
        driver.switch_to.window(page_tab)
        driver.find_element(By.ID, "fallback").click()
        fallback = os.path.join(browser_downloads, "fallback.iso")
        # At once: a download held until the worker is stopped (30 s idle) would also go on, late.
        wait_for("the browser downloads fallback.iso itself", lambda: os.path.exists(fallback)
                 and sha256_of_file(fallback) == hashlib.sha256(FILES["/files/fallback.iso"]).hexdigest(),
                 timeout=10)
        if download_of(site + "/files/fallback.iso"):
            fail("the daemon has fallback.iso, sent with a wrong token")
        driver.switch_to.window(options_tab)
        wait_for("the badge reads !", lambda: badge() == "!")
        if not wait_for_quietly(lambda: "fallback.iso" in (t := driver.find_element(By.ID, "last-error-text").text) and "401" in t):
            shown = driver.find_element(By.ID, "last-error").get_attribute("outerHTML")
            stored = in_extension("chrome.storage.local.get('lastError', done);")
            fail(f"the options page shows {shown!r}; stored: {stored}")
        print("6. a captured download the daemon refused was finished by the browser; the badge reads !")

        print(f"extension test: passed in {time.monotonic() - started:.0f} s (screenshot: {args.out}/options.png)")
    finally:
        if driver:
            driver.quit()
        if page_server:
            page_server.shutdown()
        stop_processes(processes)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
