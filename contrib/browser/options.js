// The options page: the daemon's address, token and protocol, capture of the browser's downloads,
// "Test connection", and the last failure. Settings live in chrome.storage.local; the background
// does the talking to the daemon (one copy of that code), reached by messages.
"use strict";

const DEFAULTS = {
  address: "http://127.0.0.1:6842",
  token: "",
  protocol: "haul",
  captureEnabled: false,
  captureMinBytes: 0,
  captureExtensions: "",
};

const $ = (id) => document.getElementById(id);

function call(target, method, ...args) {
  return new Promise((resolve, reject) => {
    target[method](...args, (result) => {
      const error = chrome.runtime.lastError;
      if (error) reject(new Error(error.message));
      else resolve(result);
    });
  });
}

function ask(message) {
  return call(chrome.runtime, "sendMessage", message);
}

function show(text, kind) {
  const status = $("status");
  status.textContent = text;
  status.className = kind || "";
}

/** The form's settings, checked; throws an Error that says what is wrong. */
function formSettings() {
  const address = $("address").value.trim() || DEFAULTS.address;
  let parsed;
  try {
    parsed = new URL(address);
  } catch (error) {
    throw new Error(`“${address}” is not an address like http://127.0.0.1:6842`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new Error("the address must start with http:// or https://");
  }
  const minimum = $("capture-min-bytes").value.trim();
  if (minimum && !/^\d+$/.test(minimum)) throw new Error("the minimum size is a number of bytes");
  return {
    address: address.replace(/\/+$/, ""),
    token: $("token").value.trim(),
    protocol: $("protocol").value === "aria2" ? "aria2" : "haul",
    captureEnabled: $("capture-enabled").checked,
    captureMinBytes: minimum ? Number(minimum) : 0,
    captureExtensions: $("capture-extensions").value.trim(),
  };
}

async function load() {
  const stored = { ...DEFAULTS, ...(await call(chrome.storage.local, "get", Object.keys(DEFAULTS))) };
  $("address").value = stored.address;
  $("token").value = stored.token;
  $("protocol").value = stored.protocol;
  $("capture-enabled").checked = !!stored.captureEnabled;
  $("capture-min-bytes").value = stored.captureMinBytes ? String(stored.captureMinBytes) : "";
  $("capture-extensions").value = stored.captureExtensions;
  const origin = new URL(chrome.runtime.getURL("")).origin;
  $("allow-origin").textContent = `haul daemon --allow-origin ${origin}`;
  await showLastError();
}

async function showLastError() {
  const { lastError } = await call(chrome.storage.local, "get", "lastError");
  $("last-error").hidden = !lastError;
  $("last-error-text").textContent = lastError
    ? `${new Date(lastError.at).toLocaleString()}: ${lastError.message}`
    : "";
}

$("options").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    await call(chrome.storage.local, "set", formSettings());
    show("Saved.", "ok");
  } catch (error) {
    show(`Not saved: ${error.message}`, "error");
  }
});

$("test").addEventListener("click", async () => {
  let settings;
  try {
    settings = formSettings();
  } catch (error) {
    show(error.message, "error");
    return;
  }
  show("Asking the daemon…", "busy");
  try {
    const answer = await ask({ type: "test", settings });
    if (answer && answer.ok) show(answer.text, "ok");
    else show(`Failed: ${answer ? answer.error : "no answer from the extension's background"}`, "error");
  } catch (error) {
    show(`Failed: ${error.message}`, "error");
  }
});

$("dismiss").addEventListener("click", async () => {
  await call(chrome.storage.local, "remove", "lastError");
});

chrome.storage.onChanged.addListener((changes, area) => {
  if (area === "local" && "lastError" in changes) showLastError();
});

load().catch((error) => show(`Could not read the settings: ${error.message}`, "error"));
