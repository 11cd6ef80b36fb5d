"use strict";
// The page of `haul daemon`: the downloads from the API, kept live by its event stream.

const API = "/api/v1";
const downloads = new Map();
// Events counted as they arrive, and for each download the count at its last event: an answer to a
// request sent before that event is older than what the event showed, and is not applied.
let eventCount = 0;
const lastEvent = new Map();

// Shows `d` as an answer to a request sent when `eventCount` was `sentAt`, unless an event about it
// arrived since.
function applyAnswer(d, sentAt) {
  if ((lastEvent.get(d.id) ?? -1) <= sentAt) downloads.set(d.id, d);
}
const rows = new Map();
let token = sessionStorage.getItem("haul.token");
let filter = "";
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
  history.replaceState(null, "", location.pathname);
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
  const shown = [...downloads.values()]
    .filter((d) => !filter || d.state === filter)
    .sort((a, b) => a.id - b.id);
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
  $("empty").hidden = shown.length > 0;
  renderTotals();
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
  row.querySelector(".speed").textContent = speed;
  row.querySelector(".eta").textContent = running && d.secondsRemaining != null ? duration(d.secondsRemaining) + " left" : "";
  row.querySelector('[data-action="pause"]').hidden = !(d.state === "queued" || running);
  row.querySelector('[data-action="resume"]').hidden = d.state !== "paused";
  row.querySelector('[data-action="retry"]').hidden = !(d.state === "failed" || d.state === "cancelled");
  row.querySelector(".error").textContent = d.error ? d.error.message : "";
}

function renderTotals() {
  let speed = 0;
  const counts = {};
  for (const d of downloads.values()) {
    if (d.state === "running" && d.bytesPerSecond) speed += d.bytesPerSecond;
    counts[d.state] = (counts[d.state] || 0) + 1;
  }
  $("speed").textContent = bytes(Math.round(speed)) + "/s";
  $("counts").textContent = ["running", "queued", "paused", "completed", "failed"]
    .filter((state) => counts[state])
    .map((state) => `${counts[state]} ${state}`)
    .join(" · ");
  document.title = speed > 0 ? `${bytes(Math.round(speed))}/s · Haul` : "Haul";
}

// MARK: Loading and live events

// The list, and where the event stream goes on from: the ID of the last event before the list was
// read, so that every change after it is replayed and none is missed.
async function loadAll() {
  const all = [];
  let since = null;
  for (let offset = 0; ; offset += 1000) {
    const page = await call("GET", `/downloads?offset=${offset}&limit=1000`);
    if (since === null) since = page.lastEventId;
    all.push(...page.downloads);
    if (all.length >= page.total || page.downloads.length === 0) break;
  }
  if (!streaming || streaming.signal.aborted) lastEventId = since;
  downloads.clear();
  for (const d of all) downloads.set(d.id, d);
  scheduleRender();
}

function showOptions(options) {
  $("max-concurrent").value = options.maxConcurrentDownloads;
  $("total-limit").value = options.totalLimitRate == null ? "" : +(options.totalLimitRate / 1048576).toFixed(2);
}

async function loadOptions() {
  showOptions(await call("GET", "/options"));
}

function handleEvent(name, data) {
  if (name === "reset") {
    loadAll().catch(() => {});
    return;
  }
  const payload = JSON.parse(data);
  const d = payload.download;
  if (!d) return;
  lastEvent.set(d.id, ++eventCount);
  if (name === "removed") {
    downloads.delete(d.id);
  } else {
    const before = downloads.get(d.id);
    downloads.set(d.id, d);
    if (name === "state" && d.state === "completed" && before && before.state !== "completed") notify(d);
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
    await loadAll();
    await loadOptions();
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
    const sentAt = eventCount;
    const added = await call("POST", "/downloads", { downloads: items });
    for (const d of added.downloads) applyAnswer(d, sentAt);
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
    } else {
      const sentAt = eventCount;
      applyAnswer(await call("POST", `/downloads/${id}/${action}`), sentAt);
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
  for (const other of $("filters").querySelectorAll("button")) other.classList.toggle("on", other === button);
  scheduleRender();
});

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

$("pause-all").addEventListener("click", () => call("POST", "/pause-all").then(loadAll).catch(() => {}));
$("resume-all").addEventListener("click", () => call("POST", "/resume-all").then(loadAll).catch(() => {}));

if (token) start();
else showLogin();
