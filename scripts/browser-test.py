#!/usr/bin/env python3
"""The daemon's page in a real browser (headless Chromium through WebDriver).

Starts the test server (`haul-test-server`, throttled files) and `haul daemon` on free ports with a
temporary state directory, then, in Chromium: connects with the token, adds a download and watches
its progress bar move to "completed" (the file's bytes equal the server's), pauses and resumes a
second one added with two connections, filters by state, removes one keeping its file, pages
through a queue of a few hundred (20 rows a page, `?pageSize=20`) and checks a phone-width window.
A screenshot mid-download goes to OUT/daemon.png (checked in as docs/daemon.png).

    scripts/browser-test.py [--bin .build/debug] [--out .build/browser-test]

Needs chromium, chromium-driver (Debian) and selenium (PyPI); .ci/run installs them.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

from checks import failer, poll, sha256_of_file, sha256_of_url, stop_processes, waiter

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

DEADLINE = 30  # seconds any one expected state may take


fail = failer("browser test")


wait_for = waiter(fail, DEADLINE)


def wait_for_quietly(condition, timeout=DEADLINE):
    """Whether `condition` held within `timeout`, for a caller that says more when it did not."""
    return bool(poll(condition, timeout))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=".build/debug")
    parser.add_argument("--out", default=".build/browser-test")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    haul = os.path.join(args.bin, "haul")
    work = tempfile.mkdtemp(prefix="haul-browser-")
    state = os.path.join(work, "state")
    root = os.path.join(work, "files")
    os.makedirs(root)
    processes = []
    driver = None
    try:
        # The test server: two throttled files to watch, one small one.
        server = subprocess.Popen(
            [os.path.join(args.bin, "haul-test-server"), "movie.mkv:12000000:2000000", "dataset.tar:9000000:1500000",
             "notes.txt:20000", "readme.md:3000", "slow.bin:50000000:5000"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        processes.append(server)
        files_url = server.stdout.readline().strip()
        if not files_url.startswith("http://"):
            fail("the test server did not start")

        log = open(os.path.join(args.out, "daemon.log"), "w")
        daemon = subprocess.Popen(
            [haul, "daemon", "--listen", "127.0.0.1:0", "--state-dir", state, "--download-root", root, "-x", "1"],
            stdout=log, stderr=subprocess.STDOUT)
        processes.append(daemon)
        wait_for("the daemon writes its address", lambda: os.path.exists(os.path.join(state, "daemon.address")))
        base = open(os.path.join(state, "daemon.address")).read().split()[0]
        token = subprocess.run([haul, "daemon", "--print-token", "--state-dir", state],
                               capture_output=True, text=True, check=True).stdout.strip()
        link = subprocess.run([haul, "daemon", "--print-link", "--state-dir", state],
                              capture_output=True, text=True, check=True).stdout.strip()
        if link != f"{base}/#token={token}":
            fail(f"--print-link printed {link}")

        def api(path, method="GET", body=None):
            headers = {"Authorization": "Bearer " + token}
            if body is not None:
                headers["Content-Type"] = "application/json"
            request = urllib.request.Request(base + "/api/v1" + path, method=method, headers=headers,
                                             data=None if body is None else json.dumps(body).encode())
            with urllib.request.urlopen(request, timeout=DEADLINE) as response:
                return json.load(response) if response.status != 204 else None

        # The page forbids framing and foreign scripts.
        with urllib.request.urlopen(base + "/", timeout=DEADLINE) as response:
            policy = response.headers.get("Content-Security-Policy", "")
            if "frame-ancestors 'none'" not in policy or "script-src 'self'" not in policy:
                fail(f"the page's Content-Security-Policy is {policy!r}")

        options = Options()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,860",
                         "--disable-dev-shm-usage"]:
            options.add_argument(argument)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                                  options=options)
        driver.set_page_load_timeout(DEADLINE)

        # Without a token the page asks for one; a wrong one is refused, the right one connects.
        driver.get(base + "/")
        wait_for("the page asks for the token", lambda: driver.find_element(By.ID, "login").is_displayed())
        driver.find_element(By.ID, "token").send_keys("wrong-token-0123456789abcdef0123")
        driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait_for("a wrong token is refused", lambda: "not accept" in driver.find_element(By.ID, "login-error").text)
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait_for("the page connects", lambda: driver.find_element(By.ID, "app").is_displayed())

        # The link carries the token in its fragment; the page takes it and clears the address bar.
        driver.execute_script("sessionStorage.clear()")
        driver.get(link)
        wait_for("the link connects", lambda: driver.find_element(By.ID, "app").is_displayed())
        if "token" in driver.current_url:
            fail(f"the token stayed in the address bar: {driver.current_url}")

        def row(name):
            for element in driver.find_elements(By.CSS_SELECTOR, "#downloads .download"):
                if element.find_element(By.CSS_SELECTOR, ".name").text == name:
                    return element
            return None

        def state_of(name):
            element = row(name)
            return element.find_element(By.CSS_SELECTOR, ".state").text.lower() if element else None

        def fill(name):
            style = row(name).find_element(By.CSS_SELECTOR, ".fill").get_attribute("style")
            match = re.search(r"width:\s*([\d.]+)%", style)
            return float(match.group(1)) if match else 0.0

        def add(urls, connections=None):
            box = driver.find_element(By.ID, "urls")
            box.clear()
            box.send_keys("\n".join(urls))
            field = driver.find_element(By.ID, "connections")
            field.clear()
            if connections:
                field.send_keys(str(connections))
            driver.find_element(By.CSS_SELECTOR, "#add-form button[type=submit]").click()

        # 1. A download's progress bar moves while it runs, and it completes with the server's bytes.
        add([files_url + "/movie.mkv", files_url + "/notes.txt"])
        wait_for("movie.mkv runs", lambda: state_of("movie.mkv") == "running")
        first = wait_for("movie.mkv shows progress", lambda: fill("movie.mkv") > 0 and fill("movie.mkv"))
        wait_for("the progress bar moves", lambda: fill("movie.mkv") > first + 5)
        sizes = row("movie.mkv").find_element(By.CSS_SELECTOR, ".sizes").text
        if not re.fullmatch(r"\d+\.\d MiB / 11\.4 MiB", sizes):
            fail(f"movie.mkv's sizes read {sizes!r}")
        wait_for("a speed is shown", lambda: "/s" in row("movie.mkv").find_element(By.CSS_SELECTOR, ".speed").text)
        wait_for("movie.mkv is about half done", lambda: 30 < fill("movie.mkv") < 80)
        driver.save_screenshot(os.path.join(args.out, "daemon.png"))
        wait_for("movie.mkv completes", lambda: state_of("movie.mkv") == "completed")
        if fill("movie.mkv") != 100.0:
            fail(f"a completed download's bar is at {fill('movie.mkv')}%")
        if sha256_of_file(os.path.join(root, "movie.mkv")) != sha256_of_url(files_url + "/movie.mkv"):
            fail("movie.mkv differs from the server's file")

        # 2. Two connections asked for in the form, shown while it runs; pause and resume from the page.
        add([files_url + "/dataset.tar"], connections=2)
        wait_for("dataset.tar runs", lambda: state_of("dataset.tar") == "running" and fill("dataset.tar") > 0)
        wait_for("its two connections are shown",
                 lambda: "2 connections" in row("dataset.tar").find_element(By.CSS_SELECTOR, ".speed").text)
        row("dataset.tar").find_element(By.CSS_SELECTOR, '[data-action="pause"]').click()
        wait_for("dataset.tar is paused", lambda: state_of("dataset.tar") == "paused")
        paused = [d for d in api("/downloads")["downloads"] if d["name"] == "dataset.tar"][0]
        if paused["state"] != "paused" or not 0 < paused["bytes"] < 9000000 or paused.get("connections") != 2:
            fail(f"the API shows dataset.tar as {paused}")
        row("dataset.tar").find_element(By.CSS_SELECTOR, '[data-action="resume"]').click()
        wait_for("dataset.tar completes", lambda: state_of("dataset.tar") == "completed", timeout=2 * DEADLINE)
        if sha256_of_file(os.path.join(root, "dataset.tar")) != sha256_of_url(files_url + "/dataset.tar"):
            fail("dataset.tar differs from the server's file")

        # 3. Filters.
        if not wait_for_quietly(lambda: state_of("notes.txt") == "completed"):
            shown = {d["name"]: (d["state"], d["bytes"], d.get("error")) for d in api("/downloads")["downloads"]}
            fail(f"timed out waiting until notes.txt completes; the page shows {state_of('notes.txt')!r}, "
                 f"the API {shown}")
        driver.find_element(By.CSS_SELECTOR, '#filters [data-state="failed"]').click()
        wait_for("the failed filter is empty", lambda: driver.find_element(By.ID, "empty").is_displayed())
        driver.find_element(By.CSS_SELECTOR, '#filters [data-state="completed"]').click()
        wait_for("three completed", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#downloads .download")) == 3)

        # 4. Remove one from the list, keeping its file (two confirmations: remove, then keep the file).
        row("notes.txt").find_element(By.CSS_SELECTOR, '[data-action="remove"]').click()
        wait_for("the removal asks", lambda: driver.switch_to.alert).accept()
        wait_for("the page asks about the file", lambda: driver.switch_to.alert).dismiss()
        wait_for("notes.txt leaves the list", lambda: row("notes.txt") is None)
        if not os.path.exists(os.path.join(root, "notes.txt")):
            fail("the file of a download removed without deleting files is gone")
        if any(d["name"] == "notes.txt" for d in api("/downloads")["downloads"]):
            fail("the API still lists notes.txt")

        # 5. A label given to `haul get` (queued in the running daemon) is shown beside the name,
        #    and by the API.
        driver.find_element(By.CSS_SELECTOR, '#filters [data-state=""]').click()
        got = subprocess.run([haul, "get", "--label", "docs for v2", "--state-dir", state, "-d", root, "-q",
                              files_url + "/readme.md"], capture_output=True, text=True, timeout=DEADLINE)
        if got.returncode != 0:
            fail(f"haul get --label through the daemon exited {got.returncode}: {got.stderr}")
        wait_for("readme.md completes", lambda: state_of("readme.md") == "completed")
        label = wait_for("its label is shown", lambda: row("readme.md").find_element(By.CSS_SELECTOR, ".label"))
        if label.text != "docs for v2" or not label.is_displayed():
            fail(f"readme.md's label reads {label.text!r}")
        if [d.get("label") for d in api("/downloads")["downloads"] if d["name"] == "readme.md"] != ["docs for v2"]:
            fail("the API does not show readme.md's label")
        if any(element.is_displayed() for element in row("movie.mkv").find_elements(By.CSS_SELECTOR, ".label")):
            fail("a download without a label shows one")
        driver.save_screenshot(os.path.join(args.out, "daemon-label.png"))

        # 6. A queue of a few hundred, paged by the API: one download at once, taken by a slow one, so
        #    300 more (at a closed port, never started) stay queued. With 20 rows a page the page
        #    shows the API's pages, a filter shows the API's count, and events update what is shown.
        api("/options", "PATCH", {"maxConcurrentDownloads": 1})
        api("/downloads", "POST", {"downloads": [{"url": files_url + "/slow.bin"}]})
        wait_for("slow.bin runs", lambda: api("/downloads?state=running")["total"] == 1)
        api("/downloads", "POST", {"downloads": [{"url": f"http://127.0.0.1:9/f{i:03}"} for i in range(300)]})

        def names_shown():
            return [element.find_element(By.CSS_SELECTOR, ".name").text
                    for element in driver.find_elements(By.CSS_SELECTOR, "#downloads .download")]

        def names_of(query):
            return [d["name"] for d in api("/downloads?" + query)["downloads"]]

        def shows(query):
            # The API's rows for the query now: a download may change while the page catches up.
            return lambda: names_shown() == names_of(query)

        def count_on(state):
            text = driver.find_element(By.CSS_SELECTOR, f'#filters [data-state="{state}"] .count').text
            return int(re.sub(r"\D", "", text) or -1)

        driver.get(base + "/?pageSize=20")
        wait_for("the first page shows the first 20", shows("offset=0&limit=20"))
        if len(driver.find_elements(By.CSS_SELECTOR, "#downloads .download")) != 20:
            fail("the first page does not show 20 rows")
        total = api("/downloads?limit=1")["total"]
        wait_for("All counts the whole queue", lambda: count_on("") == total)
        pager = driver.find_element(By.CSS_SELECTOR, ".pager.top")
        if not pager.find_element(By.CSS_SELECTOR, '[data-go="previous"]').get_attribute("disabled"):
            fail("Previous is enabled on the first page")
        pager.find_element(By.CSS_SELECTOR, '[data-go="next"]').click()
        wait_for("the next page shows the next 20", shows("offset=20&limit=20"))
        wait_for("the range reads 21–40", lambda: pager.find_element(By.CSS_SELECTOR, ".range").text
                 == f"21–40 of {total}")
        # An event about a download shown updates its row.
        shown = names_shown()[5]
        target = [d for d in api("/downloads?offset=20&limit=20")["downloads"] if d["name"] == shown][0]
        api(f"/downloads/{target['id']}/pause", "POST")
        wait_for(f"{shown}, paused through the API, shows it", lambda: state_of(shown) == "paused")
        # A page typed in. An event may redraw the pager while the number is typed: it is typed
        # again into the field drawn then, up to three times.
        for _ in range(3):
            try:
                field = driver.find_element(By.CSS_SELECTOR, ".pager.top .page-number")
                field.clear()
                field.send_keys("3\n")
            except Exception:
                continue
            if wait_for_quietly(shows("offset=40&limit=20"), timeout=DEADLINE / 3):
                break
        else:
            fail("timed out waiting until page 3 shows rows 41–60")
        # A filter is the API's: its rows, and its count from the stats.
        driver.find_element(By.CSS_SELECTOR, '#filters [data-state="queued"]').click()
        wait_for("the queued filter shows the API's first queued", shows("state=queued&offset=0&limit=20"))
        if any(state_of(name) != "queued" for name in names_shown()):
            fail("the queued filter shows a download that is not queued")
        queued = api("/stats")["counts"]["queued"]
        if queued != 299:
            fail(f"the API counts {queued} queued, not 299")
        wait_for("the queued count is the API's", lambda: count_on("queued") == queued)
        wait_for("the paused count is the API's", lambda: count_on("paused") == api("/stats")["counts"]["paused"])
        # The last page; a download added there appears, one added to a full page goes to the next.
        driver.find_element(By.CSS_SELECTOR, '.pager.top [data-go="last"]').click()
        wait_for("the last page shows the last queued", shows(f"state=queued&offset={(queued - 1) // 20 * 20}&limit=20"))
        before = len(names_shown())
        api("/downloads", "POST", {"downloads": [{"url": "http://127.0.0.1:9/latecomer"}]})
        if before < 20:
            wait_for("a new download appears on the last page", lambda: names_shown()[-1:] == ["latecomer"])
        wait_for("the queued count grows", lambda: count_on("queued") == queued + 1)
        # A download leaving the filter leaves the page.
        first = names_shown()[0]
        first_id = [d["id"] for d in api(f"/downloads?state=queued&offset={(queued - 1) // 20 * 20}&limit=1")["downloads"]][0]
        api(f"/downloads/{first_id}/pause", "POST")
        wait_for(f"{first}, paused, leaves the queued filter", lambda: first not in names_shown())
        driver.find_element(By.CSS_SELECTOR, '#filters [data-state=""]').click()
        wait_for("All shows the first page", shows("offset=0&limit=20"))

        # 7. Schedules and rules: a window of the whole day holds at once, shown beside the title; a
        # rule that cannot hold is refused on the page and changes nothing.
        driver.find_element(By.CSS_SELECTOR, "#rules summary").click()
        text = driver.find_element(By.ID, "rules-text")
        wait_for("the rules show as JSON", lambda: json.loads(text.get_attribute("value") or "null") is not None)
        text.clear()
        text.send_keys('{"speedLimits": [{"from": "00:00", "to": "00:00", "limitRate": 52428800}]}')
        driver.find_element(By.ID, "rules-save").click()
        wait_for("the page says turtle mode", lambda: "turtle mode: 50.0 MiB/s" in driver.find_element(By.ID, "rules-now").text)
        if api("/rules")["now"]["limitRate"] != 52428800:
            fail(f"the API's rules after saving from the page: {api('/rules')}")
        text.clear()
        text.send_keys('{"speedLimits": [{"from": "25:00", "to": "00:00", "limitRate": 1}]}')
        driver.find_element(By.ID, "rules-save").click()
        wait_for("a rule that cannot hold is refused", lambda: "HH:MM" in driver.find_element(By.ID, "rules-error").text)
        if api("/rules")["rules"]["speedLimits"][0]["limitRate"] != 52428800:
            fail("a refused rule changed the rules")
        driver.save_screenshot(os.path.join(args.out, "daemon-rules.png"))

        # 8. A phone-width window: nothing wider than the screen.
        driver.set_window_size(390, 844)
        time.sleep(0.3)
        overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        if overflow > 0:
            fail(f"the page is {overflow} px wider than a phone's window")
        driver.save_screenshot(os.path.join(args.out, "daemon-phone.png"))
        print(f"browser test: passed; screenshots in {args.out}")
    finally:
        if driver:
            driver.quit()
        stop_processes(processes)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
