"use strict";
// The page of `haul daemon`: the downloads from the API, kept live by its event stream.

const API = "/api/v1";
const STATES = ["running", "queued", "paused", "completed", "failed", "cancelled"];

// Rows a page shows: `?pageSize=20` in the address, or `haul.pageSize` in localStorage; 50 when
// neither gives a number from 1 to 1000 (the API's largest page).
function configuredPageSize() {
  let asked = new URLSearchParams(location.search).get("pageSize");
  try {
    asked = asked || localStorage.getItem("haul.pageSize");
  } catch (error) {}
  const size = Number(asked);
  return Number.isInteger(size) && size >= 1 && size <= 1000 ? size : 50;
}
const pageSize = configuredPageSize();

// The page shown: its downloads by ID (only these are held, however long the queue), which page of
// which filter, and how many downloads the filter has over every page.
const downloads = new Map();
let filter = "";
let page = 0;
let total = 0;
let loaded = false;
// The queue as a whole, from /stats: downloads by state and the speed.
let counts = {};
let speed = 0;
// This daemon's name when it is a worker of a fleet (null: a queue of its own).
let fleetWorker = null;

// Events counted as they arrive, and for each download the count at its last event and what it
// showed (null: removed): an answer to a request sent before that event is older than what the
// event showed, and is not applied. Kept only while an answer is awaited: a request sent later
// is newer than every event before it.
let eventCount = 0;
const lastEvent = new Map();
const eventDownload = new Map();
let awaiting = 0;

// Runs `work(sentAt)`, which sends a request and applies its answer, with the events that arrive
// meanwhile recorded.
async function whileAwaiting(work) {
  awaiting += 1;
  try {
    return await work(eventCount);
  } finally {
    awaiting -= 1;
    if (awaiting === 0) {
      lastEvent.clear();
      eventDownload.clear();
    }
  }
}

// `d` as an answer to a request sent when `eventCount` was `sentAt` had it, or as an event about it
// since showed it (null: removed since).
function newest(d, sentAt) {
  return (lastEvent.get(d.id) ?? -1) <= sentAt ? d : eventDownload.get(d.id) ?? null;
}

// Shows `d` as an answer to a request sent when `eventCount` was `sentAt`, unless an event about it
// arrived since: in its row when it is shown, as a new row when it belongs on this page.
function applyAnswer(d, sentAt) {
  if ((lastEvent.get(d.id) ?? -1) > sentAt) return;
  if (downloads.has(d.id) ? matches(d) : belongsHere(d)) downloads.set(d.id, d);
}

// Whether `d` is in the filter shown.
function matches(d) {
  return !filter || d.state === filter;
}

// Whether `d`, not shown, goes on this page: IDs grow, so a new download goes at the end of the
// last page, when that has room.
function belongsHere(d) {
  if (!matches(d) || downloads.size >= pageSize) return false;
  if (downloads.size === 0) return page === 0 || page * pageSize >= total - 1;
  return d.id > Math.max(...downloads.keys());
}

function pages() {
  return Math.max(1, Math.ceil(total / pageSize));
}

const rows = new Map();
let token = sessionStorage.getItem("haul.token");
let lastEventId = null;
let renderQueued = false;
let streaming = null;

const $ = (id) => document.getElementById(id);

// A link `http://…/#token=…` (what `haul daemon` prints) carries the token; the fragment never
// reaches the server, and it leaves the address bar at once.
function takeTokenFromLink() {
  const match = location.hash.match(/token=([A-Za-z0-9]+)/);
  if (!match) return false;
  token = match[1];
  sessionStorage.setItem("haul.token", token);
  history.replaceState(null, "", location.pathname + location.search);
  return true;
}
takeTokenFromLink();
window.addEventListener("hashchange", () => {
  if (takeTokenFromLink()) start();
});

async function call(method, path, body) {
  const headers = { Authorization: "Bearer " + token };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(API + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) {
    showLogin("The daemon did not accept this token.");
    throw new Error("unauthorized");
  }
  if (response.status === 204) return null;
  const data = await response.json();
  if (!response.ok) throw new Error(data.error ? data.error.message : response.statusText);
  return data;
}

// MARK: Formatting

function bytes(count) {
  if (count == null) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = count;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

function duration(seconds) {
  if (seconds == null || !isFinite(seconds)) return "";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

// MARK: Rendering

function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    render();
  });
}

function render() {
  const list = $("downloads");
  const shown = [...downloads.values()].sort((a, b) => a.id - b.id);
  const keep = new Set(shown.map((d) => d.id));
  for (const [id, row] of rows) {
    if (!keep.has(id)) {
      row.remove();
      rows.delete(id);
    }
  }
  let previous = null;
  for (const download of shown) {
    let row = rows.get(download.id);
    if (!row) {
      row = $("row").content.firstElementChild.cloneNode(true);
      row.dataset.id = download.id;
      rows.set(download.id, row);
    }
    update(row, download);
    const expected = previous ? previous.nextSibling : list.firstChild;
    if (expected !== row) list.insertBefore(row, expected);
    previous = row;
  }
  $("empty").hidden = !loaded || shown.length > 0;
  renderTotals();
  renderPager(shown.length);
}

function update(row, d) {
  row.className = "download " + d.state;
  row.querySelector(".name").textContent = d.name;
  // The user's label, as a tag beside the name.
  let label = row.querySelector(".label");
  if (d.label && !label) {
    label = document.createElement("span");
    label.className = "label";
    // Its right margin keeps it beside the name, the state at the row's end.
    Object.assign(label.style, { margin: "0 auto 0 0.6em", padding: "0 0.4em", borderRadius: "0.3em",
      fontSize: "0.85em", background: "#e8e8ef", overflowWrap: "anywhere" });
    row.querySelector(".name").after(label);
  }
  if (label) {
    label.textContent = d.label || "";
    label.hidden = !d.label;
  }
  row.querySelector(".url").textContent = d.url;
  row.querySelector(".url").title = d.url;
  const state = row.querySelector(".state");
  state.textContent = d.state;
  state.className = "state " + d.state;
  const fraction = d.fraction != null ? d.fraction : d.state === "completed" ? 1 : 0;
  row.querySelector(".fill").style.width = (fraction * 100).toFixed(1) + "%";
  row.querySelector(".progress").setAttribute("aria-valuenow", Math.round(fraction * 100));
  row.querySelector(".sizes").textContent =
    d.totalBytes != null ? `${bytes(d.bytes)} / ${bytes(d.totalBytes)}` : bytes(d.bytes);
  const running = d.state === "running";
  let speed = running && d.bytesPerSecond ? bytes(Math.round(d.bytesPerSecond)) + "/s" : "";
  if (speed && d.openConnections > 1) speed += ` · ${d.openConnections} connections`;
  // In a fleet, which worker runs it.
  if (running && fleetWorker && d.worker) speed += (speed ? " · " : "") + (d.worker === fleetWorker ? "on this worker" : `on ${d.worker}`);
  row.querySelector(".speed").textContent = speed;
  row.querySelector(".eta").textContent = running && d.secondsRemaining != null ? duration(d.secondsRemaining) + " left" : "";
  row.querySelector('[data-action="pause"]').hidden = !(d.state === "queued" || running);
  row.querySelector('[data-action="resume"]').hidden = d.state !== "paused";
  row.querySelector('[data-action="retry"]').hidden = !(d.state === "failed" || d.state === "cancelled");
  row.querySelector(".error").textContent = d.error ? d.error.message : "";
}

const number = (count) => count.toLocaleString("en-US");

function renderTotals() {
  $("speed").textContent = bytes(Math.round(speed)) + "/s";
  $("counts").textContent = STATES.filter((state) => counts[state])
    .map((state) => `${number(counts[state])} ${state}`)
    .join(" · ");
  const all = STATES.reduce((sum, state) => sum + (counts[state] || 0), 0);
  for (const button of $("filters").querySelectorAll("button")) {
    button.querySelector(".count").textContent = number(button.dataset.state ? counts[button.dataset.state] || 0 : all);
  }
  document.title = speed > 0 ? `${bytes(Math.round(speed))}/s · Haul` : "Haul";
}

function renderPager(shown) {
  const last = pages() - 1;
  const first = page * pageSize;
  const range = shown ? `${number(first + 1)}–${number(first + shown)} of ${number(total)}` : `0 of ${number(total)}`;
  for (const pager of document.querySelectorAll(".pager")) {
    pager.hidden = !loaded || total <= pageSize && page === 0;
    for (const button of pager.querySelectorAll("button[data-go]")) {
      const go = button.dataset.go;
      button.disabled = go === "first" || go === "previous" ? page === 0 : page >= last;
    }
    pager.querySelector(".range").textContent = range;
    const field = pager.querySelector(".page-number");
    if (field) {
      field.max = last + 1;
      if (document.activeElement !== field) field.value = page + 1;
      pager.querySelector(".pages").textContent = number(last + 1);
    }
  }
}

// MARK: Loading and live events

// The page shown, and where the event stream goes on from: the ID of the last event before the
// page was read, so that every change after it is replayed and none is missed. Only the newest
// request's answer is shown (the user may have moved on meanwhile).
let pageRequest = 0;
function loadPage() {
  const request = ++pageRequest;
  return whileAwaiting(async (sentAt) => {
    const asked = page;
    let path = `/downloads?offset=${asked * pageSize}&limit=${pageSize}`;
    if (filter) path += `&state=${filter}`;
    $("downloads").setAttribute("aria-busy", "true");
    const answer = await call("GET", path);
    if (request !== pageRequest) return;
    $("downloads").removeAttribute("aria-busy");
    if (!streaming || streaming.signal.aborted) lastEventId = answer.lastEventId;
    total = answer.total;
    // Past the end (downloads removed meanwhile): the last page instead.
    if (answer.downloads.length === 0 && asked > 0 && total > 0) {
      page = pages() - 1;
      return loadPage();
    }
    downloads.clear();
    for (const d of answer.downloads) {
      const now = newest(d, sentAt);
      if (now && matches(now)) downloads.set(now.id, now);
    }
    loaded = true;
    scheduleRender();
  });
}

// Counts by state and the speed, for the whole queue (not counted from the rows held).
async function loadStats() {
  const stats = await call("GET", "/stats");
  counts = stats.counts;
  speed = stats.bytesPerSecond || 0;
  fleetWorker = stats.worker || null;
  total = filter ? counts[filter] || 0 : STATES.reduce((sum, state) => sum + (counts[state] || 0), 0);
  if (loaded && page > pages() - 1) {
    page = pages() - 1;
    pageSoon();
  }
  scheduleRender();
}

function reload() {
  return Promise.all([loadPage(), loadStats()]);
}

// `work` at most once per `interval` ms: a call while one is due is part of it, and one just after
// it runs waits for the rest of the interval.
function throttled(work, interval) {
  let timer = null;
  let last = 0;
  return () => {
    if (timer) return;
    timer = setTimeout(() => {
      timer = null;
      last = Date.now();
      work().catch(() => {});
    }, Math.max(0, last + interval - Date.now()));
  };
}
const statsSoon = throttled(loadStats, 1000);
const pageSoon = throttled(loadPage, 500);

function showOptions(options) {
  $("max-concurrent").value = options.maxConcurrentDownloads;
  $("total-limit").value = options.totalLimitRate == null ? "" : +(options.totalLimitRate / 1048576).toFixed(2);
}

async function loadOptions() {
  showOptions(await call("GET", "/options"));
}

// The schedules and rules: the JSON to edit (left alone while it is being edited), and where they
// stand now beside the section's title.
function showRules(state, replaceText) {
  const now = state.now;
  const parts = [];
  if (now.limitRate != null) parts.push("turtle mode: " + bytes(now.limitRate) + "/s");
  if (!now.startsDownloads) parts.push("outside the start windows: nothing starts");
  $("rules-now").textContent = parts.length ? "— " + parts.join("; ") : "";
  if (replaceText) $("rules-text").value = JSON.stringify(state.rules, null, 2);
}

async function loadRules(replaceText) {
  showRules(await call("GET", "/rules"), replaceText);
}

// An event updates its row when the download is shown, and the counts always; a new download
// appears when it belongs on this page. A download that enters or leaves the filter shown reloads
// the page (at most twice a second), to keep it in step.
function handleEvent(name, data) {
  if (name === "reset") {
    reload().catch(() => {});
    return;
  }
  const payload = JSON.parse(data);
  const d = payload.download;
  if (!d) return;
  eventCount += 1;
  if (awaiting > 0) {
    lastEvent.set(d.id, eventCount);
    eventDownload.set(d.id, name === "removed" ? null : d);
  }
  statsSoon();
  const before = downloads.get(d.id);
  if (name === "state" && d.state === "completed" && (!before || before.state !== "completed")) notify(d);
  if (before) {
    if (name !== "removed" && matches(d)) {
      downloads.set(d.id, d);
    } else {
      downloads.delete(d.id);
      pageSoon();
    }
  } else if (name !== "removed") {
    if (belongsHere(d)) downloads.set(d.id, d);
    else if (filter && matches(d) && (downloads.size < pageSize || d.id < Math.max(...downloads.keys()))) pageSoon();
  }
  scheduleRender();
}

// The event stream read with fetch, which can send the token (EventSource cannot); it reconnects
// with Last-Event-ID, so nothing is missed, or gets a reset and reloads the list.
async function streamEvents() {
  const controller = new AbortController();
  streaming = controller;
  while (!controller.signal.aborted) {
    try {
      const headers = { Authorization: "Bearer " + token };
      if (lastEventId) headers["Last-Event-ID"] = lastEventId;
      const response = await fetch(API + "/events", { headers, signal: controller.signal });
      if (response.status === 401) {
        showLogin("The daemon did not accept this token.");
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let name = null;
          let data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("id: ")) lastEventId = line.slice(4);
            else if (line.startsWith("event: ")) name = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (name) handleEvent(name, data);
        }
      }
    } catch (error) {
      if (controller.signal.aborted) return;
    }
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

// MARK: Notifications

function notify(d) {
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  new Notification("Download complete", { body: d.name });
}

function offerNotifications() {
  const button = $("notify");
  if (!("Notification" in window) || Notification.permission !== "default") return;
  button.hidden = false;
  button.onclick = () => Notification.requestPermission().then(() => (button.hidden = true));
}

// MARK: Controls

function showLogin(message) {
  if (streaming) streaming.abort();
  sessionStorage.removeItem("haul.token");
  $("app").hidden = true;
  $("login").hidden = false;
  $("login-error").hidden = !message;
  $("login-error").textContent = message || "";
}

async function start() {
  if (streaming) streaming.abort();
  $("login").hidden = true;
  $("app").hidden = false;
  try {
    await Promise.all([loadPage(), loadStats(), loadOptions(), loadRules(true)]);
  } catch (error) {
    return;
  }
  offerNotifications();
  streamEvents();
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("haul.token", token);
  $("token").value = "";
  start();
});

$("add-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const urls = $("urls").value.split("\n").map((line) => line.trim()).filter((line) => line);
  const directory = $("directory").value.trim();
  const checksum = $("checksum").value.trim();
  const priority = Number($("priority").value);
  const connections = $("connections").value.trim();
  const items = urls.map((url) => {
    const item = { url, priority };
    if (directory) item.directory = directory;
    if (checksum) item.checksum = checksum;
    if (connections) item.connections = Number(connections);
    return item;
  });
  const error = $("add-error");
  try {
    await whileAwaiting(async (sentAt) => {
      const added = await call("POST", "/downloads", { downloads: items });
      for (const d of added.downloads) applyAnswer(d, sentAt);
    });
    statsSoon();
    $("urls").value = "";
    error.hidden = true;
    scheduleRender();
  } catch (failure) {
    error.textContent = failure.message;
    error.hidden = false;
  }
});

$("downloads").addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  const row = button.closest(".download");
  const id = Number(row.dataset.id);
  const d = downloads.get(id);
  const action = button.dataset.action;
  try {
    if (action === "remove") {
      if (!confirm(`Remove “${d.name}” from the list?`)) return;
      const deleteFiles = confirm(`Also delete the file of “${d.name}” from the disk?\n\nCancel keeps the file.`);
      await call("DELETE", `/downloads/${id}?deleteFiles=${deleteFiles}`);
      downloads.delete(id);
      pageSoon();
      statsSoon();
    } else {
      await whileAwaiting(async (sentAt) => applyAnswer(await call("POST", `/downloads/${id}/${action}`), sentAt));
    }
    scheduleRender();
  } catch (failure) {
    row.querySelector(".error").textContent = failure.message;
  }
});

$("filters").addEventListener("click", (event) => {
  const button = event.target.closest("button[data-state]");
  if (!button) return;
  filter = button.dataset.state;
  page = 0;
  for (const other of $("filters").querySelectorAll("button")) {
    other.classList.toggle("on", other === button);
    other.setAttribute("aria-pressed", other === button);
  }
  loadPage().catch(() => {});
});

// Moves to page `index` (from 0), within the pages there are.
function goTo(index) {
  const next = Math.min(Math.max(0, index), pages() - 1);
  if (!Number.isFinite(next) || next === page) return;
  page = next;
  scheduleRender();
  loadPage().catch(() => {});
}

for (const pager of document.querySelectorAll(".pager")) {
  pager.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-go]");
    if (!button) return;
    const go = button.dataset.go;
    goTo(go === "first" ? 0 : go === "previous" ? page - 1 : go === "next" ? page + 1 : pages() - 1);
    if (pager.classList.contains("bottom")) $("filters").scrollIntoView();
  });
  const field = pager.querySelector(".page-number");
  if (!field) continue;
  // A page number typed in: taken on Enter or when the field loses focus (an empty one is not).
  const take = () => {
    if (field.value.trim()) goTo(Math.round(Number(field.value)) - 1);
  };
  field.addEventListener("change", take);
  field.addEventListener("keydown", (event) => {
    if (event.key === "Enter") take();
  });
}

async function changeOptions(change) {
  try {
    showOptions(await call("PATCH", "/options", change));
  } catch (failure) {
    loadOptions().catch(() => {});
  }
}

$("max-concurrent").addEventListener("change", (event) =>
  changeOptions({ maxConcurrentDownloads: Number(event.target.value) }));

// Empty or 0: no limit.
$("total-limit").addEventListener("change", (event) => {
  const mebibytes = Number(event.target.value);
  changeOptions({ totalLimitRate: mebibytes > 0 ? Math.max(1, Math.round(mebibytes * 1048576)) : null });
});

$("rules-save").addEventListener("click", async () => {
  const error = $("rules-error");
  error.textContent = "";
  let rules;
  try {
    rules = JSON.parse($("rules-text").value || "{}");
  } catch (failure) {
    error.textContent = "Not JSON: " + failure.message;
    return;
  }
  try {
    showRules(await call("PUT", "/rules", rules), true);
  } catch (failure) {
    error.textContent = failure.message;
  }
});
// A window opens or closes on its own: where the rules stand is read again twice a minute.
setInterval(() => {
  if (token && !$("app").hidden) loadRules(false).catch(() => {});
}, 30000);

$("pause-all").addEventListener("click", () => call("POST", "/pause-all").then(reload).catch(() => {}));
$("resume-all").addEventListener("click", () => call("POST", "/resume-all").then(reload).catch(() => {}));

if (token) start();
else showLogin();
