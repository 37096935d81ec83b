// Ticketing admin page: polls the admin listener's JSON and draws it. Plain JavaScript, no
// build step; every value from the server is inserted as text, never as HTML.
"use strict";

const POINTS = 120; // two minutes at one sample a second
const series = { ops: [], p50: [], p99: [] };
let prev = null;

const $ = (id) => document.getElementById(id);

async function getJSON(path, opts) {
  const r = await fetch(path, Object.assign({ cache: "no-store" }, opts || {}));
  if (!r.ok) {
    const text = (await r.text()).trim();
    throw new Error(path + ": " + r.status + (text ? " " + text : ""));
  }
  return r.json();
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return ms + " ms";
  if (ms < 120000) return (ms / 1000).toFixed(1) + " s";
  return Math.round(ms / 60000) + " min";
}

function fmtRate(x) {
  if (!isFinite(x)) return "–";
  if (x >= 1e6) return (x / 1e6).toFixed(2) + "M";
  if (x >= 1e4) return (x / 1e3).toFixed(1) + "k";
  return x.toFixed(x < 10 ? 1 : 0);
}

function showError(err) {
  const e = $("error");
  if (err) { e.textContent = String(err.message || err); e.hidden = false; } else { e.hidden = true; }
}

// quantile of the observations between two cumulative histograms (upper bucket bound, linear
// inside the bucket), in ms; null when there were none.
function quantile(q, bounds, before, after) {
  const counts = after.map((c, i) => c - (before ? before[i] : 0));
  const total = counts.length ? counts[counts.length - 1] : 0;
  // observations above the last bound are in count but not in any bucket
  if (total <= 0) return null;
  const want = q * total;
  let lo = 0, below = 0;
  for (let i = 0; i < bounds.length; i++) {
    if (counts[i] >= want) {
      const inBucket = counts[i] - below;
      const f = inBucket > 0 ? (want - below) / inBucket : 1;
      return (lo + f * (bounds[i] - lo)) * 1000;
    }
    lo = bounds[i]; below = counts[i];
  }
  return bounds[bounds.length - 1] * 1000;
}

function push(arr, v) { arr.push(v); if (arr.length > POINTS) arr.shift(); }

function drawChart(canvas, lines) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 28;
  ctx.clearRect(0, 0, w, h);
  let max = 0;
  for (const l of lines) for (const v of l.data) if (v !== null && v > max) max = v;
  max = max > 0 ? max * 1.15 : 1;
  ctx.strokeStyle = "#dde2e8"; ctx.fillStyle = "#6b7482"; ctx.font = "10px sans-serif";
  for (let i = 0; i <= 3; i++) {
    const y = pad / 2 + (h - pad) * i / 3;
    ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText(fmtRate(max * (1 - i / 3)), 0, y + 3);
  }
  for (const l of lines) {
    ctx.strokeStyle = l.color; ctx.lineWidth = 1.5; ctx.beginPath();
    let started = false;
    l.data.forEach((v, i) => {
      if (v === null) { started = false; return; }
      const x = pad + (w - pad) * (i + POINTS - l.data.length) / (POINTS - 1);
      const y = pad / 2 + (h - pad) * (1 - v / max);
      if (started) ctx.lineTo(x, y); else { ctx.moveTo(x, y); started = true; }
    });
    ctx.stroke();
  }
}

// A follower (or a candidate) serves no clients: its page says so, names the leader (with a link
// to the leader's admin page when the node can tell where it is), and charts what a follower has
// of the cluster's traffic, the grants it applies from the leader's log, instead of its own
// operations (0: clients are answered by the leader).
let follower = false;

function showRole(st) {
  const was = follower;
  follower = st.role !== "single" && !st.serving;
  const b = $("role-banner");
  b.hidden = !follower;
  if (follower) {
    const leader = st.leader ? "the leader " + st.leader + (st.leader_addr ? " (client address " + st.leader_addr + ")" : "") : "no leader known now";
    b.replaceChildren(el("strong", {}, "This node" + (st.node ? " (" + st.node + ")" : "") + " is a " + st.role + "."),
      " Clients are served by " + leader + ". ");
    if (st.leader_admin) {
      b.append("Its admin page: ", el("a", { id: "leader-link", href: location.protocol + "//" + st.leader_admin + "/" }, st.leader_admin), ". ");
    }
    b.append("Grants, waits, locks and keys here are the cluster's (applied from the replicated log); " +
      "operations/s and connections are this node's own; held locks show \"via leader\" for sessions connected there.");
  }
  $("label-ops").textContent = follower ? "operations/s here (clients use the leader)" : "operations/s";
  $("caption-ops").textContent = follower ? "Grants applied from the leader's log (grants/s, last 2 minutes)" : "Throughput (operations/s, last 2 minutes)";
  if (was !== follower) series.ops.length = 0; // another quantity from now on
}

async function pollStats() {
  const st = await getJSON("api/stats");
  $("node").textContent = location.host + (st.node ? " · " + st.node : "") + " · " + st.role + " · last token " + st.last_token;
  showRole(st);
  $("held-now").textContent = st.held_now;
  $("waiters-now").textContent = st.waiters_now;
  $("conns-now").textContent = st.connections;
  $("expiries").textContent = st.expired + " / " + st.timeouts;
  $("metrics-off").hidden = st.metrics;
  if (prev) {
    const dt = Math.max((st.time_ms - prev.time_ms) / 1000, 0.001);
    const ops = (st.operations - prev.operations) / dt;
    $("rate-ops").textContent = fmtRate(ops);
    $("rate-grants").textContent = fmtRate((st.grants - prev.grants) / dt);
    $("rate-handoffs").textContent = fmtRate((st.handoffs - prev.handoffs) / dt);
    const p50 = quantile(0.5, st.wait.bounds, prev.wait.counts, st.wait.counts);
    const p99 = quantile(0.99, st.wait.bounds, prev.wait.counts, st.wait.counts);
    $("wait-pct").textContent = p50 === null ? "no hand-offs" : fmtMs(Math.round(p50)) + " / " + fmtMs(Math.round(p99));
    push(series.ops, follower ? (st.grants - prev.grants) / dt : ops); push(series.p50, p50); push(series.p99, p99);
    drawChart($("chart-ops"), [{ data: series.ops, color: "#2c6bd6" }]);
    drawChart($("chart-wait"), [{ data: series.p50, color: "#2c6bd6" }, { data: series.p99, color: "#d98a1f" }]);
  }
  prev = st;
}

function keyCell(key) {
  return el("td", { class: "key", title: "inspect", onclick: () => { $("key-input").value = key; inspectKey(key); } }, key);
}

function fillTable(id, rows, cols, empty) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren();
  if (!rows.length) {
    body.append(el("tr", {}, el("td", { class: "empty", colspan: String(cols) }, empty)));
    return;
  }
  for (const r of rows) body.append(r);
}

// queuedCell shows the sketch's count: exact, or "~N" (an estimate: a key that replaced another
// in the sketch inherits its count as an error bound), never "N ±E" as if N were counted.
function queuedCell(k) {
  if (!k.error) return el("td", {}, k.queued);
  return el("td", { class: "estimate", title: "estimate: between " + k.queued_min + " and " + k.queued }, "~" + k.queued);
}

async function pollTop() {
  const t = await getJSON("api/top?n=15");
  fillTable("top-table", t.keys.map((k) => el("tr", { "data-key": k.key }, keyCell(k.key),
    queuedCell(k), el("td", {}, k.handoffs),
    el("td", {}, k.handoffs ? fmtMs(Math.round(k.mean_wait_s * 1000)) : "–"), el("td", {}, k.timeouts),
    el("td", {}, k.held ? "yes" : "no"), el("td", {}, k.waiters))), 7,
    t.metrics ? (t.uncertain ? "no key with a count worth showing" : "no contention yet") : "metrics off");
  const note = $("top-note");
  note.hidden = !t.uncertain;
  note.textContent = t.uncertain ? t.uncertain + " more keys queued too few times to count (their counts would be mostly estimate); ~N is an estimate." : "";
}

// remoteOf says where a session is connected: its address when this node holds the
// connection, "via leader" on a follower (sessions connect to the leader), else detached.
function remoteOf(p) {
  if (p.remote) return p.remote;
  if (p.attached) return follower ? "via leader" : "connected";
  return "detached" + (p.grace_left_ms ? " (" + fmtMs(p.grace_left_ms) + " left)" : "");
}

async function pollLocks() {
  const l = await getJSON("api/locks?limit=50");
  $("locks-summary").textContent = l.held + " held, " + l.waiters + " waiting, " + l.keys + " keys";
  fillTable("locks-table", l.locks.map((k) => el("tr", { "data-key": k.key }, keyCell(k.key),
    el("td", {}, k.held ? k.token : "–"), el("td", {}, k.held ? fmtMs(k.lease_left_ms) : "–"),
    el("td", {}, k.held ? fmtMs(k.held_for_ms) : "–"),
    el("td", {}, k.holder ? k.holder.session + " #" + k.holder.session_no : (k.lock_delay_left_ms ? "lock-delay" : "–")),
    el("td", {}, k.holder ? remoteOf(k.holder) : ""), el("td", { class: "waiting" }, k.waiter_count))), 7, "no locks");
}

async function inspectKey(key) {
  const d = $("key-detail");
  try {
    const k = await getJSON("api/key?key=" + encodeURIComponent(key));
    d.replaceChildren();
    if (!k.present) { d.append(el("p", { class: "muted" }, key + ": free, nobody waits")); return; }
    const dl = el("dl", {});
    const row = (a, b) => dl.append(el("dt", {}, a), el("dd", {}, b));
    row("key", k.key);
    if (k.held) {
      row("token", k.token);
      row("lease left", fmtMs(k.lease_left_ms));
      row("held for", fmtMs(k.held_for_ms));
      row("holder", k.holder.session + " #" + k.holder.session_no + " request " + k.holder.request_id +
        (k.holder.remote ? " from " + k.holder.remote : " (" + remoteOf(k.holder) + ")"));
    } else {
      row("held", k.lock_delay_left_ms ? "no (lock-delay " + fmtMs(k.lock_delay_left_ms) + ")" : "no");
    }
    if (k.stalled) row("stalled", "waiting for storage");
    row("waiting", k.waiter_count);
    d.append(dl);
    const t = el("table", { id: "waiters-table" }, el("thead", {}, el("tr", {}, el("th", {}, "#"), el("th", {}, "session"),
      el("th", {}, "remote"), el("th", {}, "waited"), el("th", {}, "wait left"), el("th", {}, "lease"))));
    const body = el("tbody", {});
    for (const w of k.waiters) {
      body.append(el("tr", {}, el("td", {}, w.position), el("td", {}, w.session + " #" + w.session_no),
        el("td", {}, remoteOf(w)), el("td", {}, fmtMs(w.waited_ms)),
        el("td", {}, w.wait_left_ms === null ? "no limit" : fmtMs(w.wait_left_ms)), el("td", {}, fmtMs(w.lease_ms))));
    }
    t.append(body);
    if (k.waiters.length) d.append(t);
  } catch (err) {
    d.replaceChildren(el("p", { class: "error" }, String(err.message || err)));
  }
}

// portField: the number typed, or undefined (left out: the server's default) when empty; 0
// goes as 0, which the server refuses.
function portField(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

function genRequest() {
  const n = Number($("gen-nodes").value);
  return {
    nodes: n,
    hosts: $("gen-hosts").value.split(",").map((s) => s.trim()).filter(Boolean),
    port: portField("gen-port"),
    raft_port: portField("gen-raft-port"),
    data_dir: $("gen-data-dir").value.trim(),
    auth: $("gen-auth").checked,
    tls_cert: $("gen-tls-cert").value.trim(),
    tls_key: $("gen-tls-key").value.trim(),
    min_lease: $("gen-min-lease").value.trim(),
    max_lease: $("gen-max-lease").value.trim(),
  };
}

const KINDS = [["env", "Environment"], ["command", "Command line"], ["container", "Container"],
  ["compose", "docker-compose.yml"], ["systemd", "systemd unit"]];

async function generate(ev) {
  ev.preventDefault();
  const out = $("gen-output"), errBox = $("gen-error");
  errBox.hidden = true;
  try {
    const plan = await getJSON("api/deploy", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(genRequest()) });
    out.replaceChildren();
    if (plan.files && plan.files.length) {
      out.append(el("h3", {}, "Files to create first"));
      for (const f of plan.files) {
        out.append(el("p", {}, f.path + " (mode " + f.mode + ", " + f.about + "):"), el("pre", { class: "gen-file", "data-path": f.path }, f.content));
      }
    }
    // One block per node (the first open); in each, one output at a time, chosen by tabs.
    for (const [i, node] of plan.nodes.entries()) {
      const box = el("details", i === 0 ? { open: "" } : {}, el("summary", {}, node.name + (node.host ? " (" + node.host + ")" : "")));
      const tabs = el("div", { class: "tabs" });
      const pres = KINDS.map(([kind]) => el("pre", { id: "gen-" + i + "-" + kind, "data-kind": kind }, node[kind]));
      const show = (k) => {
        pres.forEach((p, j) => { p.hidden = j !== k; });
        [...tabs.children].forEach((b, j) => b.classList.toggle("on", j === k));
      };
      KINDS.forEach(([kind, title], k) => tabs.append(el("button", { type: "button", "data-kind": kind, onclick: () => show(k) }, title)));
      box.append(tabs, ...pres);
      show(1); // the command line
      out.append(box);
    }
    for (const note of plan.notes || []) out.append(el("p", { class: "muted" }, note));
  } catch (err) {
    out.replaceChildren(); // the previous output does not stay under the error
    errBox.textContent = String(err.message || err);
    errBox.hidden = false;
  }
}

async function tick(fn) {
  try { await fn(); showError(null); } catch (err) { showError(err); }
}

$("key-form").addEventListener("submit", (ev) => { ev.preventDefault(); const k = $("key-input").value; if (k) inspectKey(k); });
$("gen-form").addEventListener("submit", generate);
tick(pollStats); tick(pollTop); tick(pollLocks);
setInterval(() => tick(pollStats), 1000);
setInterval(() => { tick(pollTop); tick(pollLocks); }, 2000);
