// Haul's browser extension: the background. Chromium runs it as the service worker, Firefox as the
// event page (manifest.json names it both ways). Neither keeps it alive: everything it knows between
// events lives in chrome.storage, the badge is refreshed by chrome.alarms, and no state is kept in
// variables that a sleeping worker would lose (but for caches that are rebuilt on demand).
//
// It sends a link to a Haul daemon (`POST /api/v1/downloads`) or to anything that speaks aria2's
// JSON-RPC (`aria2.addUri`), from the context menu on links and, when the user turns it on, in
// place of the browser's own downloads. Only the chrome.* namespace is used, with callbacks, which
// Chromium and Firefox both support.
//
// The token is never logged: nothing here writes settings or requests to the console.
"use strict";

const DEFAULTS = {
  address: "http://127.0.0.1:6842",
  token: "",
  protocol: "haul", // "haul": Haul's API; "aria2": aria2's JSON-RPC
  captureEnabled: false,
  captureMinBytes: 0, // 0: no minimum
  captureExtensions: "", // "iso,zip,mkv"; empty: any
};
const MENU_ID = "haul-download-link";
const BADGE_ALARM = "haul-badge";
const REQUEST_TIME_LIMIT_MS = 15000;
const BADGE_COLOR = "#2563eb";
const ERROR_COLOR = "#c53030";

// --- Small helpers --------------------------------------------------------------------------------

/** Calls `target[method](...args, callback)` and returns a promise of its result. */
function call(target, method, ...args) {
  return new Promise((resolve, reject) => {
    try {
      target[method](...args, (result) => {
        const error = chrome.runtime.lastError;
        if (error) reject(new Error(error.message));
        else resolve(result);
      });
    } catch (error) {
      reject(error);
    }
  });
}

async function settings() {
  const stored = await call(chrome.storage.local, "get", Object.keys(DEFAULTS));
  return { ...DEFAULTS, ...stored };
}

/** The daemon's base address: no trailing slash, no `/jsonrpc` (added back for aria2). */
function baseAddress(address) {
  return String(address || DEFAULTS.address).trim().replace(/\/+$/, "").replace(/\/jsonrpc$/, "");
}

/**
 * Whether the daemon's address is this machine: 127.0.0.0/8, [::1] or localhost. Cookies go to
 * such a daemon only: they are the user's sessions, and a daemon elsewhere is another machine.
 */
function isLoopback(address) {
  let host;
  try {
    host = new URL(baseAddress(address)).hostname.toLowerCase();
  } catch (error) {
    return false;
  }
  if (host === "localhost" || host === "[::1]") return true;
  // The URL parser writes every IPv4 form (127.1, 0x7f.1) as four decimal numbers.
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

function isWebURL(url) {
  return /^https?:\/\//i.test(String(url || ""));
}

/** The last path component of a file name or path, made safe as a file name, or null. */
function safeFileName(name) {
  if (!name) return null;
  let last = String(name).split(/[\\/]/).pop() || "";
  last = last.replace(/[\u0000-\u001f\u007f]/g, "").trim().replace(/^\.+/, "").trim();
  return last && last !== "." && last !== ".." ? last : null;
}

/** The file name a URL's path ends with, or null. */
function nameFromURL(url) {
  try {
    return safeFileName(decodeURIComponent(new URL(url).pathname.split("/").pop() || ""));
  } catch (error) {
    return null;
  }
}

/** `Cookie` header value for `url` from the browser's cookie jar, or "". */
async function cookieHeader(url) {
  try {
    const cookies = await call(chrome.cookies, "getAll", { url });
    // Longer paths first, as browsers send them.
    cookies.sort((a, b) => (b.path || "").length - (a.path || "").length);
    return cookies.map((cookie) => (cookie.name ? `${cookie.name}=${cookie.value}` : cookie.value)).join("; ");
  } catch (error) {
    return "";
  }
}

async function fetchWithTimeLimit(url, init) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), REQUEST_TIME_LIMIT_MS);
  try {
    return await fetch(url, { ...init, signal: controller.signal, credentials: "omit", cache: "no-store" });
  } catch (error) {
    if (error && error.name === "AbortError") {
      throw new Error(`no answer from ${url} within ${REQUEST_TIME_LIMIT_MS / 1000} s`);
    }
    throw new Error(`cannot reach ${url}: ${error && error.message ? error.message : error}`);
  } finally {
    clearTimeout(timer);
  }
}

/** This extension's origin, which the daemon must be told with `--allow-origin`. */
function extensionOrigin() {
  return new URL(chrome.runtime.getURL("")).origin;
}

// --- Haul's API ------------------------------------------------------------------------------------

/** A request to Haul's API; the parsed JSON answer, or an Error that says what the daemon said. */
async function haulAPI(config, path, method = "GET", body = undefined) {
  const url = baseAddress(config.address) + "/api/v1" + path;
  const headers = { Authorization: "Bearer " + config.token };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetchWithTimeLimit(url, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch (error) {
    json = null;
  }
  if (!response.ok) {
    const error = new Error(describeHaulError(response.status, json, text));
    error.status = response.status;
    error.code = json && json.error && json.error.code;
    throw error;
  }
  return json;
}

function describeHaulError(status, json, text) {
  const code = json && json.error && json.error.code;
  const message = json && json.error && json.error.message;
  let line = `the daemon answered ${status}` + (code ? ` ${code}` : "") + (message ? `: ${message}` : "");
  if (!code && text) line += `: ${text.slice(0, 200)}`;
  if (status === 401) line += " (check the token: haul daemon --print-token)";
  if (code === "forbiddenOrigin") line += ` (start it with: haul daemon --allow-origin ${extensionOrigin()})`;
  return line;
}

async function sendToHaul(config, request) {
  const download = { url: request.url };
  if (request.fileName) download.destination = request.fileName;
  if (request.headers.length) download.headers = request.headers;
  const answer = await haulAPI(config, "/downloads", "POST", { downloads: [download] });
  const added = answer && answer.downloads && answer.downloads[0];
  return { id: added ? added.id : null, name: added ? added.name : request.fileName };
}

// --- aria2's JSON-RPC ------------------------------------------------------------------------------

async function aria2(config, method, params = []) {
  const url = baseAddress(config.address) + "/jsonrpc";
  const all = config.token ? ["token:" + config.token, ...params] : params;
  const response = await fetchWithTimeLimit(url, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: "haul-extension", method, params: all }),
  });
  const text = await response.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch (error) {
    json = null;
  }
  if (json && json.error) {
    let line = `${method} failed: ${json.error.message || "error"} (code ${json.error.code})`;
    if (json.error.message === "Unauthorized") line += " (check the secret: haul daemon --print-token)";
    throw new Error(line);
  }
  if (!response.ok || !json || !("result" in json)) {
    // Haul refuses a foreign origin before it reads the call, with its own error body.
    const code = json && json.error && json.error.code;
    let line = `${url} answered ${response.status}` + (text ? `: ${text.slice(0, 200)}` : "");
    if (response.status === 403) line += ` (a Haul daemon needs: haul daemon --allow-origin ${extensionOrigin()})`;
    const error = new Error(line);
    error.code = code;
    throw error;
  }
  return json.result;
}

async function sendToAria2(config, request) {
  const options = {};
  if (request.fileName) options.out = request.fileName;
  if (request.headers.length) options.header = request.headers.map((header) => `${header.name}: ${header.value}`);
  const gid = await aria2(config, "aria2.addUri", [[request.url], options]);
  return { gid, name: request.fileName };
}

// --- Sending a link --------------------------------------------------------------------------------

/**
 * What goes to the daemon for a link: the URL, the page it was found on as `Referer`, the
 * browser's cookies for the URL as one secret `Cookie` (only when the daemon is on this
 * machine), and the file name to save it under (relative to the daemon's first download root).
 */
async function describeDownload(config, { url, referrer, fileName }) {
  const headers = [];
  if (isWebURL(referrer)) headers.push({ name: "Referer", value: referrer });
  if (isLoopback(config.address)) {
    const cookie = await cookieHeader(url);
    if (cookie) headers.push({ name: "Cookie", value: cookie, secret: true });
  }
  return { url, headers, fileName: safeFileName(fileName) };
}

async function send(config, link) {
  if (!isWebURL(link.url)) throw new Error(`only http and https links can be sent, not ${String(link.url).slice(0, 80)}`);
  const request = await describeDownload(config, link);
  return config.protocol === "aria2" ? sendToAria2(config, request) : sendToHaul(config, request);
}

async function noteSuccess() {
  await call(chrome.storage.local, "remove", "lastError");
  refreshBadgeSoon();
}

/** Shows a failure: the badge's "!", a notification, and the options page's status line. */
async function noteFailure(what, error) {
  const message = `${what}: ${error && error.message ? error.message : error}`;
  await call(chrome.storage.local, "set", { lastError: { message, at: Date.now() } });
  await refreshBadge();
  try {
    await call(chrome.notifications, "create", "haul-error", {
      type: "basic",
      iconUrl: chrome.runtime.getURL("icons/icon-128.png"),
      title: "Haul",
      message,
    });
  } catch (ignored) {
    // No notifications here (a headless browser, or the user turned them off): the badge and the
    // options page still show it.
  }
}

/**
 * Sends one link to the daemon: the function the context menu's entry calls, and what the
 * `{type: "download-link"}` message reaches (scripts/extension-test.py sends that message, since
 * WebDriver cannot click a browser's own context menu).
 */
async function downloadLink(link) {
  const config = await settings();
  try {
    const result = await send(config, link);
    await noteSuccess();
    return result;
  } catch (error) {
    await noteFailure(`Haul did not take ${link.url}`, error);
    throw error;
  }
}

// --- The context menu ------------------------------------------------------------------------------

/**
 * Makes the entry on every start of the background (Chromium keeps it across restarts, Firefox's
 * event page may not); removing all first keeps a second start from failing on a duplicate ID.
 */
function createMenus() {
  chrome.contextMenus.removeAll(() => {
    void chrome.runtime.lastError;
    chrome.contextMenus.create({ id: MENU_ID, title: "Download with Haul", contexts: ["link"] }, () => {
      const error = chrome.runtime.lastError;
      if (!error || /duplicate/i.test(error.message)) recordMenus([MENU_ID]);
    });
  });
}

/** The entries made, in chrome.storage.session, for the options page and the test to read. */
function recordMenus(ids) {
  if (chrome.storage.session) chrome.storage.session.set({ menus: ids }, () => void chrome.runtime.lastError);
}

async function createdMenus() {
  if (!chrome.storage.session) return null;
  const { menus } = await call(chrome.storage.session, "get", "menus");
  return menus || [];
}

chrome.contextMenus.onClicked.addListener((info, tab) => {
  if (info.menuItemId !== MENU_ID) return;
  downloadLink({ url: info.linkUrl, referrer: info.pageUrl || (tab && tab.url), fileName: null }).catch(() => {
    // noteFailure showed it.
  });
});

// --- Capturing the browser's downloads -------------------------------------------------------------

function captureExtensions(config) {
  return String(config.captureExtensions || "")
    .split(/[\s,;]+/)
    .map((extension) => extension.trim().toLowerCase().replace(/^\*?\.+/, ""))
    .filter(Boolean);
}

/**
 * Whether a browser download is Haul's: capture is on, and it passes every test that is set: its
 * name ends with one of the extensions, and its size (when the browser knows it) is at least the
 * minimum. A download of unknown size is not captured when a minimum is set.
 */
function shouldCapture(config, { url, name, size }) {
  if (!config.captureEnabled || !isWebURL(url)) return false;
  const extensions = captureExtensions(config);
  if (extensions.length) {
    const lower = String(name || "").toLowerCase();
    if (!extensions.some((extension) => lower.endsWith("." + extension))) return false;
  }
  const minimum = Number(config.captureMinBytes) || 0;
  if (minimum > 0 && !(size > 0 && size >= minimum)) return false;
  return true;
}

function sizeOf(item) {
  if (item.fileSize > 0) return item.fileSize;
  if (item.totalBytes > 0) return item.totalBytes;
  return -1;
}

function isOwnDownload(item) {
  return item.byExtensionId === chrome.runtime.id;
}

async function forget(downloadId) {
  await call(chrome.downloads, "cancel", downloadId).catch(() => {});
  await call(chrome.downloads, "erase", { id: downloadId }).catch(() => {});
}

/** Sends a browser download to the daemon; true when the daemon took it. */
async function sendCaptured(config, item, name) {
  try {
    await send(config, { url: item.finalUrl || item.url, referrer: item.referrer, fileName: name });
    await noteSuccess();
    return true;
  } catch (error) {
    await noteFailure(`Haul did not take ${name || item.url}, so the browser downloads it`, error);
    return false;
  }
}

if (chrome.downloads.onDeterminingFilename) {
  // Chromium: a download waits here for its name, so it cannot finish while the daemon is asked.
  // Taken: it is cancelled and erased. Not taken: `suggest()` lets the browser go on with it.
  chrome.downloads.onDeterminingFilename.addListener((item, suggest) => {
    if (isOwnDownload(item) || !isWebURL(item.finalUrl || item.url)) return false;
    (async () => {
      let taken = false;
      try {
        const config = await settings();
        const name = safeFileName(item.filename) || nameFromURL(item.finalUrl || item.url);
        if (shouldCapture(config, { url: item.finalUrl || item.url, name, size: sizeOf(item) })) {
          taken = await sendCaptured(config, item, name);
        }
      } finally {
        if (taken) await forget(item.id);
        else {
          try {
            suggest();
          } catch (ignored) {
            // The download went away meanwhile.
          }
        }
      }
    })();
    return true; // suggest() is called later
  });
} else {
  // Firefox: no hook before the download starts, so it is paused while the daemon is asked, then
  // cancelled, or resumed (restarted when the server cannot resume it) when the daemon refused it.
  chrome.downloads.onCreated.addListener((item) => {
    if (isOwnDownload(item) || item.state !== "in_progress") return;
    (async () => {
      const config = await settings();
      const url = item.finalUrl || item.url;
      const name = safeFileName(item.filename) || nameFromURL(url);
      if (!shouldCapture(config, { url, name, size: sizeOf(item) })) return;
      await call(chrome.downloads, "pause", item.id).catch(() => {});
      if (await sendCaptured(config, item, name)) {
        await forget(item.id);
        return;
      }
      try {
        await call(chrome.downloads, "resume", item.id);
      } catch (error) {
        await forget(item.id);
        await call(chrome.downloads, "download", { url }).catch(() => {});
      }
    })();
  });
}

// --- The badge: running downloads ----------------------------------------------------------------

function setBadge(text, color, title) {
  chrome.action.setBadgeText({ text }, () => void chrome.runtime.lastError);
  chrome.action.setBadgeBackgroundColor({ color }, () => void chrome.runtime.lastError);
  chrome.action.setTitle({ title }, () => void chrome.runtime.lastError);
}

async function runningCount(config) {
  if (config.protocol === "aria2") {
    const stat = await aria2(config, "aria2.getGlobalStat");
    return Number(stat.numActive) || 0;
  }
  const stats = await haulAPI(config, "/stats");
  return (stats && stats.counts && stats.counts.running) || 0;
}

/** The badge: "!" after a failure not yet cleared, else the number of running downloads. */
async function refreshBadge() {
  const config = await settings();
  const { lastError } = await call(chrome.storage.local, "get", "lastError");
  try {
    const running = await runningCount(config);
    if (lastError) setBadge("!", ERROR_COLOR, "Haul: " + lastError.message);
    else setBadge(running > 0 ? String(running) : "", BADGE_COLOR, `Haul: ${running} running`);
    return { running };
  } catch (error) {
    setBadge("!", ERROR_COLOR, "Haul: " + error.message);
    return { error: error.message };
  }
}

/** After a send the daemon starts the download a moment later: look again while the worker is up. */
function refreshBadgeSoon() {
  refreshBadge();
  for (const delay of [1000, 3000, 8000]) setTimeout(() => refreshBadge(), delay);
}

function ensureAlarm() {
  chrome.alarms.get(BADGE_ALARM, (alarm) => {
    void chrome.runtime.lastError;
    // 30 s is the shortest period Chromium allows; Firefox may make it longer.
    if (!alarm) chrome.alarms.create(BADGE_ALARM, { periodInMinutes: 0.5, delayInMinutes: 0.5 });
  });
}

chrome.alarms.onAlarm.addListener((alarm) => {
  if (alarm.name === BADGE_ALARM) refreshBadge();
});

chrome.storage.onChanged.addListener((changes, area) => {
  if (area !== "local") return;
  if (["address", "token", "protocol", "lastError"].some((key) => key in changes)) refreshBadge();
});

chrome.action.onClicked.addListener(() => chrome.runtime.openOptionsPage());

// --- Test connection -----------------------------------------------------------------------------

/** What the daemon says to `config` (the options page's fields, saved or not), in a line. */
async function testConnection(config) {
  if (config.protocol === "aria2") {
    const version = await aria2(config, "aria2.getVersion");
    const stat = await aria2(config, "aria2.getGlobalStat");
    return `Connected over aria2 JSON-RPC: version ${version.version}, ${stat.numActive} active, ${stat.numWaiting} waiting.`;
  }
  const stats = await haulAPI(config, "/stats");
  // GET needs the token only; adding needs the daemon to accept this extension's Origin too. An
  // empty list is refused as invalid (400) after the Origin passed, and adds nothing.
  try {
    await haulAPI(config, "/downloads", "POST", { downloads: [] });
  } catch (error) {
    if (error.status !== 400) throw new Error(`the token is right, but adding downloads fails: ${error.message}`);
  }
  const counts = (stats && stats.counts) || {};
  return `Connected to Haul: ${counts.running || 0} running, ${counts.queued || 0} queued, ${counts.completed || 0} completed.`;
}

// --- Messages from the extension's own pages ----------------------------------------------------

const handlers = {
  // The context menu's function, for the options page and the test.
  "download-link": (message) =>
    downloadLink({ url: message.url, referrer: message.referrer, fileName: message.fileName || null }),
  // The context-menu entries this background created.
  menus: async () => ({ menus: await createdMenus() }),
  test: async (message) => ({ text: await testConnection({ ...DEFAULTS, ...(message.settings || (await settings())) }) }),
  "refresh-badge": () => refreshBadge(),
  // What would be sent for a link to a daemon at `address`: the header names, not their values.
  preview: async (message) => {
    const config = { ...(await settings()), ...(message.address ? { address: message.address } : {}) };
    const request = await describeDownload(config, { url: message.url, referrer: message.referrer, fileName: message.fileName });
    return { headers: request.headers.map((header) => header.name + (header.secret ? " (secret)" : "")), fileName: request.fileName };
  },
  origin: async () => ({ origin: extensionOrigin() }),
};

chrome.runtime.onMessage.addListener((message, sender, sendResponse) => {
  const own = sender.id === chrome.runtime.id && (!sender.url || sender.url.startsWith(chrome.runtime.getURL("")));
  const handler = own && message && handlers[message.type];
  if (!handler) return false;
  Promise.resolve()
    .then(() => handler(message))
    .then(
      (result) => sendResponse({ ok: true, ...(result || {}) }),
      (error) => sendResponse({ ok: false, error: error && error.message ? error.message : String(error) }),
    );
  return true; // sendResponse is called later
});

// Every time the worker starts: the menu entry and the alarm exist, the badge is fresh.
createMenus();
ensureAlarm();
refreshBadge();
