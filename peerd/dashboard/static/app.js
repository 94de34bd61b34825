// peerd dashboard: fleet map, live message stream with receipts, search.
// Everything comes from this daemon's local API. Text from messages is only
// ever inserted with textContent / text nodes, never parsed as HTML.
"use strict";

const STREAM_LIMIT = 100;
const STATUS_EVERY_MS = 2000;
const REFRESH_GAP_MS = 250;
const SVG = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);

function el(tag, cls, ...children) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

async function api(path) {
  const resp = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw Object.assign(new Error(body.error || `HTTP ${resp.status}`), { status: resp.status });
  return body;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  if (seconds < 1) return "just now";
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "?";
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function shortTime(stamp) {  // Unix ms (the one vocabulary) or ISO-8601 text
  const d = new Date(stamp);
  return Number.isNaN(d.getTime()) ? String(stamp) : d.toLocaleString();
}

// -- status: header, totals, catch-up, fleet ----------------------------------------------

function setConn(live, text) {
  const c = $("conn");
  c.className = `conn ${live ? "on" : "off"}`;
  c.textContent = text;
}

function stat(value, label) {
  return el("div", "stat", el("b", null, value), el("span", null, label));
}

function renderStatus(st) {
  $("node-name").textContent = st.name;
  $("node-id").textContent = st.node_id.slice(0, 16);
  $("node-id").title = st.node_id;
  $("fleet-id").textContent = st.fleet_id;
  $("uptime").textContent = duration(st.uptime);
  const t = st.totals;
  $("totals").replaceChildren(
    stat(t.messages, "messages"), stat(t.ops, "ops"), stat(t.origins, "nodes seen"),
    stat(`${st.live_peers}/${st.peers.length}`, "peers live"), stat(st.lag, "ops peers lack"),
  );
  renderCatchup(st.catchup);
  renderFleetNews(st);
  if (st.settings && st.settings.mdns) {
    $("no-peers").textContent =
      "No peers yet: mDNS is on and has found no member of this fleet. Add a seed (peerd run --seed HOST:PORT).";
  }
  renderPeers(st.peers);
  renderMap(st);
}

// Membership news: this node removed, join requests waiting, another fleet on this LAN.
function renderFleetNews(st) {
  const lines = [];
  if (st.fleet && st.fleet.removed_here) {
    lines.push("This node was removed from the fleet and no longer syncs; join again with a fresh home.");
  }
  if (st.join_requests) {
    lines.push(`${st.join_requests} join request(s) wait for approval: run peerd requests, then peerd approve CODE.`);
  }
  for (const other of st.other_fleets || []) {
    const nodes = other.nodes.map((n) => `${n.name || n.node_id} at ${n.address}`).join(", ");
    lines.push(`Another peerd fleet ${other.fleet_id} is on this LAN (${nodes}). To join it: ${other.join}, ` +
      "then approve on one of its members.");
  }
  const relay = st.relay || {};
  const who = (r) => r.name ? `${r.name} (${r.address})` : r.address;
  if (relay.via && relay.via.length) {
    lines.push(`Other members cannot call this node; relayed by ${relay.via.map(who).join(", ")}, ` +
      "which push to it down its links.");
  } else if (relay.reachable === false) {
    lines.push("Other members cannot call this node and no reachable member relays for it yet: " +
      "its mail waits for its own rounds.");
  }
  if (relay.relaying_for && relay.relaying_for.length) {
    lines.push(`Relaying for ${relay.relaying_for.map(who).join(", ")} (members nobody can call).`);
  }
  const box = $("fleet-news");
  box.hidden = lines.length === 0;
  box.replaceChildren(...lines.map((text) => el("div", "catchup-text", text)));
}

function renderCatchup(c) {
  const box = $("catchup");
  box.hidden = !c;
  if (!c) return;
  const eta = c.eta === null ? "estimating" : `ETA ${duration(c.eta)}`;
  $("catchup-text").textContent =
    `Catching up from ${c.peer}: ${c.percent}% (${c.done.toLocaleString()} of ${c.total.toLocaleString()} ops, ` +
    `${Math.round(c.rate).toLocaleString()} ops/s, ${eta})`;
  $("catchup-fill").style.width = `${Math.min(100, c.percent)}%`;
}

function renderPeers(peers) {
  $("no-peers").hidden = peers.length > 0;
  $("peers").replaceChildren(...peers.map((p) => {
    const row = el("tr", p.reachable ? "live" : "dead");
    row.dataset.address = p.address;
    if (p.node_id) row.dataset.node = p.node_id;
    const live = el("td", null, el("span", `dot ${p.reachable ? "live" : "dead"}`), p.reachable ? "yes" : "no");
    if (p.relay) live.append(el("div", "relay", p.relay));
    const addr = el("td", null, p.address);
    if (p.last_error && !p.reachable) {
      const prefix = `${p.address}: `;
      addr.append(el("div", "err", p.last_error.startsWith(prefix) ? p.last_error.slice(prefix.length) : p.last_error));
    }
    const node = el("td", null, el("code", null, p.node_id || "?"));
    if (p.name) node.prepend(el("span", "name", p.name + " "));
    row.append(addr, node, el("td", null, p.found_by), live,
      el("td", null, ago(p.last_seen_ago)), el("td", null, p.lag === null ? "?" : p.lag));
    return row;
  }));
}

function renderMap(st) {
  const map = $("map");
  const w = 360, h = 240, cx = w / 2, cy = h / 2;
  const peers = st.peers;
  const r = Math.min(w, h) / 2 - 34;
  const items = [];
  const nodes = [];
  peers.forEach((p, i) => {
    const angle = (2 * Math.PI * i) / Math.max(peers.length, 1) - Math.PI / 2;
    const x = cx + r * Math.cos(angle) * 1.35, y = cy + r * Math.sin(angle);
    const cls = p.reachable ? "live" : "dead";
    items.push(svg("line", { x1: cx, y1: cy, x2: x, y2: y, class: `edge ${cls}` }));
    const g = svg("g", { class: `node ${cls}` });
    g.append(svg("circle", { cx: x, cy: y, r: 9 }));
    g.append(svg("title", {}, `${p.address} (${p.found_by})${p.last_error ? ": " + p.last_error : ""}`));
    const below = y >= cy;
    g.append(svg("text", { x, y: below ? y + 21 : y - 14, "text-anchor": "middle" }, p.name ? `${p.name} ${p.address}` : p.address));
    if (p.lag) g.append(svg("text", { x, y: below ? y + 32 : y - 25, "text-anchor": "middle", class: "lag" }, `lag ${p.lag}`));
    nodes.push(g);
  });
  const self = svg("g", { class: "node self" });
  self.append(svg("circle", { cx, cy, r: 13 }));
  self.append(svg("text", { x: cx, y: cy + 27, "text-anchor": "middle" }, `${st.name} (this node)`));
  map.replaceChildren(...items, ...nodes, self);
}

let events = null;

async function refreshStatus() {
  try {
    renderStatus(await api("/api/status"));
    if (events && events.readyState === EventSource.OPEN) setConn(true, "live");
  } catch (err) {  // 401: the session ended (the daemon restarted, or a day passed); the error says how to sign in
    setConn(false, err.status === 401 ? err.message : `daemon not answering (${err.message})`);
  }
}

// -- messages --------------------------------------------------------------------------------

function highlight(text, words) {
  const frag = document.createDocumentFragment();
  if (!words.length) {
    frag.append(text);
    return frag;
  }
  const lower = text.toLowerCase();
  let i = 0;
  while (i < text.length) {
    let best = -1, len = 0;
    for (const w of words) {
      const at = lower.indexOf(w, i);
      if (at >= 0 && (best < 0 || at < best)) { best = at; len = w.length; }
    }
    if (best < 0) break;
    frag.append(text.slice(i, best), el("mark", null, text.slice(best, best + len)));
    i = best + len;
  }
  frag.append(text.slice(i));
  return frag;
}

function recipientChip(r) {
  const who = r.instanceId ? `${r.role}@${r.instanceId}` : r.role;
  const when = r.readAt || r.deliveredAt;
  const acked = r.acknowledgedAt ? ", acknowledged" : "";
  const chip = el("span", `chip ${r.state}`, `${who}: ${r.state}${acked}`);
  chip.dataset.role = r.role;
  chip.dataset.state = r.state;
  if (r.acked_at) chip.dataset.acked = "1";
  chip.title = when ? `${r.state} at ${shortTime(when)}${r.acked_at ? `, acknowledged at ${shortTime(r.acked_at)}` : ""}`
    : "not yet delivered";
  return chip;
}

// The machine that sent a message: its name in the fleet, else the start of its node id.
function nodeTag(m) {
  if (!m.fromNode) return el("span", "node", "");
  const tag = el("span", "node", `from ${m.fromNode.name || m.fromNode.id.slice(0, 16)}`);
  tag.title = `sent from node ${m.fromNode.id}`;
  tag.dataset.node = m.fromNode.id;
  return tag;
}

function messageItem(m, words, fresh) {
  const item = el("li", fresh ? "msg fresh" : "msg");
  item.dataset.id = m.messageId;
  const sender = m.fromInstanceId ? `${m.from}@${m.fromInstanceId}` : m.from;
  const target = m.threadId ? `thread ${m.threadId}` : m.instanceId ? `${m.channel}@${m.instanceId}` : m.channel;
  item.append(
    el("div", "meta", el("span", "who", sender), el("span", null, "→"), el("span", "who", target),
      el("span", null, shortTime(m.createdAt)), el("span", null, `#${m.seq}`), nodeTag(m)),
    el("div", "content", highlight(m.content, words)),
  );
  if (m.recipients) item.append(el("div", "chips", ...m.recipients.map(recipientChip)));
  return item;
}

const shown = new Set();
let firstLoad = true;

async function refreshMessages() {
  const out = await api(`/api/messages?limit=${STREAM_LIMIT}&receipts=1`);
  const items = out.messages.slice().reverse().map((m) => messageItem(m, [], !firstLoad && !shown.has(m.messageId)));
  out.messages.forEach((m) => shown.add(m.messageId));
  firstLoad = false;
  $("stream").replaceChildren(...items);
  $("no-messages").hidden = out.messages.length > 0;
  $("stream-count").textContent = out.messages.length ? `(latest ${out.messages.length})` : "";
}

let refreshTimer = null;
let refreshing = false;
let again = false;

function scheduleRefresh() {
  if (refreshing) { again = true; return; }
  if (refreshTimer !== null) return;
  refreshTimer = setTimeout(async () => {
    refreshTimer = null;
    refreshing = true;
    try {
      await Promise.all([refreshMessages(), refreshStatus()]);
      if (!$("results").hidden && lastSearch) await runSearch(lastSearch);
    } catch (err) {
      setConn(false, `daemon not answering (${err.message})`);
    } finally {
      refreshing = false;
      if (again) { again = false; scheduleRefresh(); }
    }
  }, REFRESH_GAP_MS);
}

function connect() {
  events = new EventSource("/api/events");
  events.addEventListener("hello", () => { setConn(true, "live"); scheduleRefresh(); });
  events.addEventListener("change", () => { scheduleRefresh(); });
  events.addEventListener("error", () => { setConn(false, "reconnecting…"); });
}

// -- search ----------------------------------------------------------------------------------

let lastSearch = null;

async function runSearch(params) {
  const query = new URLSearchParams({ q: params.q, limit: "50", receipts: "1" });
  if (params.from) query.set("from", params.from);
  if (params.channel) query.set("channel", params.channel);
  const box = $("results");
  box.hidden = false;
  try {
    const out = await api(`/api/search?${query}`);
    const words = params.q.toLowerCase().split(/\s+/).filter(Boolean);
    $("hits").replaceChildren(...out.hits.map((m) => messageItem(m, words, false)));
    $("results-count").textContent = `(${out.hits.length} for “${params.q}”)`;
  } catch (err) {
    $("hits").replaceChildren(el("li", "err", err.message));
    $("results-count").textContent = "";
  }
}

function setupSearch() {
  $("search").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = $("q").value.trim();
    if (!q) return;
    lastSearch = { q, from: $("q-from").value.trim(), channel: $("q-channel").value.trim() };
    runSearch(lastSearch);
  });
  $("q-clear").addEventListener("click", () => {
    lastSearch = null;
    $("q").value = "";
    $("q-from").value = "";
    $("q-channel").value = "";
    $("results").hidden = true;
    $("hits").replaceChildren();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  setupSearch();
  refreshStatus();
  scheduleRefresh();
  connect();
  setInterval(refreshStatus, STATUS_EVERY_MS);
});
