#!/usr/bin/env python3
"""The daemon's page with a long queue, in headless Chromium (issue 24's target: with 100,000
downloads, the first rows drawn within 1 s of opening the page, the tab under 200 MiB).

Queues COUNT downloads with `haul add -i` (one slow file of the test server, each under a name of
its own), starts `haul daemon -j 3` on them, opens the page's link and measures: the time from
opening it until the first row is drawn, the same for the last page, and the tab's memory (the
renderer's resident set and the JavaScript heap) after it has followed the queue's events for
10 s. A screenshot goes to OUT/page-COUNT.png.

    bench/page.py --haul .build/release/haul --server .build/debug/haul-test-server [--count 100000] [--out DIR]

Needs chromium, chromium-driver (Debian) and selenium (PyPI), as scripts/browser-test.py does.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from checks import failer, poll, stop_processes, waiter  # noqa: E402

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

fail = failer("page bench")
wait_for = waiter(fail, 60)


def memory_mib(pid):
    """A process's resident set, proportional set (shared pages split among their users) and
    private pages, in MiB, from /proc/PID/smaps_rollup."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return fields.get("Rss"), fields.get("Pss"), fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def renderer_pid(driver_pid):
    """The Chromium renderer under the driver's process with the largest resident set."""
    table = subprocess.run(["ps", "-eo", "pid=,ppid=,rss=,args="], capture_output=True, text=True).stdout
    children, rss, renderer = {}, {}, set()
    for line in table.splitlines():
        pid, ppid, kib, args = line.split(None, 3)
        children.setdefault(int(ppid), []).append(int(pid))
        rss[int(pid)] = int(kib)
        if "--type=renderer" in args:
            renderer.add(int(pid))
    found, todo = [], [driver_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    renderers = [pid for pid in found if pid in renderer]
    return max(renderers, key=lambda pid: rss[pid]) if renderers else None


def first_row_after(driver, action):
    """Seconds from `action` until the list shows a row it did not show before."""
    before = [element.id for element in driver.find_elements(By.CSS_SELECTOR, "#downloads .download")[:1]]
    start = time.monotonic()
    action()
    wait_for("a row is drawn", lambda: [element.id for element in
                                       driver.find_elements(By.CSS_SELECTOR, "#downloads .download")[:1]] not in
             ([], before))
    return time.monotonic() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--haul", default=".build/release/haul")
    parser.add_argument("--server", default=".build/debug/haul-test-server")
    parser.add_argument("--count", type=int, default=100000)
    parser.add_argument("--out", default=".build/page-bench")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="haul-page-")
    state, root = os.path.join(work, "state"), os.path.join(work, "files")
    os.makedirs(root)
    processes, driver = [], None
    try:
        server = subprocess.Popen([args.server, "slow.bin:50000000:20000"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        processes.append(server)
        files_url = server.stdout.readline().strip()
        if not files_url.startswith("http://"):
            fail("the test server did not start")
        with open(os.path.join(work, "list.txt"), "w") as listing:
            for n in range(1, args.count + 1):
                listing.write(f"{files_url}/slow.bin?n={n}\n  out=f{n}.bin\n")
        start = time.monotonic()
        subprocess.run([args.haul, "add", "-i", os.path.join(work, "list.txt"), "-d", root, "--state-dir", state],
                       stdout=subprocess.DEVNULL, check=True)
        added = time.monotonic() - start

        log = open(os.path.join(args.out, "daemon.log"), "w")
        daemon = subprocess.Popen([args.haul, "daemon", "--listen", "127.0.0.1:0", "--state-dir", state,
                                   "--download-root", root, "-j", "3"], stdout=log, stderr=subprocess.STDOUT)
        processes.append(daemon)
        wait_for("the daemon writes its address", lambda: os.path.exists(os.path.join(state, "daemon.address")),
                 timeout=120)
        link = subprocess.run([args.haul, "daemon", "--print-link", "--state-dir", state],
                              capture_output=True, text=True, check=True).stdout.strip()

        options = Options()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,860",
                         "--disable-dev-shm-usage", "--enable-precise-memory-info"]:
            options.add_argument(argument)
        service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
        driver = webdriver.Chrome(service=service, options=options)
        driver.set_page_load_timeout(60)

        opened = first_row_after(driver, lambda: driver.get(link))
        counted = poll(lambda: str(args.count) in "".join(filter(str.isdigit, driver.find_element(
            By.ID, "counts").text + driver.find_element(By.CSS_SELECTOR, ".pager.top .range").text)), 60)
        if not counted:
            fail("the page does not show the queue's count: " + driver.find_element(By.ID, "counts").text
                 + " / " + driver.find_element(By.CSS_SELECTOR, ".pager.top .range").text)
        last = first_row_after(
            driver, lambda: driver.find_element(By.CSS_SELECTOR, '.pager.top [data-go="last"]').click())
        driver.find_element(By.CSS_SELECTOR, '.pager.top [data-go="first"]').click()
        poll(lambda: False, 10)  # ten seconds of the queue's events
        heap = driver.execute_script("return performance.memory ? performance.memory.usedJSHeapSize : null")
        rows = len(driver.find_elements(By.CSS_SELECTOR, "#downloads .download"))
        driver.save_screenshot(os.path.join(args.out, f"page-{args.count}.png"))
        tab = renderer_pid(service.process.pid)
        rss, pss, private = memory_mib(tab) if tab else (None, None, None)
        # The same browser's renderer for an empty page, for scale.
        driver.get("about:blank")
        poll(lambda: False, 2)
        blank = renderer_pid(service.process.pid)
        blank_rss, blank_pss, blank_private = memory_mib(blank) if blank else (None, None, None)
        screenshot = os.path.join(args.out, f"page-{args.count}.png")
        print(f"**The daemon's page with {args.count} downloads** (headless Chromium, "
              f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d', time.gmtime())}):")
        print()
        print("| measurement | figure | target | |")
        print("|---|---|---|---|")
        print(f"| `haul add -i` of the queue | {added:.2f} s | | |")
        print(f"| opening the page's link until the first row is drawn | {opened:.2f} s | ≤ 1 s | "
              f"{'pass' if opened <= 1 else '**fail**'} |")
        print(f"| the last page until its first row is drawn | {last:.2f} s | | |")
        print(f"| rows drawn | {rows} | | |")
        if rss is not None:
            print(f"| the tab (renderer) after 10 s of events: private memory | {private:.1f} MiB | < 200 MiB | "
                  f"{'pass' if private < 200 else '**fail**'} |")
            print(f"| the same: proportional set, resident set | {pss:.1f} MiB, {rss:.1f} MiB | | |")
        if heap is not None:
            print(f"| the tab's JavaScript heap in use | {heap / 1048576:.1f} MiB | | |")
        if blank_rss is not None:
            print(f"| the renderer of an empty page (about:blank), for scale: private, proportional, resident | "
                  f"{blank_private:.1f} MiB, {blank_pss:.1f} MiB, {blank_rss:.1f} MiB | | |")
        print()
        print(f"Screenshot: {screenshot}")
    finally:
        if driver is not None:
            driver.quit()
        stop_processes(processes)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
