// fusebox dashboard: plain JS, no build step. The admin token lives in this
// tab's session storage and travels only in the Authorization header.
"use strict";

const REFRESH_MS = 2000;
const $ = (sel, root = document) => root.querySelector(sel);

function token() { return sessionStorage.getItem("fusebox-token") || ""; }

async function api(method, path, body) {
  // No token: a loopback admin listener without one serves the API as is.
  const headers = token() ? { "Authorization": "Bearer " + token() } : {};
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch("/admin/v1" + path, init);
  let data = null;
  try { data = await resp.json(); } catch (e) { /* empty body */ }
  if (!resp.ok) {
    const err = new Error((data && data.error) || resp.statusText);
    err.status = resp.status;
    throw err;
  }
  return data;
}

function fmtTime(sec) {
  if (sec == null) return "—";
  return new Date(sec * 1000).toLocaleTimeString();
}

function recovery(row, now) {
  if (row.forced && row.open_until == null && row.state === "open") return "forced open (until closed by hand)";
  const parts = [];
  if (row.state === "open" && row.open_until != null) {
    parts.push("open for " + Math.max(0, Math.ceil(row.open_until - now)) + " s more");
  }
  if (row.blocked_until != null && row.blocked_until > now) {
    parts.push("blocked for " + Math.ceil(row.blocked_until - now) + " s (Retry-After)");
  }
  if (row.saturated && row.saturated_until != null && row.saturated_until > now) {
    parts.push("saturated for " + Math.ceil(row.saturated_until - now) + " s (quota headroom below the floor)");
  }
  if (row.state === "half_open") parts.push("probing");
  const rs = row.replica_scope;
  if (rs && rs.state === "open" && rs.open_until != null) {
    parts.push("open on replica " + rs.replica + " for " + Math.max(0, Math.ceil(rs.open_until - now)) + " s more");
  } else if (rs && rs.state === "half_open") {
    parts.push("probing on replica " + rs.replica);
  }
  return parts.join("; ") || "—";
}

// wouldSkip holds "gateway|route" of shadow breakers that are not closed:
// they take traffic as usual, so they are drawn apart from real ejections
// (R-API7), never as a red "open".
let wouldSkip = new Set();

function stateCell(row, now, shadowKey) {
  const td = document.createElement("td");
  const blocked = row.blocked_until != null && row.blocked_until > now;
  td.dataset.state = row.state;
  if (shadowKey && wouldSkip.has(shadowKey)) {
    td.className = "state state-would";
    td.textContent = "would skip (shadow: " + row.state + ")";
    return td;
  }
  if (row.state === "closed" && row.ramp_percent != null && !blocked) {
    // On its recovery ramp (R-D8): closed, earning its traffic back.
    td.className = "state state-ramp";
    td.dataset.ramp = String(row.ramp_percent);
    td.textContent = `closed (ramping: ${Math.round(row.ramp_percent)} % of its traffic)`;
    return td;
  }
  const rs = row.replica_scope;
  if (row.state === "closed" && rs && rs.state !== "closed" && !blocked) {
    // This replica alone holds it open (R-FD3): its Envoy got no answer
    // from the provider; the fleet still routes to it.
    td.className = "state state-replica";
    td.dataset.replicaScope = rs.state;
    td.textContent = `closed for the fleet; ${rs.state} on replica ${rs.replica} (its egress: no answer, reason ${rs.reason || "—"})`;
    return td;
  }
  const saturated = row.saturated && row.saturated_until != null && row.saturated_until > now;
  if (row.state === "closed" && saturated && !blocked) {
    // Healthy, but its provider announced less quota than the headroom
    // floor (R-H2): passed over until the reset.
    td.className = "state state-saturated";
    td.textContent = "closed (saturated: quota headroom low)";
    return td;
  }
  const key = row.state === "closed" && blocked ? "blocked" : row.state;
  td.className = "state state-" + key;
  td.textContent = row.state + (row.forced ? " (forced)" : "") + (blocked && row.state === "closed" ? " (blocked)" : "");
  return td;
}

const degradationText = {
  "": "routing as usual",
  skipping: "skipping unhealthy routes",
  try_all: "every route unhealthy: try_all (sending to unhealthy routes)",
  fail_fast: "every route unhealthy: fail_fast (answering 503)",
  fail_fast_forced: "answering 503: the routes left are forced open, and forced routes are left out of try_all — force-close one to route again",
  floor: "capacity floor (max_ejection_percent) keeps unhealthy routes in",
  saturated: "passing over routes whose quota is nearly gone (headroom)",
};

function renderSummary(rows) {
  $("#summary-section").hidden = rows.length === 0;
  const tbody = $("#summary tbody");
  tbody.replaceChildren();
  wouldSkip = new Set();
  const unhealthyGateways = new Set();
  for (const r of rows) {
    for (const k of r.would_skip) wouldSkip.add(r.gateway + "|" + k);
    if (r.unhealthy.length > 0) unhealthyGateways.add(r.gateway);
    const tr = document.createElement("tr");
    tr.dataset.gateway = r.gateway;
    tr.dataset.model = r.model;
    tr.className = r.unhealthy.length > 0 ? "degraded" : "";
    const degr = cell(degradationText[r.degradation] || r.degradation);
    degr.dataset.degradation = r.degradation;
    tr.append(cell(r.gateway), cell(r.model), cell(`${r.healthy} / ${r.total}`), degr,
      cell(r.unhealthy.map(k => (r.replica_scoped || []).includes(k) ? k + " (this replica only)" : k).join(", ") || "—"),
      cell(r.would_skip.join(", ") || "—"));
    tbody.appendChild(tr);
  }
  return unhealthyGateways;
}

function renderTimeline(entries) {
  $("#timeline-section").hidden = entries.length === 0;
  const ol = $("#timeline");
  ol.replaceChildren();
  for (const e of entries) {
    const li = document.createElement("li");
    li.dataset.route = e.route;
    li.dataset.transition = e.transition;
    const who = e.scope === "global" ? `fleet ${e.route}` :
      e.scope === "replica" ? `${e.gateway} / ${e.route} on this replica alone` : `${e.gateway} / ${e.route}`;
    li.dataset.scope = e.scope;
    const evidence = `reason ${e.reason}${e.origin ? ` (${e.origin})` : ""}; window ${e.window_calls} calls, ${e.window_failures} failures` +
      (e.threshold ? ` (threshold ${e.threshold})` : "") + `; policy ${e.policy_version || "—"}`;
    let next = "next request: not yet";
    if (e.next) {
      next = `next request: model ${e.next.model} → ` + (e.next.route ? `${e.next.route} (${e.next.action})` : e.next.action);
    }
    li.textContent = `${fmtTime(e.at)} ${who}: ${e.transition} — ${evidence} — ${next}` + (e.replica ? ` — replica ${e.replica}` : "");
    ol.appendChild(li);
  }
}

function sparkline(history) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  const w = 4, h = 24;
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", String(history.length * w));
  svg.setAttribute("height", String(h));
  const max = Math.max(1, ...history.map(p => p.success + p.failure + p.neither));
  const title = document.createElementNS(ns, "title");
  const tot = history.reduce((a, p) => [a[0] + p.success, a[1] + p.failure, a[2] + p.neither], [0, 0, 0]);
  title.textContent = `last 5 min: ${tot[0]} success, ${tot[1]} failure, ${tot[2]} neither`;
  svg.appendChild(title);
  history.forEach((p, i) => {
    let y = h;
    for (const cls of ["success", "failure", "neither"]) {
      const bh = Math.round((p[cls] / max) * h);
      if (bh === 0) continue;
      y -= bh;
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("x", String(i * w)); r.setAttribute("y", String(y));
      r.setAttribute("width", String(w - 1)); r.setAttribute("height", String(bh));
      r.setAttribute("class", cls);
      svg.appendChild(r);
    }
  });
  return svg;
}

// chart draws one route's last 15 minutes (GET .../timeline): the state
// bands behind, the requests per period as stacked bars, a time axis in
// minutes before the server's now.
function chart(tl, rt) {
  const ns = "http://www.w3.org/2000/svg";
  const el = (name, attrs) => {
    const e = document.createElementNS(ns, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    return e;
  };
  const W = 540, H = 64, axis = 16, span = tl.now - tl.from;
  const x = t => Math.max(0, Math.min(W, ((t - tl.from) / span) * W));
  const svg = el("svg", { class: "chart", width: W, height: H + axis, viewBox: `0 0 ${W} ${H + axis}`, role: "img" });
  svg.dataset.route = rt.route;
  const tot = rt.points.reduce((a, p) => [a[0] + p.success, a[1] + p.failure, a[2] + p.neither], [0, 0, 0]);
  const title = el("title", {});
  title.textContent = `${rt.route}, last 15 min: ${tot[0]} success, ${tot[1]} failure, ${tot[2]} neither; ` +
    rt.bands.filter(b => b.state !== "closed").map(b => `${b.state} from ${fmtTime(b.from)} to ${fmtTime(b.to)}`).join(", ");
  svg.appendChild(title);
  for (const b of rt.bands) {
    const r = el("rect", { x: x(b.from), y: 0, width: Math.max(1, x(b.to) - x(b.from)), height: H, class: `band band-${b.state}` });
    r.dataset.state = b.state;
    svg.appendChild(r);
  }
  const max = Math.max(1, ...rt.points.map(p => p.success + p.failure + p.neither));
  const bw = W / rt.points.length;
  rt.points.forEach(p => {
    let y = H;
    for (const cls of ["success", "neither", "failure"]) {
      const bh = (p[cls] / max) * (H - 4);
      if (bh <= 0) continue;
      y -= bh;
      svg.appendChild(el("rect", { x: x(p.at), y, width: Math.max(1, bw - 1), height: bh, class: `bar ${cls}` }));
    }
  });
  svg.appendChild(el("line", { x1: 0, y1: H, x2: W, y2: H, class: "axis" }));
  for (const m of [15, 10, 5, 0]) {
    const tx = x(tl.now - m * 60);
    svg.appendChild(el("line", { x1: tx, y1: H, x2: tx, y2: H + 4, class: "axis" }));
    const label = el("text", { x: Math.min(W - 2, Math.max(2, tx)), y: H + axis - 2, class: "tick", "text-anchor": m === 15 ? "start" : m === 0 ? "end" : "middle" });
    label.textContent = m === 0 ? "now" : `-${m} min`;
    svg.appendChild(label);
  }
  const fig = document.createElement("figure");
  fig.className = "route-chart";
  fig.dataset.route = rt.route;
  const cap = document.createElement("figcaption");
  cap.textContent = `${rt.route} — ${rt.state}; ${tot[0] + tot[1] + tot[2]} requests, ${tot[1]} failures`;
  fig.append(cap, svg);
  return fig;
}

function renderCharts(card, tl) {
  $(".chart-source", card).textContent = tl.source === "fleet" ? "from the whole fleet's transitions" : "from this replica's transitions";
  $(".charts", card).replaceChildren(...tl.routes.map(rt => chart(tl, rt)));
}

function cell(text) { const td = document.createElement("td"); td.textContent = text; return td; }

function renderRoutes(card, gw, rows) {
  const now = Date.now() / 1000;
  const tbody = $("table.routes tbody", card);
  tbody.replaceChildren();
  for (const row of rows) {
    const tr = document.createElement("tr");
    tr.dataset.route = row.route;
    tr.append(cell(row.route), stateCell(row, now, gw + "|" + row.route), cell(row.reason || "—"),
      cell(row.failures + " / " + row.failure_threshold), cell(fmtTime(row.opened_at)),
      cell(recovery(row, now)), cell(String(row.probes_in_flight)), cell(String(row.generation)));
    const spark = document.createElement("td");
    spark.appendChild(sparkline(row.history || []));
    tr.appendChild(spark);
    const actions = document.createElement("td");
    actions.className = "actions";
    for (const action of ["force-open", "force-close", "reset"]) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = action;
      b.dataset.action = action;
      b.addEventListener("click", async () => {
        if (!confirm(`${action} ${row.route} in gateway ${gw}?`)) return;
        try {
          await api("POST", `/gateways/${encodeURIComponent(gw)}/routes/${encodeURIComponent(row.route)}/${action}`, {});
          refresh();
        } catch (e) { showMessage(`${action} ${row.route}: ${e.message}`); }
      });
      actions.appendChild(b);
    }
    tr.appendChild(actions);
    tbody.appendChild(tr);
  }
}

function showMessage(text) { $("#message").textContent = text; }

// fillEditor shows the gateway's own settings, with the value in force as
// the placeholder of what it leaves unset, unless the operator is editing.
function fillEditor(card, doc) {
  const form = $("form.editor", card);
  if (form.dataset.dirty === "1") return;
  const own = doc.circuit_breaker || {};
  const eff = (doc.effective && doc.effective.circuit_breaker) || {};
  form.elements.enabled.checked = own.enabled != null ? own.enabled === true : eff.enabled === true;
  for (const f of ["failure_threshold", "window_sec", "cooldown_ms"]) {
    form.elements[f].value = own[f] != null ? own[f] : "";
    form.elements[f].placeholder = eff[f] != null ? eff[f] + " (inherited)" : "inherited";
  }
  for (const el of form.elements) delete el.dataset.changed;
}

function fieldOf(message) {
  const m = /circuit_breaker\.([a-z_]+)/.exec(message);
  return m ? m[1] : null;
}

async function save(card, gw) {
  const form = $("form.editor", card);
  for (const e of form.querySelectorAll(".error")) e.textContent = "";
  // Only what the operator changed is sent: an untouched field keeps what
  // the gateway says (or inherits).
  const cb = {};
  if (form.elements.enabled.dataset.changed) cb.enabled = form.elements.enabled.checked;
  for (const f of ["failure_threshold", "window_sec", "cooldown_ms"]) {
    if (!form.elements[f].dataset.changed) continue;
    const v = form.elements[f].value.trim();
    // Empty: back to the inherited value (merge patch null). Anything else
    // is sent as typed, so the API's validation is the one that speaks.
    cb[f] = v === "" ? null : (/^-?\d+(\.\d+)?$/.test(v) ? Number(v) : v);
  }
  const status = $(".save-status", card);
  const editsAtStart = form.dataset.edits;
  status.textContent = "saving…";
  try {
    const doc = await api("PATCH", "/gateways/" + encodeURIComponent(gw), { circuit_breaker: cb });
    status.textContent = "saved";
    // A refresh already in flight read the document before this change;
    // bumping saves makes it leave the editor alone, and the editor shows
    // the API's answer, which is the new effective document.
    // If the operator typed again while the PATCH was in flight, their new
    // edits stay in the form (still dirty) instead of being overwritten.
    saves++;
    if (form.dataset.edits === editsAtStart) {
      form.dataset.dirty = "0";
      fillEditor(card, doc);
    }
    refresh();
  } catch (e) {
    status.textContent = "not saved";
    const f = fieldOf(e.message);
    const slot = f && $(`.error[data-for="${f}"]`, card);
    if (slot) slot.textContent = e.message; else showMessage(e.message);
  }
}

const cards = new Map();

function cardFor(gw) {
  if (cards.has(gw)) return cards.get(gw);
  const card = $("#gateway-card").content.firstElementChild.cloneNode(true);
  card.dataset.gateway = gw;
  $(".gateway-name", card).textContent = "Gateway " + gw;
  const form = $("form.editor", card);
  form.addEventListener("input", ev => {
    form.dataset.dirty = "1";
    form.dataset.edits = String(Number(form.dataset.edits || 0) + 1);
    ev.target.dataset.changed = "1";
  });
  form.addEventListener("submit", ev => { ev.preventDefault(); save(card, gw); });
  $("details", card).addEventListener("toggle", () => refresh());
  $("#gateways").appendChild(card);
  cards.set(gw, card);
  return card;
}

let busy = false;
let saves = 0;
// expanded: gateways whose card was opened because a route went unhealthy
// (once: the operator may close it again).
const expanded = new Set();

async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const seen = saves;
    const unhealthy = renderSummary(await api("GET", "/summary"));
    renderTimeline(await api("GET", "/transitions?limit=20"));
    const gateways = await api("GET", "/gateways");
    showMessage("");
    for (const doc of gateways) {
      const card = cardFor(doc.id);
      if (seen === saves) fillEditor(card, doc);
      if (unhealthy.has(doc.id) && !expanded.has(doc.id)) {
        expanded.add(doc.id);
        $("details", card).open = true;
      }
      if (!unhealthy.has(doc.id)) expanded.delete(doc.id);
      if ($("details", card).open) {
        renderRoutes(card, doc.id, await api("GET", `/gateways/${encodeURIComponent(doc.id)}/routes`));
        renderCharts(card, await api("GET", `/gateways/${encodeURIComponent(doc.id)}/timeline`));
      }
    }
    const fleets = await api("GET", "/fleets");
    const names = Object.keys(fleets);
    $("#fleets-section").hidden = names.length === 0;
    const tbody = $("#fleets tbody");
    tbody.replaceChildren();
    const now = Date.now() / 1000;
    for (const name of names) {
      const row = fleets[name];
      const tr = document.createElement("tr");
      tr.dataset.fleet = name;
      tr.append(cell(name), stateCell(row, now), cell(row.reason || "—"), cell(String(row.failures)),
        cell(fmtTime(row.opened_at)), cell(recovery(row, now)), cell(String(row.probes_in_flight)), cell(String(row.generation)));
      tbody.appendChild(tr);
    }
    $("#token-status").textContent = "connected";
  } catch (e) {
    if (e.status === 401 || e.status === 403) $("#token-status").textContent = token() ? "token refused" : "token needed";
    else showMessage(e.message);
  } finally {
    busy = false;
  }
}

$("#token-form").addEventListener("submit", ev => {
  ev.preventDefault();
  sessionStorage.setItem("fusebox-token", $("#token").value.trim());
  $("#token").value = "";
  refresh();
});

setInterval(refresh, REFRESH_MS);
refresh();
