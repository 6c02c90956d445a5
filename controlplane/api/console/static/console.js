// corral's web console: a page of plain JavaScript over the public API
// (/v1/) and the admin gateway (/admin/v1/). Rules kept throughout:
//   - data from the server reaches the page only through text nodes
//     (el() below), never parsed as markup; no inline script (the CSP
//     forbids it);
//   - the credential lives in sessionStorage and travels as a header, never
//     in a URL (ids in the hash are not secrets); a sign-in code the
//     provider sends back in the URL leaves it at once (history.replaceState);
//   - every body read is bounded, and every failure is shown as text.
"use strict";

const KEY = "corral.console.key";
// The OIDC sign-in in flight: its state, PKCE verifier, issuer and
// redirect URI, kept until the provider sends the browser back.
const PENDING = "corral.console.oidc";
// One event may hold a whole request body (8 MiB: publicapi.MaxBodyBytes).
const MAX_JSON_BYTES = 32 << 20; // one API response
const MAX_FRAME_BYTES = 9 << 20; // one SSE frame: one event
const MAX_EVENTS = 5000; // events kept on a session page
const MAX_PAGES = 25; // pages followed by a list

// ---- DOM -----------------------------------------------------------------------------------

// el builds an element: attrs are set as properties (or data-*/aria-*
// attributes), children are nodes or strings (made text nodes).
function el(tag, attrs, ...children) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") n.className = v;
    else if (k.startsWith("data-") || k.startsWith("aria-")) n.setAttribute(k, v);
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else n[k] = v;
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    n.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return n;
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

const $ = (id) => document.getElementById(id);

function showError(err) {
  const e = $("error");
  e.textContent = err ? String(err.message || err) : "";
  e.hidden = !err;
}

// ---- API -----------------------------------------------------------------------------------

class APIError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function key() { return sessionStorage.getItem(KEY) || ""; }

function headers(extra) {
  return Object.assign({ "Authorization": "Bearer " + key() }, extra || {});
}

// readBounded reads a response body up to limit bytes.
async function readBounded(resp, limit) {
  const reader = resp.body.getReader();
  const chunks = [];
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    n += value.length;
    if (n > limit) {
      reader.cancel();
      throw new Error("response larger than " + limit + " bytes");
    }
    chunks.push(value);
  }
  const all = new Uint8Array(n);
  let off = 0;
  for (const c of chunks) { all.set(c, off); off += c.length; }
  return all;
}

// errorText is the message of an error response: the error envelope's
// message when there is one, else its status.
function errorText(status, bytes) {
  try {
    const v = JSON.parse(new TextDecoder().decode(bytes));
    if (v && v.error && typeof v.error.message === "string") return v.error.message;
    if (v && typeof v.message === "string") return v.message;
  } catch (_) { /* not JSON */ }
  return "HTTP " + status;
}

async function api(method, path, body) {
  const init = { method, headers: headers(), credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const bytes = await readBounded(resp, MAX_JSON_BYTES);
  if (!resp.ok) throw new APIError(resp.status, method + " " + path.split("?")[0] + ": " + errorText(resp.status, bytes));
  return bytes.length ? JSON.parse(new TextDecoder().decode(bytes)) : {};
}

// listAll follows a /v1/ list's next_page cursors, up to MAX_PAGES.
async function listAll(path) {
  const out = [];
  let page = null;
  for (let i = 0; i < MAX_PAGES; i++) {
    const sep = path.includes("?") ? "&" : "?";
    const v = await api("GET", page ? path + sep + "page=" + encodeURIComponent(page) : path);
    out.push(...(v.data || []));
    page = v.next_page;
    if (!page) break;
  }
  return out;
}

// adminLatest reads a gateway server stream that ends by itself (one JSON
// object a line: {"result":...} or {"error":...}) and returns its last
// result: the newest state it reported.
async function adminLatest(method, path) {
  const resp = await fetch(path, { method, headers: headers(), credentials: "omit", cache: "no-store" });
  const bytes = await readBounded(resp, MAX_JSON_BYTES);
  if (!resp.ok) throw new APIError(resp.status, method + " " + path.split("?")[0] + ": " + errorText(resp.status, bytes));
  let last = null;
  for (const line of new TextDecoder().decode(bytes).split("\n")) {
    if (!line.trim()) continue;
    const v = JSON.parse(line);
    if (v.error) throw new APIError(0, method + " " + path.split("?")[0] + ": " + (v.error.message || "error"));
    last = v.result || last;
  }
  if (!last) throw new Error(method + " " + path.split("?")[0] + ": the stream ended with no message");
  return last;
}

// ---- format --------------------------------------------------------------------------------

function when(ts) {
  if (!ts) return "";
  const d = new Date(ts);
  return isNaN(d) ? String(ts) : d.toLocaleString();
}

function textOf(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.map((b) => (b && b.type === "text" ? b.text : b && b.type ? "[" + b.type + "]" : "")).join("\n");
}

function tags(list) { return (list || []).map((t) => el("span", { class: "tag" }, t)); }

function link(href, text) { return el("a", { href }, text); }

// ---- sign in -------------------------------------------------------------------------------

// who: which halves of the console the key may see.
let who = { tenant: false, operator: false };

async function probe() {
  const [t, o] = await Promise.allSettled([api("GET", "/v1/agents?limit=1"), api("GET", "/admin/v1/cluster/status")]);
  who = { tenant: t.status === "fulfilled", operator: o.status === "fulfilled" };
  if (!who.tenant && !who.operator) {
    // The tenant refusal says why a key is wrong; an operator's says the same.
    throw t.reason;
  }
}

function signedOut(msg) {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(PENDING);
  who = { tenant: false, operator: false };
  stopTimers();
  $("signin").hidden = false;
  $("nav").hidden = true;
  $("nav").replaceChildren(); // the next key may see other halves
  $("signout").hidden = true;
  $("who").textContent = "";
  $("view").replaceChildren();
  showError(null);
  $("signin-error").textContent = msg || "";
  $("key").focus();
}

async function signIn(k) {
  sessionStorage.setItem(KEY, k);
  try {
    await probe();
  } catch (err) {
    signedOut("Sign-in failed: " + (err.message || err));
    return;
  }
  $("signin").hidden = true;
  $("signin-error").textContent = "";
  $("signout").hidden = false;
  $("who").textContent = [who.tenant && "tenant", who.operator && "operator"].filter(Boolean).join(" + ");
  const nav = $("nav");
  const items = [];
  if (who.tenant) items.push(["#/agents", "Agents"], ["#/sessions", "Sessions"], ["#/files", "Files"]);
  if (who.operator) items.push(["#/hosts", "Hosts"], ["#/sandboxes", "Sandboxes"], ["#/cluster", "Cluster"]);
  nav.replaceChildren(...items.map(([h, t]) => el("a", { href: h, "data-route": h }, t)));
  nav.hidden = false;
  if (!location.hash || location.hash === "#/") location.hash = who.tenant ? "#/sessions" : "#/hosts";
  else route();
}

// ---- sign in with an OpenID Provider -------------------------------------------------------
//
// The authorization-code flow with PKCE (RFC 7636), as a public client:
// the page sends the browser to the provider with a random state and the
// S256 challenge of a random verifier; the provider sends it back to
// /console/ with a code, which the server redeems (POST /console/oidc/token:
// the page connects to no other origin) and answers with the token, kept
// as a pasted one is.

// loadProviders makes a sign-in button of each provider the server offers
// (GET /console/config.json).
async function loadProviders() {
  let list = [];
  try {
    const resp = await fetch("/console/config.json", { credentials: "omit", cache: "no-store" });
    const bytes = await readBounded(resp, 1 << 20);
    if (!resp.ok) throw new Error(errorText(resp.status, bytes));
    const v = JSON.parse(new TextDecoder().decode(bytes));
    list = Array.isArray(v.providers) ? v.providers : [];
  } catch (err) {
    $("signin-error").textContent = "The sign-in providers could not be listed: " + (err.message || err);
  }
  $("provider-buttons").replaceChildren(...list.map((p) => el("button", {
    type: "button", class: "provider", "data-issuer": p.issuer, disabled: !p.authorization_endpoint,
    title: p.authorization_endpoint ? p.issuer : p.issuer + " cannot be reached now",
    onclick: () => startSignIn(p),
  }, "Sign in with " + p.name)));
  $("providers").hidden = list.length === 0;
}

function base64url(bytes) {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

// random is n random bytes, base64url: 32 make a 43-character verifier.
function random(n) { return base64url(crypto.getRandomValues(new Uint8Array(n))); }

async function startSignIn(p) {
  $("signin-error").textContent = "";
  try {
    // crypto.subtle exists only in a secure context (HTTPS, or loopback).
    if (!window.crypto || !crypto.subtle) throw new Error("the console must be served over HTTPS to sign in with a provider");
    const state = random(32), verifier = random(32), redirect = location.origin + "/console/";
    const challenge = base64url(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier))));
    const u = new URL(p.authorization_endpoint);
    if (u.protocol !== "https:" && u.protocol !== "http:") throw new Error("the provider's authorization endpoint is not a web address");
    const q = { response_type: "code", client_id: p.client_id, redirect_uri: redirect, scope: p.scopes, state,
      code_challenge: challenge, code_challenge_method: "S256" };
    for (const [k, v] of Object.entries(q)) u.searchParams.set(k, v);
    sessionStorage.setItem(PENDING, JSON.stringify({ state, verifier, issuer: p.issuer, name: p.name, redirect, hash: location.hash }));
    location.assign(u.href);
  } catch (err) {
    $("signin-error").textContent = "Sign-in with " + p.name + " failed: " + (err.message || err);
  }
}

// finishSignIn completes a sign-in the provider sent the browser back
// from (?code=&state=, or ?error=&state=) and reports whether the page was
// such a return.
async function finishSignIn() {
  const q = new URLSearchParams(location.search);
  if (!q.has("code") && !q.has("error")) return false;
  let pending = null;
  try { pending = JSON.parse(sessionStorage.getItem(PENDING) || "null"); } catch (_) { /* not ours */ }
  sessionStorage.removeItem(PENDING);
  // The code leaves the address bar and the history at once.
  history.replaceState(null, "", location.pathname + (pending && /^#\/[A-Za-z0-9_\/-]*$/.test(pending.hash) ? pending.hash : ""));
  try {
    if (!pending || typeof pending.state !== "string" || q.get("state") !== pending.state) {
      throw new Error("this tab did not start that sign-in (its state does not match): sign in again");
    }
    if (q.has("error")) {
      const d = q.get("error_description");
      throw new Error(pending.name + " said " + q.get("error").slice(0, 100) + (d ? ": " + d.slice(0, 300) : ""));
    }
    $("view").replaceChildren(el("p", { class: "muted" }, "Signing in with " + pending.name + "…"));
    const resp = await fetch("/console/oidc/token", {
      method: "POST", headers: { "Content-Type": "application/json" }, credentials: "omit", cache: "no-store",
      body: JSON.stringify({ issuer: pending.issuer, code: q.get("code"), code_verifier: pending.verifier, redirect_uri: pending.redirect }),
    });
    const bytes = await readBounded(resp, 1 << 20);
    if (!resp.ok) throw new Error(errorText(resp.status, bytes));
    const v = JSON.parse(new TextDecoder().decode(bytes));
    if (typeof v.token !== "string" || !v.token) throw new Error("the server returned no token");
    await signIn(v.token);
  } catch (err) {
    signedOut("Sign-in failed: " + (err.message || err));
  }
  return true;
}

// ---- routing -------------------------------------------------------------------------------

let timers = [];
let streamAbort = null;

function stopTimers() {
  for (const t of timers) clearInterval(t);
  timers = [];
  if (streamAbort) { streamAbort.abort(); streamAbort = null; }
}

const routes = [
  [/^#\/agents$/, viewAgents],
  [/^#\/sessions$/, viewSessions],
  [/^#\/sessions\/([A-Za-z0-9_-]{1,128})$/, viewSession],
  [/^#\/files$/, viewFiles],
  [/^#\/hosts$/, viewHosts],
  [/^#\/sandboxes$/, viewSandboxes],
  [/^#\/cluster$/, viewCluster],
];

async function route() {
  if (!key()) return;
  stopTimers();
  showError(null);
  const hash = location.hash || "#/";
  for (const a of $("nav").querySelectorAll("a")) a.classList.toggle("current", hash.startsWith(a.dataset.route));
  const view = $("view");
  view.replaceChildren(el("p", { class: "muted" }, "Loading…"));
  for (const [re, fn] of routes) {
    const m = hash.match(re);
    if (!m) continue;
    try {
      await fn(view, ...m.slice(1));
    } catch (err) {
      if (err.status === 401) { signedOut("Signed out: " + err.message); return; }
      view.replaceChildren();
      showError(err);
    }
    return;
  }
  view.replaceChildren(el("p", {}, "Nothing here. Pick a page above."));
}

// ---- tenant views --------------------------------------------------------------------------

async function viewAgents(view) {
  const agents = await listAll("/v1/agents?limit=100");
  view.replaceChildren(el("h1", {}, "Agents"), agents.length === 0 ? el("p", { class: "muted" }, "No agents.") :
    table(["Name", "ID", "Model", "Version", "Tools", "Updated"], agents.map((a) => el("tr", {},
      el("td", {}, a.name), el("td", { class: "mono" }, a.id),
      el("td", {}, typeof a.model === "string" ? a.model : (a.model && a.model.id) || ""),
      el("td", {}, a.version), el("td", {}, tags((a.tools || []).map((t) => t.name || t.type))),
      el("td", {}, when(a.updated_at))))));
}

async function viewSessions(view) {
  const sessions = await listAll("/v1/sessions?limit=100");
  view.replaceChildren(el("h1", {}, "Sessions"), sessions.length === 0 ? el("p", { class: "muted" }, "No sessions.") :
    table(["Session", "Title", "Status", "Agent", "Created"], sessions.map((s) => el("tr", { "data-session": s.id },
      el("td", { class: "mono" }, link("#/sessions/" + encodeURIComponent(s.id), s.id)),
      el("td", {}, s.title || ""), el("td", { class: "status" }, s.status),
      el("td", {}, s.agent ? (s.agent.name || s.agent.id) : ""), el("td", {}, when(s.created_at))))));
}

async function viewFiles(view) {
  const files = await listAll("/v1/files?limit=100");
  view.replaceChildren(el("h1", {}, "Files"), filesTable(files));
}

function filesTable(files) {
  if (files.length === 0) return el("p", { class: "muted" }, "No files.");
  return table(["Name", "ID", "Size", "Type", "Created", ""], files.map((f) => el("tr", {},
    el("td", {}, f.filename), el("td", { class: "mono" }, f.id), el("td", {}, f.size_bytes),
    el("td", {}, f.mime_type), el("td", {}, when(f.created_at)),
    el("td", {}, f.downloadable === false ? "" : el("button", { type: "button", onclick: () => download(f) }, "Download")))));
}

// download fetches a file's content with the credential in a header and
// hands the browser a blob: URL (the key never goes into a link).
async function download(f) {
  try {
    const resp = await fetch("/v1/files/" + encodeURIComponent(f.id) + "/content", { headers: headers(), credentials: "omit" });
    if (!resp.ok) throw new Error("download: " + errorText(resp.status, await readBounded(resp, 1 << 16)));
    const url = URL.createObjectURL(await resp.blob());
    const a = el("a", { href: url, download: f.filename || f.id });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } catch (err) { showError(err); }
}

// A session page: its events (listed, then followed live), the tool calls
// and their results, confirmations waiting for an answer, a message box
// and the session's files.
async function viewSession(view, id) {
  const sess = await api("GET", "/v1/sessions/" + encodeURIComponent(id));
  const state = { events: [], ids: new Set() };
  const status = el("span", { id: "session-status", class: "status" }, sess.status);
  const streamState = el("span", { id: "stream-state", class: "muted" }, "");
  const pending = el("div", { id: "pending" });
  const calls = el("div", { id: "tool-calls" });
  const log = el("div", { id: "events" });
  const files = el("div", { id: "session-files" });
  const input = el("textarea", { id: "message", placeholder: "Message the agent…" });
  const sendErr = el("p", { class: "error", id: "send-error" });
  const send = el("button", { type: "submit", id: "send" }, "Send");
  const form = el("form", { id: "message-form", onsubmit: async (ev) => {
    ev.preventDefault();
    sendErr.textContent = "";
    const text = input.value;
    if (!text.trim()) return;
    send.disabled = true;
    try {
      await api("POST", "/v1/sessions/" + encodeURIComponent(id) + "/events",
        { events: [{ type: "user.message", content: [{ type: "text", text }] }] });
      input.value = "";
    } catch (err) { sendErr.textContent = err.message; }
    send.disabled = false;
  } }, input, send, sendErr);

  view.replaceChildren(
    el("h1", {}, "Session ", el("span", { class: "mono" }, sess.id)),
    el("p", {}, "Status: ", status, streamState, " · Agent: ", sess.agent ? (sess.agent.name || sess.agent.id) : "",
      sess.title ? " · " + sess.title : ""),
    el("h2", {}, "Pending confirmations"), pending,
    el("h2", {}, "Send a message"), form,
    el("h2", {}, "Tool calls"), calls,
    el("h2", {}, "Events"), log,
    el("h2", {}, "Files"), files);

  const render = () => {
    renderPending(pending, id, state.events);
    renderCalls(calls, state.events);
  };
  const add = (e) => {
    if (!e || !e.id || state.ids.has(e.id)) return;
    state.ids.add(e.id);
    state.events.push(e);
    if (state.events.length > MAX_EVENTS) state.ids.delete(state.events.shift().id);
    log.append(eventRow(e));
    while (log.childElementCount > MAX_EVENTS) log.firstElementChild.remove();
    if (e.type && e.type.startsWith("session.status_")) status.textContent = e.type.slice("session.status_".length);
  };

  const listed = await latestEvents(id);
  if (listed.length >= MAX_EVENTS) log.before(el("p", { class: "muted" }, "Older events are not shown (the newest " + MAX_EVENTS + " are)."));
  for (const e of listed) add(e);
  render();
  listAll("/v1/files?limit=100&scope_id=" + encodeURIComponent(id))
    .then((fs) => files.replaceChildren(filesTable(fs)))
    .catch((err) => files.replaceChildren(el("p", { class: "error" }, err.message)));

  follow(id, state, add, render, streamState);
}

// latestEvents lists a session's newest events (up to MAX_EVENTS), oldest
// first.
async function latestEvents(id) {
  const evs = await listAll("/v1/sessions/" + encodeURIComponent(id) + "/events?limit=200&order=desc");
  return evs.slice(0, MAX_EVENTS).reverse();
}

// follow reads the session's live stream (fetch with a streaming body:
// EventSource cannot send the Authorization header). It resumes after the
// last event it has with Last-Event-ID, so nothing is missed or doubled.
async function follow(id, state, add, render, streamState) {
  const ctl = new AbortController();
  streamAbort = ctl;
  for (let attempt = 0; attempt < 30 && !ctl.signal.aborted; attempt++) {
    const h = headers({ "Accept": "text/event-stream" });
    const last = state.events[state.events.length - 1];
    if (last) h["Last-Event-ID"] = last.id;
    try {
      const resp = await fetch("/v1/sessions/" + encodeURIComponent(id) + "/events/stream", { headers: h, signal: ctl.signal, credentials: "omit", cache: "no-store" });
      if (!resp.ok) {
        streamState.textContent = "(live stream: " + errorText(resp.status, await readBounded(resp, 1 << 16)) + ")";
        if (resp.status < 500) return;
      } else {
        streamState.textContent = "(live)";
        streamState.dataset.live = "true";
        if (!last) {
          // Opened with nothing listed: list again, so that an event
          // appended between the list and the stream is not lost.
          for (const e of await latestEvents(id)) add(e);
          render();
        }
        await readSSE(resp, (e) => { add(e); render(); });
        attempt = 0;
      }
    } catch (err) {
      if (ctl.signal.aborted) return;
      streamState.textContent = "(live stream: " + (err.message || err) + ")";
    }
    streamState.dataset.live = "false";
    if (ctl.signal.aborted) return;
    await new Promise((r) => setTimeout(r, 1000 + 500 * attempt));
  }
  if (!ctl.signal.aborted) streamState.textContent = "(live stream stopped: reload to retry)";
}

// readSSE calls fn with each event frame's JSON; a frame over
// MAX_FRAME_BYTES ends the stream.
async function readSSE(resp, fn) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    buf += value;
    let i;
    while ((i = buf.search(/\r?\n\r?\n/)) >= 0) {
      const frame = buf.slice(0, i);
      buf = buf.slice(buf[i] === "\r" ? i + 4 : i + 2).replace(/^\r?\n/, "");
      const data = frame.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (!data) continue;
      try { fn(JSON.parse(data)); } catch (_) { /* a frame that is not an event */ }
    }
    if (buf.length > MAX_FRAME_BYTES) {
      reader.cancel();
      throw new Error("an event larger than " + MAX_FRAME_BYTES + " bytes");
    }
  }
}

function eventRow(e) {
  const cls = "event " + String(e.type || "").replace(/\./g, "-") + (e.is_error ? " is-error" : "");
  let body = "";
  switch (e.type) {
    case "user.message": case "agent.message": case "agent.thinking":
      body = textOf(e.content); break;
    case "agent.tool_use": case "agent.mcp_tool_use": case "agent.custom_tool_use":
      body = (e.name || "") + " " + JSON.stringify(e.input || {}) + (e.evaluated_permission ? "  [" + e.evaluated_permission + "]" : ""); break;
    case "agent.tool_result": case "agent.mcp_tool_result":
      body = textOf(e.content); break;
    case "user.tool_confirmation":
      body = e.result + (e.deny_message ? ": " + e.deny_message : ""); break;
    case "session.error":
      body = e.error ? e.error.message || "" : ""; break;
    case "session.status_idle":
      body = e.stop_reason ? e.stop_reason.type : ""; break;
  }
  return el("div", { class: cls, "data-event-id": e.id },
    el("span", { class: "type" }, e.type), el("span", { class: "muted" }, when(e.processed_at || e.created_at)),
    body ? el("pre", {}, body) : null);
}

// pendingUses are the tool uses that asked for a confirmation and have
// none yet.
function pendingUses(events) {
  const answered = new Set(events.filter((e) => e.type === "user.tool_confirmation").map((e) => e.tool_use_id));
  const done = new Set(events.filter((e) => e.tool_use_id && e.type.endsWith("tool_result")).map((e) => e.tool_use_id));
  return events.filter((e) => e.evaluated_permission === "ask" && !answered.has(e.id) && !done.has(e.id));
}

// renderPending keeps one box a pending tool use, each made once: a box
// is not rebuilt under the user's pointer when other events arrive.
function renderPending(box, id, events) {
  const uses = pendingUses(events);
  const want = new Set(uses.map((u) => u.id));
  for (const n of [...box.children]) if (!want.has(n.dataset.toolUse)) n.remove();
  const have = new Set([...box.children].map((n) => n.dataset.toolUse));
  for (const u of uses) if (!have.has(u.id)) box.append(pendingBox(id, u));
  if (uses.length === 0) box.replaceChildren(el("p", { class: "muted" }, "None."));
}

function pendingBox(id, u) {
  const err = el("span", { class: "error" });
  const answer = async (result, btn) => {
    btn.disabled = true;
    try {
      await api("POST", "/v1/sessions/" + encodeURIComponent(id) + "/events",
        { events: [{ type: "user.tool_confirmation", tool_use_id: u.id, result }] });
    } catch (e) { err.textContent = e.message; btn.disabled = false; }
  };
  return el("div", { class: "pending", "data-tool-use": u.id },
    el("strong", {}, u.name || "tool"), " wants to run ", el("pre", {}, JSON.stringify(u.input || {}, null, 2)),
    el("button", { type: "button", class: "approve", onclick: (ev) => answer("allow", ev.target) }, "Approve"),
    el("button", { type: "button", class: "deny", onclick: (ev) => answer("deny", ev.target) }, "Deny"), err);
}

function renderCalls(box, events) {
  const uses = events.filter((e) => e.type === "agent.tool_use" || e.type === "agent.mcp_tool_use" || e.type === "agent.custom_tool_use");
  if (uses.length === 0) { box.replaceChildren(el("p", { class: "muted" }, "None yet.")); return; }
  const results = new Map();
  const confirmations = new Map();
  for (const e of events) {
    if (e.type === "user.tool_confirmation") confirmations.set(e.tool_use_id, e.result);
    else if (e.tool_use_id && e.type.endsWith("tool_result")) results.set(e.tool_use_id, e);
  }
  box.replaceChildren(table(["Tool", "Input", "Permission", "Result"], uses.map((u) => {
    const r = results.get(u.id);
    const perm = u.evaluated_permission === "ask" ? "ask: " + (confirmations.get(u.id) || "waiting") : (u.evaluated_permission || "");
    return el("tr", { "data-tool-use": u.id }, el("td", {}, u.name), el("td", {}, el("pre", {}, JSON.stringify(u.input || {}))),
      el("td", {}, perm),
      el("td", { class: r && r.is_error ? "bad" : "" }, r ? el("pre", { class: "tool-result" }, textOf(r.content)) : el("span", { class: "muted" }, "…")));
  })));
}

// ---- operator views ------------------------------------------------------------------------

function refreshEvery(ms, fn) { timers.push(setInterval(() => fn().catch(showError), ms)); }

async function viewHosts(view) {
  const hostsBox = el("div", { id: "hosts" });
  const poolsBox = el("div", { id: "pools" });
  const drainsBox = el("div", { id: "drains" });
  view.replaceChildren(el("h1", {}, "Hosts"), hostsBox, el("h2", {}, "Drains"), drainsBox,
    el("h2", {}, "Pools and labels"), poolsBox);
  const load = async () => {
    const { hosts = [] } = await api("GET", "/admin/v1/hosts");
    hostsBox.replaceChildren(hosts.length === 0 ? el("p", { class: "muted" }, "No hosts.") :
      table(["Host", "Status", "Schedulable", "Providers", "Health", "Sandboxes", "Allocated / schedulable"], hosts.map(hostRow)));
    const pools = new Map();
    for (const h of hosts) for (const [k, v] of Object.entries(h.labels || {})) {
      const l = k + "=" + v;
      if (!pools.has(l)) pools.set(l, []);
      pools.get(l).push(h.id);
    }
    poolsBox.replaceChildren(pools.size === 0 ? el("p", { class: "muted" }, "No labels.") :
      table(["Label", "Hosts"], [...pools].sort().map(([l, ids]) => el("tr", {}, el("td", { class: "mono" }, l), el("td", {}, tags(ids))))));
    const draining = hosts.filter((h) => h.draining);
    if (draining.length === 0) { drainsBox.replaceChildren(el("p", { class: "muted" }, "None.")); return; }
    drainsBox.replaceChildren(...await Promise.all(draining.map(drainRow)));
  };
  await load();
  refreshEvery(3000, load);
}

function hostRow(h) {
  const providers = (h.provider_details || []).map((p) => el("div", { class: "provider" },
    el("span", { class: "tag" }, p.name), "isolation " + (p.isolation || "unknown"), p.platform ? " (" + p.platform + ")" : "", p.checkpoint ? ", checkpoint" : ""));
  const health = [
    ...(h.provider_details || []).map((p) => el("div", { class: p.healthy ? "ok" : "bad" }, p.name + ": " + (p.healthy ? "healthy" : "unhealthy") + (p.reason ? " (" + p.reason + ")" : ""))),
    ...(h.conditions || []).map((c) => el("div", { class: c.ok ? "ok" : "bad" }, c.type + ": " + (c.ok ? "ok" : "failing") + (c.reason ? " (" + c.reason + ")" : ""))),
  ];
  const res = (r) => r ? (r.cpu_millis / 1000) + " CPU, " + r.memory_mib + " MiB" : "";
  return el("tr", { "data-host": h.id }, el("td", { class: "mono" }, h.id), el("td", { class: h.status === "ready" ? "ok" : "bad" }, h.status),
    el("td", {}, h.schedulable ? "yes" : "no", (h.unschedulable_reasons || []).map((r) => el("div", { class: "muted" }, r))),
    el("td", {}, providers.length ? providers : tags(h.providers)), el("td", {}, health), el("td", {}, h.sandboxes),
    el("td", {}, res(h.allocated) + " / " + res(h.capacity)));
}

// drainRow shows one drain's progress, read through DrainHost with watch
// and detach: the drain's current state, starting nothing.
async function drainRow(h) {
  const row = el("div", { class: "drain", "data-host": h.id }, el("strong", { class: "mono" }, h.id), " ");
  try {
    const d = await adminLatest("POST", "/admin/v1/hosts/" + encodeURIComponent(h.id) + ":drain?watch=true&detach=true");
    const total = d.total || 0, done = (d.moved || 0) + (d.evicted || 0);
    row.append(el("progress", { max: Math.max(total, 1), value: total ? done : 0 }),
      " " + done + " of " + total + " (moved " + (d.moved || 0) + ", " + (d.moved_live || 0) + " live; evicted " + (d.evicted || 0) +
      "; remaining " + (d.remaining || 0) + ")", d.deadline ? " · deadline " + when(d.deadline) : "",
      d.max_parallel ? " · " + d.max_parallel + " at a time" : "", d.done ? " · done" : "", d.message ? el("div", { class: "muted" }, d.message) : null);
  } catch (err) {
    row.append(el("span", { class: "error" }, err.message));
  }
  return row;
}

async function viewSandboxes(view) {
  const load = async () => {
    const { sandboxes = [] } = await api("GET", "/admin/v1/sandboxes");
    view.replaceChildren(el("h1", {}, "Sandboxes"), sandboxes.length === 0 ? el("p", { class: "muted" }, "No sandboxes placed.") :
      table(["Session", "Tenant", "Host", "Runtime", "Provider", "Ready", "Sandbox"], sandboxes.map((s) => el("tr", {},
        el("td", { class: "mono" }, s.session_id), el("td", {}, s.tenant), el("td", { class: "mono" }, s.host_id),
        el("td", {}, s.runtime), el("td", {}, s.provider), el("td", {}, s.ready ? "yes" : "no"), el("td", { class: "mono" }, s.sandbox_id)))));
  };
  await load();
  refreshEvery(5000, load);
}

async function viewCluster(view) {
  const st = await api("GET", "/admin/v1/cluster/status");
  const { members = [], leader_id } = await api("GET", "/admin/v1/cluster/members");
  view.replaceChildren(el("h1", {}, "Cluster"),
    el("p", {}, "This node: ", el("span", { class: "mono" }, st.node_id), " · " + st.raft_state + " · version " + st.version +
      " · database " + (st.database_reachable ? "reachable" : "unreachable: " + st.database_error) +
      " · schema " + st.schema_version + "/" + st.schema_version_latest + " · applied index " + st.applied_index),
    el("h2", {}, "Members"),
    table(["Node", "Raft address", "Voter", "Leader"], members.map((m) => el("tr", {}, el("td", { class: "mono" }, m.node_id),
      el("td", { class: "mono" }, m.raft_addr), el("td", {}, m.voter ? "yes" : "no"), el("td", {}, m.node_id === leader_id || m.leader ? "leader" : "")))));
}

// ---- start ---------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const k = $("key").value.trim();
    $("key").value = "";
    if (k) signIn(k);
  });
  $("signout").addEventListener("click", () => signedOut(""));
  window.addEventListener("hashchange", route);
  loadProviders();
  finishSignIn().then((returned) => {
    if (returned) return;
    if (key()) signIn(key());
    else signedOut("");
  });
});
