// The live page: polls /admin/overview.json and redraws the table.  No framework, no build.
"use strict";

const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);
let lastOk = 0;

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? String(n) : n.toFixed(n < 10 ? 1 : 0)) + " " + units[i];
}

function count(n) {
  return n.toLocaleString("en-US");
}

function duration(ms) {
  if (ms <= 0) return "–";
  const s = ms / 1000;
  if (s < 1) return Math.round(ms) + " ms";
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  const h = Math.floor(m / 60);
  if (h < 48) return h + "h" + String(m % 60).padStart(2, "0") + "m";
  return Math.floor(h / 24) + "d" + (h % 24) + "h";
}

function rate(r) {
  if (!r) return "0";
  return r >= 100 ? Math.round(r).toLocaleString("en-US") : r.toFixed(1);
}

function latency(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms < 1000 ? ms.toFixed(ms < 10 ? 1 : 0) + " ms" : (ms / 1000).toFixed(1) + " s";
}

const SVG = "http://www.w3.org/2000/svg";

function sparkline(series, kind) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark " + kind);
  svg.setAttribute("viewBox", "0 0 100 24");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("aria-hidden", "true");
  const line = document.createElementNS(SVG, "polyline");
  const values = series.length ? series : [0];
  const max = Math.max(...values, 0.0001) * 1.15;  // a steady rate sits below the top
  const step = values.length > 1 ? 100 / (values.length - 1) : 100;
  const points = values.map((v, i) => (i * step).toFixed(1) + "," + (22 - (v / max) * 20).toFixed(1));
  if (values.length === 1) points.push("100," + points[0].split(",")[1]);
  line.setAttribute("points", points.join(" "));
  svg.appendChild(line);
  return svg;
}

function cell(text, className, label) {
  const td = document.createElement("td");
  if (className) td.className = className;
  if (label) td.dataset.label = label;
  td.textContent = text;
  return td;
}

function rateCell(value, series, kind, label) {
  const td = document.createElement("td");
  td.className = "rate-cell";
  td.dataset.label = label;
  const wrap = document.createElement("div");
  wrap.className = "rate";
  const number = document.createElement("span");
  number.textContent = rate(value);
  wrap.appendChild(number);
  wrap.appendChild(sparkline(series, kind));
  td.appendChild(wrap);
  return td;
}

function row(q, states) {
  const tr = document.createElement("tr");
  tr.dataset.name = q.name;
  if (q.reader !== null) tr.className = "reader-row";
  const name = document.createElement("td");
  name.className = "name";
  name.dataset.label = q.alias ? "alias" : q.reader !== null ? "fanout reader" : "queue";
  name.appendChild(document.createTextNode(q.queue));
  if (q.alias) {
    const to = document.createElement("span");
    to.className = "reader";
    to.textContent = " \u2192 " + q.alias.join(", ");
    name.appendChild(to);
  }
  if (q.reader !== null) {
    const r = document.createElement("span");
    r.className = "reader";
    r.textContent = "+" + q.reader;
    name.appendChild(r);
  }
  tr.appendChild(name);
  const state = cell(q.attention, "state-cell", null);
  const badge = document.createElement("span");
  badge.className = "state " + q.attention;
  badge.textContent = q.attention;
  badge.title = states[q.attention] || "";  // the server's definition (kestreld/admin/page.py)
  state.textContent = "";
  state.appendChild(badge);
  tr.appendChild(state);
  tr.appendChild(cell(count(q.items), "num items", "items"));
  tr.appendChild(cell(bytes(q.bytes), "num", "bytes"));
  tr.appendChild(cell(duration(q.oldest_ms), "num", "oldest item"));
  tr.appendChild(cell(count(q.open_reads), "num", "open reads"));
  tr.appendChild(cell(count(q.waiters), "num", "waiters"));
  tr.appendChild(rateCell(q.put_rate, q.put_series, "put", "put /s"));
  tr.appendChild(rateCell(q.get_rate, q.get_series, "get", "get /s"));
  tr.appendChild(cell(latency(q.delivery_p50_ms) + " / " + latency(q.delivery_p99_ms), "num", "delivery p50 / p99"));
  return tr;
}

function render(doc) {
  const s = doc.server;
  const status = $("status");
  status.textContent = s.status;
  status.className = "badge " + s.status;
  document.title = "kestreld " + s.status + " · " + count(s.items) + " items";
  $("version").textContent = s.version;
  $("uptime").textContent = duration(s.uptime_s * 1000);
  $("connections").textContent = count(s.connections);
  $("queue-count").textContent = count(s.queues);
  $("items").textContent = count(s.items);
  $("bytes").textContent = bytes(s.bytes);
  $("implementation").textContent = s.implementation;
  const filter = $("filter").value.trim().toLowerCase();
  const body = document.createDocumentFragment();
  for (const q of doc.rows) {
    if (filter && !q.name.toLowerCase().includes(filter)) continue;
    body.appendChild(row(q, doc.states || {}));
  }
  $("rows").replaceChildren(body);
  $("empty").hidden = doc.rows.length > 0;
}

let latest = null;

async function poll() {
  try {
    const reply = await fetch("/admin/overview.json", { cache: "no-store" });
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    latest = await reply.json();
    render(latest);
    lastOk = Date.now();
    $("offline").hidden = true;
  } catch (e) {
    $("offline").hidden = false;
  }
  setTimeout(poll, POLL_MS);
}

function tick() {
  if (lastOk) {
    const ago = Math.round((Date.now() - lastOk) / 1000);
    $("updated").textContent = "updated " + (ago <= 1 ? "just now" : ago + " s ago");
  }
}

$("filter").addEventListener("input", () => { if (latest) render(latest); });
setInterval(tick, 1000);
poll();
