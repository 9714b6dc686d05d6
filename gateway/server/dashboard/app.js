// ridge's live page: polls /status (gateway/telemetry/status.py) and draws it. No library,
// no network beyond this gateway; every value is set as text, never as markup.
"use strict";

const POLL_MS = 2000;
const HISTORY = 150;  // chart points kept (5 minutes at one poll each 2 s)
const KEY = "ridge-admin-key";
const history = [];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const num = (v, digits = 2) => (v === null || v === undefined) ? "–" : Number(v).toFixed(digits);
const pct = (v) => (v === null || v === undefined) ? "–" : (100 * v).toFixed(1) + " %";
const ms = (v) => (v === null || v === undefined) ? "–" : (1000 * v).toFixed(v < 0.1 ? 1 : 0) + " ms";
const count = (v) => (v === null || v === undefined) ? "–" : String(Math.round(v));
const pair = (q) => ms(q.p50) + " / " + ms(q.p99);

function bar(ratio) {
  if (ratio === null || ratio === undefined) return "–";
  const fillBar = el("span");
  fillBar.style.width = Math.min(100, 100 * ratio).toFixed(0) + "%";  // CSSOM: allowed by CSP
  return el("span", {}, el("span", { class: "bar" + (ratio > 0.9 ? " high" : "") }, fillBar),
    pct(ratio));
}

function fill(id, rows, empty) {
  const body = document.querySelector("#" + id + " tbody");
  const cols = document.querySelectorAll("#" + id + " thead th").length;
  body.replaceChildren(...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: cols, class: "empty" }, empty))]));
}

function cell(value, cls) { return el("td", cls ? { class: cls } : {}, value); }

function health(ep) {
  if (!ep.healthy) return el("span", { class: "down" }, "down");
  if (ep.circuit_open) return el("span", { class: "open" }, "circuit open");
  return el("span", { class: "up" }, "up");
}

function sum(list, f) { return list.reduce((a, x) => a + (f(x) || 0), 0); }

function render(doc) {
  const pools = doc.pools;
  const held = sum(pools, (p) => p.slo_evaluated_per_s);
  const good = sum(pools, (p) => p.goodput_per_s);
  document.getElementById("requests-per-s").textContent = num(sum(pools, (p) => p.requests_per_s));
  document.getElementById("goodput-per-s").textContent = num(good);
  document.getElementById("slo-attainment").textContent = held > 0 ? pct(good / held) : "–";
  document.getElementById("in-flight").textContent = count(sum(pools, (p) => p.in_flight));
  document.getElementById("refused-per-s").textContent = num(sum(pools, (p) => p.refused_per_s));
  document.getElementById("endpoints-up").textContent =
    sum(pools, (p) => p.healthy_endpoints) + " / " + sum(pools, (p) => p.endpoints_total);
  document.getElementById("requests-total").textContent = count(sum(pools, (p) => p.requests_total));
  document.getElementById("window").textContent = "over the last " + num(doc.window_s, 0) + " s";

  fill("pools", pools.map((p) => el("tr", {},
    cell(p.name), cell(p.engine + (p.role !== "both" ? " · " + p.role : ""), "text"),
    cell(p.levers_running.join(", ") || "none", "text"),
    cell(p.healthy_endpoints + " / " + p.endpoints_total),
    cell(count(p.in_flight)), cell(p.binding_wall || "–", "text"),
    cell(num(p.requests_per_s)), cell(num(p.goodput_per_s)), cell(pct(p.slo_attainment)),
    cell(pair(p.ttft_s)), cell(pair(p.tpot_s)), cell(pct(p.mfu)), cell(pct(p.mbu)),
    cell(count(p.queued)), cell(num(p.refused_per_s)))), "no pools");

  const endpoints = pools.flatMap((p) => p.endpoints.map((e) => [p.name, e]));
  fill("endpoints", endpoints.map(([pool, e]) => el("tr", {},
    cell(pool), cell(e.url, "text"), cell(health(e)),
    cell(count(e.in_flight) + " / " + count(e.capacity)),
    cell(count(e.running) + " / " + count(e.waiting)), cell(bar(e.kv_usage)),
    cell(pct(e.prefix_hit_rate)), cell(e.levers_missing.join(", ") || "–", "text"))), "no endpoints");

  fill("decisions", doc.decisions.map((d) => el("tr", {},
    cell(d.pool), cell(d.lever, "text"), cell(d.reason, "text"), cell(count(d.total)),
    cell(num(d.per_s)))), "no requests routed yet");
  fill("refusals", doc.refusals.map((r) => el("tr", {},
    cell(r.pool), cell(r.reason, "text"), cell(count(r.total)), cell(num(r.per_s)))),
    "none refused");

  const p99 = Math.max(0, ...pools.map((p) => p.ttft_s.p99 || 0));
  history.push({ rps: sum(pools, (p) => p.requests_per_s), good: good, ttft: p99 });
  if (history.length > HISTORY) history.shift();
  chart();
}

function chart() {
  const canvas = document.getElementById("chart");
  const g = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 28;
  g.clearRect(0, 0, w, h);
  g.font = "12px system-ui, sans-serif";
  const lines = [["rps", "#2b6cb0", "requests/s"], ["good", "#1f9d55", "goodput/s"]];
  const top = Math.max(1, ...history.map((p) => Math.max(p.rps, p.good)));
  const ttftTop = Math.max(0.001, ...history.map((p) => p.ttft));
  const x = (i) => pad + (w - 2 * pad) * (i / Math.max(1, HISTORY - 1));
  const draw = (key, color, scale) => {
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    history.forEach((p, i) => {
      const y = h - pad - (h - 2 * pad) * (p[key] / scale);
      if (i === 0) g.moveTo(x(i), y); else g.lineTo(x(i), y);
    });
    g.stroke();
  };
  g.strokeStyle = "#dde1e8"; g.beginPath(); g.moveTo(pad, h - pad); g.lineTo(w - pad, h - pad); g.stroke();
  lines.forEach(([key, color]) => draw(key, color, top));
  draw("ttft", "#d69e2e", ttftTop);
  g.fillStyle = "#6b7385";
  g.fillText("max " + top.toFixed(1) + " req/s", pad, 14);
  g.fillText("TTFT p99 max " + ms(ttftTop), w - pad - 160, 14);
  [...lines, ["ttft", "#d69e2e", "TTFT p99"]].forEach(([, color, label], i) => {
    g.fillStyle = color; g.fillText(label, pad + 170 + i * 110, 14);
  });
}

function setState(ok, text) {
  document.getElementById("state").className = "dot " + (ok ? "ok" : "bad");
  document.getElementById("updated").textContent = text;
}

async function poll() {
  const headers = {};
  const key = sessionStorage.getItem(KEY);
  if (key) headers["Authorization"] = "Bearer " + key;
  try {
    const res = await fetch("/status", { headers: headers, cache: "no-store" });
    if (res.status === 401 || res.status === 403) {
      const form = document.getElementById("key-form");
      form.hidden = false;
      document.getElementById("key-error").textContent = key ? "that key was refused" : "";
      setState(false, "an admin key is needed");
      return;
    }
    if (!res.ok) { setState(false, "status answered " + res.status); return; }
    render(await res.json());
    document.getElementById("key-form").hidden = true;
    setState(true, "updated " + new Date().toLocaleTimeString());
  } catch (err) {
    setState(false, "the gateway does not answer");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, document.getElementById("key").value.trim());
});
poll();
