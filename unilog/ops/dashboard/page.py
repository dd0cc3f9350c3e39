"""The dashboard's one page: plain HTML, CSS and JavaScript (no build step, nothing fetched from elsewhere).

It polls ``/api/status`` every two seconds and redraws: the capture mode (in WAL mode the slot's streamer, retained WAL
and confirmation lag, with a warning while no streamer streams from it, while a failover would not keep the slot
(producers stage rows meanwhile) or logical decoding is held back, and an error while a loss of records is not
acknowledged), streams, two SVG charts of the last hour with axes, scales and legends (records per second in, added to
each stream, and out, read by each consumer and group; each one's lag in entries), consumers (those registered for
retention too, a registration without a checkpoint marked "registered, never ran") with their lag drawn as an SVG line
over the sampled history and what each registration holds of the stream, the oldest open transaction that staged
records (only its own wait), each stream's record types and their versions (from the schema registry, every 15
seconds), the running backfills (rows done of the estimate, the last key), and the dead letters with show / replay /
drop. Every value is inserted as text, never as HTML, so nothing read from the stream can script the page."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>unilog</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font: 14px system-ui, sans-serif; margin: 1.5rem; color: #1d2330; background: #f7f8fa; }
 h1 { font-size: 1.3rem; margin: 0 0 .3rem; } h2 { font-size: 1.05rem; margin: 1.4rem 0 .4rem; }
 table { border-collapse: collapse; background: #fff; min-width: 40rem; }
 th, td { padding: .35rem .7rem; border-bottom: 1px solid #e3e6eb; text-align: left; vertical-align: middle; }
 th { background: #eef1f5; font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
 .muted { color: #6b7280; } .banner { padding: .6rem .8rem; margin: .6rem 0; border-radius: 4px; }
 .warn { background: #fff4d6; border: 1px solid #e8c15a; } .error { background: #fde2e1; border: 1px solid #e08a85; }
 button { margin-right: .3rem; } pre { background: #fff; padding: .6rem; border: 1px solid #e3e6eb; max-width: 60rem;
 overflow: auto; } svg { background: #fbfcfd; border: 1px solid #e3e6eb; } polyline { fill: none; stroke: #2f6fde;
 stroke-width: 1.5; }
 .charts { display: flex; flex-wrap: wrap; gap: 1rem; } svg.chart { background: #fff; }
 .chart line.axis { stroke: #6b7280; } .chart line.grid { stroke: #eef1f5; }
 .chart text { font: 11px system-ui, sans-serif; fill: #374151; } .chart text.title { font-weight: 600; }
</style></head>
<body>
<h1>unilog</h1>
<div class="muted">updated <span id="updated">never</span><span id="mode"></span></div>
<div id="problem" class="banner error" hidden></div>
<div id="horizon" class="banner warn" hidden></div>
<div id="slot" class="banner warn" hidden></div>
<div id="failover" class="banner warn" hidden></div>
<div id="loss" class="banner error" hidden></div>
<h2>Capture</h2>
<table id="capture"><thead><tr><th>mode</th><th>slot</th><th>streamer</th><th>WAL retained</th>
<th>confirmation lag</th></tr></thead><tbody></tbody></table>
<h2>Streams</h2>
<p id="totals"></p>
<table id="streams"><thead><tr><th>stream</th><th>length</th><th>staged</th><th>oldest staged (s)</th>
<th>publishers</th><th>dead letters</th></tr></thead><tbody></tbody></table>
<h2>Record types</h2>
<table id="types"><thead><tr><th>stream</th><th>type</th><th>versions</th><th>object</th><th>action</th></tr>
</thead><tbody></tbody></table>
<h2>Rates and lag, last hour</h2>
<div class="charts"><svg id="chart-rates" class="chart" role="img" aria-label="records per second, in and out"></svg>
<svg id="chart-lag" class="chart" role="img" aria-label="lag in entries"></svg></div>
<h2>Consumers and groups</h2>
<table id="consumers"><thead><tr><th>consumer</th><th>position</th><th>lag (entries)</th><th>lag (s)</th>
<th>lag, last hour</th><th>retention</th></tr></thead><tbody></tbody></table>
<h2>Backfills</h2>
<table id="backfills"><thead><tr><th>backfill</th><th>table</th><th>status</th><th>rows</th><th>of about</th>
<th>last key</th></tr></thead><tbody></tbody></table>
<h2>Dead letters</h2>
<table id="letters"><thead><tr><th>stream</th><th>id</th><th>owner</th><th>position</th><th>attempts</th>
<th>error</th><th></th></tr></thead><tbody></tbody></table>
<pre id="letter" hidden></pre>
<script>
"use strict";
const TOKEN = "{{TOKEN}}", READ_ONLY = {{READ_ONLY}};
const $ = (sel) => document.querySelector(sel);
function cell(row, text, cls) {
  const td = row.insertCell(); td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) td.className = cls; return td;
}
function chart(points) {
  const w = 240, h = 40, ns = "http://www.w3.org/2000/svg", svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h);
  if (points.length > 1) {
    const t0 = points[0][0], t1 = points[points.length - 1][0], top = Math.max(1, ...points.map(p => p[1]));
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points.map(p =>
      `${((p[0] - t0) / Math.max(1e-9, t1 - t0) * (w - 4) + 2).toFixed(1)},${(h - 3 - p[1] / top * (h - 6)).toFixed(1)}`
    ).join(" "));
    svg.appendChild(line);
  }
  return svg;
}
const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#9c36b5", "#e67700", "#0c8599", "#c2255c", "#5c940d"];
function el(parent, tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  parent.appendChild(node); return node;
}
function ticks(top) {  // 0 and four round steps up to at least top
  const raw = Math.max(top, 1e-9) / 4, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw);
  return [0, 1, 2, 3, 4].map(i => +(i * step).toPrecision(6));
}
function plot(svg, title, unit, series, windowSeconds, now) {
  // series: [{name, points: [[t, value], ...]}]; x: the last windowSeconds up to now, in minutes; y: 0 up to the top
  const w = 560, h = 250, left = 56, right = 12, top = 26, bottom = 40, pw = w - left - right, ph = h - top - bottom;
  svg.replaceChildren(); svg.setAttribute("width", w); svg.setAttribute("height", h + 18 * series.length);
  el(svg, "text", {x: left, y: 16, class: "title"}, title);
  const peak = Math.max(0, ...series.flatMap(s => s.points.map(p => p[1]))), ys = ticks(peak || 1), ymax = ys[4];
  const x = t => left + (1 - (now - t) / windowSeconds) * pw, y = v => top + ph - v / ymax * ph;
  for (const v of ys) {
    el(svg, "line", {x1: left, x2: left + pw, y1: y(v), y2: y(v), class: v ? "grid" : "axis"});
    el(svg, "text", {x: left - 6, y: y(v) + 4, "text-anchor": "end", class: "ytick"}, String(v));
  }
  const minutes = windowSeconds / 60;
  for (let m = 0; m <= minutes; m += minutes / 4) {
    const xt = x(now - (minutes - m) * 60);
    el(svg, "line", {x1: xt, x2: xt, y1: top + ph, y2: top + ph + 4, class: "axis"});
    el(svg, "text", {x: xt, y: top + ph + 16, "text-anchor": "middle", class: "xtick"},
      m === minutes ? "now" : `-${minutes - m} min`);
  }
  el(svg, "line", {x1: left, x2: left, y1: top, y2: top + ph, class: "axis"});
  el(svg, "text", {x: 12, y: top + ph / 2, transform: `rotate(-90 12 ${top + ph / 2})`, "text-anchor": "middle",
    class: "ylabel"}, unit);
  el(svg, "text", {x: left + pw / 2, y: top + ph + 32, "text-anchor": "middle", class: "xlabel"}, "time");
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length], shown = s.points.filter(p => now - p[0] <= windowSeconds);
    if (shown.length) el(svg, "polyline", {points: shown.map(p => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`)
      .join(" "), style: `stroke: ${color}`, "data-series": s.name,
      "data-max": String(Math.max(...shown.map(p => p[1])))});
    const ly = h + 14 + 18 * i;
    el(svg, "line", {x1: left, x2: left + 18, y1: ly - 4, y2: ly - 4, style: `stroke: ${color}; stroke-width: 3`});
    el(svg, "text", {x: left + 24, y: ly, class: "legend"}, s.name);
  });
}
function drawCharts(data) {
  const rates = data.rates || {in: {}, out: {}}, win = data.window || 3600, now = data.at;
  const flows = [...Object.entries(rates.in).map(([k, p]) => ({name: `in: ${k}`, points: p})),
    ...Object.entries(rates.out).map(([k, p]) => ({name: `out: ${k}`, points: p}))];
  plot($("#chart-rates"), "Records per second, in (added to the stream) and out (read by each consumer)",
    "records/s", flows, win, now);
  const lags = Object.entries(data.lag || {}).map(([k, p]) => ({name: k, points: p.map(q => [q[0], q[1]])}));
  plot($("#chart-lag"), "Lag of each consumer and group, in entries", "lag (entries)", lags, win, now);
}
function drawStreams(status) {
  const t = status.totals, cut = (status.omitted || {}).streams || 0;
  if (t) $("#totals").textContent = `${t.streams} streams, ${t.entries} entries, ${t.staged} staged, ` +
    `${t.dead_letters} dead letters; ${t.consumers} consumers, ${t.groups} groups; lag ${t.lag_entries} entries, ` +
    `at most ${t.max_lag_seconds.toFixed(1)} s` + (cut ? ` (the ${t.streams - cut} most behind shown)` : "");
  const body = $("#streams tbody"); body.replaceChildren();
  for (const s of status.streams) {
    const row = body.insertRow(); row.dataset.stream = s.name;
    cell(row, s.name); cell(row, s.length, "num"); cell(row, s.staged, "num");
    cell(row, s.staged_oldest_age_seconds, "num"); cell(row, s.publishers, "num"); cell(row, s.dead_letters, "num");
  }
}
async function drawTypes() {
  const body = $("#types tbody"), data = await (await fetch("/api/types")).json();
  body.replaceChildren();
  for (const [stream, versions] of Object.entries(data.types)) {
    const names = [...new Set(versions.map(v => v.name))];
    for (const name of names) {
      const mine = versions.filter(v => v.name === name), last = mine[mine.length - 1];
      const row = body.insertRow(); row.dataset.type = `${stream}/${name}`;
      cell(row, stream); cell(row, name);
      cell(row, mine.map(v => `v${v.version}` + (v.retired ? " (retired)" : "")).join(", "), "versions");
      cell(row, last.object); cell(row, last.action);
    }
  }
  if (!body.rows.length) cell(body.insertRow(), data.error || "(no record type registered: unilog schema register)");
}
function drawBackfills(status) {
  const body = $("#backfills tbody"); body.replaceChildren();
  for (const b of status.backfills || []) {
    const row = body.insertRow(); row.dataset.backfill = b.name;
    cell(row, b.name); cell(row, b.table); cell(row, b.active ? "running" : "stopped (resume it)");
    cell(row, b.rows_done, "num"); cell(row, b.rows_estimate, "num"); cell(row, b.last_key);
  }
  if (!body.rows.length) cell(body.insertRow(), "(none running)");
}
function holds(c) {
  if (c.registered_id === null || c.registered_id === undefined) return "not registered";
  if (!c.holds_entries) return "holds nothing";
  return `holds ${c.holds_entries} ${c.holds_entries === 1 ? "entry" : "entries"}` +
    (c.holds_oldest ? " (the oldest retained)" : "");
}
function drawConsumers(status, lag) {
  const body = $("#consumers tbody"); body.replaceChildren();
  const rows = status.consumers.map(c => [`${c.stream}/${c.name}`, c, c.never_ran ? "registered, never ran" :
    c.last_id, holds(c)]);
  for (const s of status.streams) for (const g of s.groups) {
    rows.push([`${s.name}/${g.name} (group)`, g, g.last_delivered_id, "-"]);
  }
  for (const [key, c, position, retention] of rows) {
    const row = body.insertRow(); row.dataset.consumer = key;
    if (c.never_ran) row.dataset.neverRan = "true";
    cell(row, key); cell(row, position, "position");
    cell(row, c.lag_entries, "num lag-entries"); cell(row, c.lag_seconds, "num lag-seconds");
    row.insertCell().appendChild(chart(lag[key] || [])); cell(row, retention, "retention");
  }
}
function drawHorizon(status) {
  const holder = status.staged.open_stager, box = $("#horizon");
  box.hidden = !holder;
  if (holder) box.textContent = `pid ${holder.pid} (${holder.application_name || "-"}, ${holder.state}) staged ` +
    `records and is open ${holder.age_seconds.toFixed(1)} s: they wait for its commit (nothing else does): ` +
    holder.query;
}
function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"]; let v = n, i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i ? `${v.toFixed(1)} ${units[i]}` : `${n} B`;
}
function drawCapture(status) {
  const c = status.capture || {mode: "table", slot: null}, wal = c.mode === "wal", body = $("#capture tbody");
  body.replaceChildren();
  const row = body.insertRow(); row.dataset.mode = c.mode;
  cell(row, wal ? "WAL" : "table"); cell(row, wal ? c.slot : "no slot");
  const streamer = !wal ? "-" : !c.exists ? "slot missing" : c.active ? `pid ${c.active_pid}` : "none";
  cell(row, streamer, "slot-streamer");
  cell(row, wal ? bytes(c.retained_bytes) : "-", "num slot-retained");
  cell(row, wal ? bytes(c.confirmed_lag_bytes) : "-", "num slot-lag");
  const box = $("#slot"); box.hidden = !wal || c.active;
  if (!box.hidden) box.textContent = c.exists
    ? `No streamer streams from WAL capture slot ${c.slot}: it retains WAL (${bytes(c.retained_bytes)}) until one does.`
    : `WAL capture slot ${c.slot} is missing: run unilog capture wal --recreate.`;
  const notes = [];
  if (wal && c.held_back) notes.push(`Logical decoding is held back, nothing is streamed: ${c.held_back}.`);
  const why = (c.failover_not_ready || "a standby's copy is not verified").replace(/^failover not ready: /, "");
  if (wal && c.failover_ready === false) notes.push(`Failover not ready, producers stage rows meanwhile: ${why}.`);
  const fo = $("#failover"); fo.hidden = !notes.length; fo.textContent = notes.join(" ");
  const l = c.loss, lost = $("#loss"); lost.hidden = !(wal && c.losses_unacknowledged > 0 && l);
  if (!lost.hidden) lost.textContent = `Records lost with WAL capture slot ${l.slot} at ${l.detected_at}: ` +
    `${l.lost === null ? "an unknown number" : l.lost} lost (${l.detail}; WAL ${l.from_lsn} to ${l.to_lsn}, ` +
    `${l.recovered} recovered)` + (c.losses_unacknowledged > 1 ? ` (${c.losses_unacknowledged} unacknowledged)` : "") +
    `: consumers never get them. Acknowledge with unilog capture losses --ack ${l.id}.`;
}
async function post(url) {
  const r = await fetch(url, {method: "POST", headers: {"X-Unilog-Token": TOKEN}});
  if (!r.ok) throw new Error(await r.text());
  return r.json();
}
async function act(stream, id, action) {
  if (!confirm(`${action} dead letter ${id} of ${stream}?`)) return;
  try { await post(`/api/dlq/${encodeURIComponent(stream)}/${encodeURIComponent(id)}/${action}`); }
  catch (e) { alert(`${action} failed: ${e.message}`); }
  refresh();
}
async function show(stream, id) {
  const r = await fetch(`/api/dlq/${encodeURIComponent(stream)}/${encodeURIComponent(id)}`);
  const pre = $("#letter"); pre.hidden = false; pre.textContent = JSON.stringify(await r.json(), null, 2);
}
function button(row, label, handler) {
  const b = document.createElement("button"); b.textContent = label; b.className = label; b.onclick = handler;
  row.lastChild.appendChild(b);
}
async function drawLetters(status) {
  const body = $("#letters tbody"), rows = [];
  for (const s of status.streams.filter(s => s.dead_letters > 0)) {
    const r = await fetch(`/api/dlq/${encodeURIComponent(s.name)}`);
    for (const d of await r.json()) rows.push([s.name, d]);
  }
  body.replaceChildren();
  for (const [stream, d] of rows) {
    const row = body.insertRow(); row.dataset.letter = d.id;
    for (const v of [stream, d.id, d.owner, d.position, d.attempts, d.error]) cell(row, v);
    row.insertCell(); button(row, "show", () => show(stream, d.id));
    if (!READ_ONLY) {
      button(row, "replay", () => act(stream, d.id, "replay")); button(row, "drop", () => act(stream, d.id, "drop"));
    }
  }
}
async function refresh() {
  try {
    const data = await (await fetch("/api/status")).json();
    $("#problem").hidden = !data.error; $("#problem").textContent = data.error || "";
    if (data.status) {
      drawCapture(data.status); drawStreams(data.status); drawConsumers(data.status, data.lag);
      drawHorizon(data.status); drawBackfills(data.status); drawCharts(data);
      await drawLetters(data.status);
    }
    $("#updated").textContent = new Date(data.at * 1000).toLocaleTimeString();
  } catch (e) { $("#problem").hidden = false; $("#problem").textContent = `dashboard unreachable: ${e.message}`; }
}
$("#mode").textContent = READ_ONLY ? " · read-only" : "";
refresh(); setInterval(refresh, 2000);
const types = () => drawTypes().catch(e => { $("#types tbody").replaceChildren(); cell($("#types tbody").insertRow(),
  `record types unavailable: ${e.message}`); });
types(); setInterval(types, 15000);
</script>
</body></html>
"""
