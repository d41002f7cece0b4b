// The Blizzard status page: fetches /api/state every few seconds and redraws.
// Text goes in through textContent only (queue names and errors are data, never markup);
// charts are small inline SVGs drawn here, so the page needs nothing from the internet.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const CHART_W = 160, CHART_H = 34;
let pollMs = 2000;

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function seconds(s) {
  if (s === null || s === undefined) return "-";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i && n < 10 ? 1 : 0)} ${units[i]}`;
}

function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }

// A line chart of several series sharing one y scale from 0; null values leave gaps.
function chart(series, unit) {
  const svg = svgEl("svg", {width: CHART_W, height: CHART_H, viewBox: `0 0 ${CHART_W} ${CHART_H}`,
                            class: "chart"});
  const n = Math.max(...series.map(s => s.values.length), 2);
  const top = Math.max(1, ...series.flatMap(s => s.values.filter(v => v !== null)));
  const x = i => (i / (n - 1)) * (CHART_W - 2) + 1;
  const y = v => CHART_H - 2 - (v / top) * (CHART_H - 12);
  for (const s of series) {
    let d = "", pen = "M";
    s.values.forEach((v, i) => {
      if (v === null) { pen = "M"; return; }
      d += `${pen}${x(i).toFixed(1)},${y(v).toFixed(1)} `;
      pen = "L";
    });
    if (d) svg.appendChild(svgEl("path", {d, class: `line ${s.cls}`}));
  }
  const label = svgEl("text", {x: 2, y: 9, class: "scale"});
  label.textContent = `max ${+top.toFixed(2)}${unit}`;
  svg.appendChild(label);
  return svg;
}

function tile(label, value, state) {
  const box = el("div", {class: `tile ${state}`});
  box.append(el("div", {class: "label"}, label), el("div", {class: "value"}, value));
  return box;
}

function drawHealth(doc) {
  const c = doc.cluster, health = document.getElementById("health");
  const tiles = [tile("master", doc.reachable ? "up" : "not answering", doc.reachable ? "ok" : "bad")];
  if (c) {
    tiles.push(
      tile("security", c.secure ? "on" : "OFF", c.secure ? "ok" : "warn"),
      tile("safe mode", c.safe_mode ? "on (starting)" : "off", c.safe_mode ? "warn" : "ok"),
      tile("data nodes", `${c.nodes_alive} alive, ${c.nodes_dead} dead`, c.nodes_dead ? "bad" : "ok"),
      tile("under-replicated items", String(c.under_replicated), c.under_replicated ? "warn" : "ok"),
      tile("replication", `R = ${c.replication}`, "ok"));
  }
  health.replaceChildren(...tiles);
}

function drawQueues(doc) {
  const rows = doc.queues.map(q => {
    const h = doc.history.queues[q.queue];
    const tr = el("tr", {"data-queue": q.queue});
    tr.append(el("td", {class: "name"}, q.queue));
    for (const f of ["ready", "delayed", "leased", "pending", "dead"]) {
      tr.append(el("td", {"data-field": f, class: "num"}, String(q[f])));
    }
    tr.append(el("td", {"data-field": "oldest", class: "num"}, q.ready ? seconds(q.oldest_age_s) : "-"),
              el("td", {"data-field": "enqueue_per_s", class: "num"}, String(q.enqueue_per_s)),
              el("td", {"data-field": "ack_per_s", class: "num"}, String(q.ack_per_s)));
    const depth = el("td"), rate = el("td");
    depth.append(chart([{values: h.ready, cls: "ready"}, {values: h.leased, cls: "leased"}], ""));
    rate.append(chart([{values: h.enqueue_per_s, cls: "enq"}, {values: h.ack_per_s, cls: "ack"}], "/s"));
    tr.append(depth, rate);
    return tr;
  });
  document.querySelector("#queues tbody").replaceChildren(...rows);
  const note = doc.queues.length ? "" : "no queues yet";
  document.getElementById("queues-note").textContent = doc.queues_hidden
    ? `${doc.queues_hidden} more queues not shown: blizzard queue list` : note;
}

function drawDead(doc) {
  const rows = doc.queues.filter(q => q.dead > 0).map(q => {
    const tr = el("tr", {"data-dead": q.queue});
    tr.append(el("td", {class: "name"}, q.queue), el("td", {class: "num"}, String(q.dead)),
              el("td", {class: "hint"}, `blizzard queue peek ${q.dead_letter} --n 10; ` +
                                        `blizzard queue redrive ${q.queue}`));
    return tr;
  });
  document.querySelector("#dead tbody").replaceChildren(...rows);
  document.getElementById("dead-note").textContent = rows.length ? "" : "none";
}

function drawProgress(doc) {
  const rows = doc.progress.map(j => {
    const tr = el("tr", {"data-job": String(j.id)});
    const pct = `${Math.round(j.progress * 100)}%`;
    tr.append(el("td", {class: "num"}, String(j.id)), el("td", {class: "name"}, j.queue),
              el("td", {class: "num"}, j.cancel_requested ? `${pct} (cancel requested)` : pct),
              el("td", {}, j.note), el("td", {class: "num"}, String(j.attempts + 1)));
    return tr;
  });
  document.querySelector("#progress tbody").replaceChildren(...rows);
  document.getElementById("progress-note").textContent = rows.length ? "" :
    "none reporting progress (blizzard.progress in a task)";
}

function drawSchedules(doc) {
  const rows = doc.schedules.map(s => {
    const tr = el("tr", {"data-schedule": s.name});
    tr.append(el("td", {class: "name"}, s.name),
              el("td", {}, s.timezone === "UTC" ? s.when : `${s.when} (${s.timezone})`),
              el("td", {class: "name"}, s.queue), el("td", {}, clock(s.next_at)),
              el("td", {class: "num"}, String(s.runs)), el("td", {}, s.state),
              el("td", {}, s.error));
    return tr;
  });
  document.querySelector("#schedules tbody").replaceChildren(...rows);
  document.getElementById("schedules-note").textContent = rows.length ? "" : "none";
}

function drawNodes(doc) {
  const nodes = doc.cluster ? doc.cluster.nodes : [];
  document.querySelector("#nodes tbody").replaceChildren(...nodes.map(n => {
    const tr = el("tr", {"data-node": n.node_id, class: n.alive ? "" : "dead"});
    tr.append(el("td", {}, n.node_id), el("td", {}, n.addr),
              el("td", {}, n.alive ? "alive" : "DEAD"),
              el("td", {class: "num"}, `${seconds(n.heartbeat_age_s)} ago`),
              el("td", {class: "num"}, String(n.items)), el("td", {class: "num"}, bytes(n.bytes_used)),
              el("td", {class: "num"}, bytes(n.free_bytes)));
    return tr;
  }));
}

function drawFreshness(doc) {
  const banner = document.getElementById("banner");
  document.getElementById("master").textContent = `master ${doc.master}`;
  const age = doc.sampled_at ? ` (${seconds(Math.max(0, doc.now - doc.sampled_at))} ago)` : "";
  document.getElementById("freshness").textContent =
    doc.sampled_at ? `sampled ${clock(doc.sampled_at)}${age}` : "no sample yet";
  document.body.classList.toggle("stale", !doc.reachable);
  banner.hidden = doc.reachable || !doc.sampled_at;
  if (!banner.hidden) {
    const shown = doc.answered_at
      ? `figures below are from ${clock(doc.answered_at)}, the last sample it answered`
      : "it has not answered since the dashboard started";
    banner.textContent = `The master is unreachable: ${doc.error} at ${clock(doc.sampled_at)}; ${shown}.`;
  }
  document.getElementById("footer").textContent =
    `Refreshes every ${doc.interval_s} s; charts cover up to the last ${seconds(doc.history_s)}; ` +
    "rates are averaged over the last minute.";
}

async function refresh() {
  try {
    const reply = await fetch("/api/state", {cache: "no-store"});
    if (!reply.ok) throw new Error(`HTTP ${reply.status}`);
    const doc = await reply.json();
    pollMs = doc.interval_s * 1000;
    drawFreshness(doc);
    drawHealth(doc);
    drawQueues(doc);
    drawDead(doc);
    drawProgress(doc);
    drawSchedules(doc);
    drawNodes(doc);
  } catch (err) {
    const banner = document.getElementById("banner");
    banner.hidden = false;
    banner.textContent = `The dashboard itself does not answer (${err.message}); retrying.`;
    document.body.classList.add("stale");
  }
  setTimeout(refresh, pollMs);
}

refresh();
