// The Miyamoto dashboard: reads the node's JSON API every 2 s and renders it.
//
// Every value from the API is put on the page as text (textContent, text nodes, SVG
// attributes of numbers): never as HTML. A task's last response body is a stranger's
// bytes. The page's Content-Security-Policy allows no inline script either.
// With api_tokens on, the token is kept in sessionStorage (this tab only) and sent as
// "Authorization: Bearer"; a 401 or 403 asks for it again.
"use strict";

const REFRESH_MS = 2000;
const CHART_SECONDS = 300;
const MIN_RATE_SECONDS = 1.5;
const TOKEN_KEY = "miyamoto.token";
const STATES = ["scheduled", "running", "succeeded", "failed", "cancelled", "expired"];
const RATES = ["enqueued", "delivered", "failed"];
const ID_RE = /^[A-Za-z0-9_.:-]{1,128}$/;
const FAILED_LIMIT = 50;
const BODY_CHARS = 500;
const BROWSE_LIMIT = 50;
const RANGES = {300: "last 5 minutes", 3600: "last hour"};

const ui = {
  auto: true,          // auto-refresh on
  timer: null,
  busy: false,
  again: false,        // a refresh was asked for while one ran: run another after it
  ask: null,           // 401: no data without a token (refresh stops); 403: a wider one is needed
  base: null,          // {t, totals: {queue: {enqueued, delivered, failed}}}: rates count from it
  queueRates: {},      // queue -> {enqueued, delivered, failed} per second, the latest
  rates: [],           // [{t, enqueued, delivered, failed}] sampled: the chart without /rates
  series: null,        // GET /rates: the server's per-second history, summed over the nodes
  range: 300,          // the chart's seconds (5 min or 1 h)
  chartNode: "",       // the chart's node ("": the cluster's sum)
  targets: {},         // origin -> its breaker (GET /targets), for the task view
  detailId: null,      // the task shown in the lookup panel, refreshed with the rest
  browse: {filter: null, cursors: [], next: null},  // the task list's query and pages
};

class AuthError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// ------------------------------------------------------------------ DOM helpers

function $(id) {
  return document.getElementById(id);
}

// el("td", {class: "num"}, "text", childNode, ...): children that are not nodes become text
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function show(id, visible) {
  $(id).hidden = !visible;
}

function say(text, ok) {
  const m = $("message");
  m.textContent = text || "";
  m.className = ok ? "ok" : "";
  m.hidden = !text;
}

// ------------------------------------------------------------------ formatting

function num(v) {
  return typeof v === "number" && isFinite(v) ? v : null;
}

function when(t) {
  t = num(t);
  if (t === null) return "-";
  const d = new Date(t * 1000);
  const delta = t - Date.now() / 1000;
  const rel = Math.abs(delta) < 1 ? "now" : delta > 0 ? `in ${ago(delta)}` : `${ago(-delta)} ago`;
  // local time; the date too unless it is today
  const today = d.toDateString() === new Date(Date.now()).toDateString();
  return `${today ? d.toLocaleTimeString() : d.toLocaleString()} (${rel})`;
}

function ago(seconds) {
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function lastHeard(member, me) {
  if (member.id === me) return "this node";
  const s = num(member.last_heard);
  if (s === null) return "-";  // not heard from (a follower hears only from the leader)
  return s < 60 ? `${s.toFixed(1)} s ago` : `${s.toFixed(0)} s ago`;
}

function seconds(v) {
  v = num(v);
  if (v === null) return "-";
  return v < 1 ? `${(v * 1000).toFixed(v < 0.01 ? 1 : 0)} ms` : v < 120 ? `${v.toFixed(1)} s` : ago(v);
}

// scheme://host:port as the node names a target (delivery/fairness.origin)
function originOf(url) {
  try {
    const u = new URL(url);
    const port = u.port || (u.protocol === "https:" ? "443" : "80");
    return `${u.protocol}//${u.hostname.toLowerCase()}:${port}`;
  } catch (e) {
    return null;
  }
}

function rate(v) {
  return v === null || v === undefined ? "-" : v.toFixed(v >= 10 ? 0 : 2);
}

function clip(s, n) {
  s = String(s);
  return s.length > n ? `${s.slice(0, n)}… (${s.length} characters)` : s;
}

function responseText(last) {
  if (!last || typeof last !== "object") return "-";
  const head = last.status !== null && last.status !== undefined ? `HTTP ${last.status}` : "no answer";
  return last.error ? `${head}: ${last.error}` : head;
}

// ------------------------------------------------------------------ the API

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(method, path) {
  const headers = {Accept: "application/json"};
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const r = await fetch(path, {method, headers, cache: "no-store", credentials: "omit"});
  let body = null;
  try {
    body = await r.json();
  } catch (e) {
    body = null;
  }
  if (r.status === 401 || r.status === 403) {
    const why = body && typeof body.error === "string" ? body.error : r.statusText;
    throw new AuthError(r.status, why);
  }
  return {status: r.status, body};
}

function errorOf(res) {
  const b = res.body;
  return b && typeof b.error === "string" ? b.error : `HTTP ${res.status}`;
}

async function getJSON(path) {
  const res = await api("GET", path);
  if (res.status !== 200) throw new Error(`${path}: ${errorOf(res)}`);
  return res.body;
}

function askToken(err) {
  ui.ask = err.status;
  const had = !!token();
  let why;
  if (err.status === 401) {
    why = had ? `The token was refused (401: ${err.message}). Enter a valid one.`
      : `This node needs an API token (401: ${err.message}).`;
  } else {
    why = `This token may not do that (403: ${err.message}). Enter a token with the needed scope.`;
  }
  $("token-why").textContent = why;
  show("token-panel", true);
  if (err.status === 401) show("data", false);
  say(why);
  $("token-input").focus();
}

// ------------------------------------------------------------------ refresh

function schedule() {
  clearTimeout(ui.timer);
  ui.timer = ui.auto && ui.ask !== 401 ? setTimeout(refresh, REFRESH_MS) : null;
}

async function refresh() {
  if (ui.busy) {
    ui.again = true;
    return;
  }
  ui.busy = true;
  try {
    const [cluster, queues] = await Promise.all([getJSON("/cluster"), getJSON("/queues")]);
    if (ui.ask === 401) {  // the token given works: the form stays only for a 403
      ui.ask = null;
      show("token-panel", false);
    }
    show("data", true);
    show("forget-token", !!token());
    renderCluster(cluster);
    sample(queues.queues || []);
    renderQueues(queues.queues || []);
    await Promise.all([loadRates(), optional("/targets", renderTargets)]);
    renderChart();
    await Promise.all([renderFailed(queues.queues || []), optional("/schedules", renderSchedules),
      refreshDetail()]);
    $("refreshed").textContent = `refreshed ${new Date().toLocaleTimeString()}` +
      (ui.auto ? " (every 2 s)" : " (auto-refresh paused)");
    if ($("message").className !== "ok" && ui.ask === null) say("");
    if (ui.browse.filter === null) startBrowse(null);  // the first page, once the API answers
  } catch (err) {
    if (err instanceof AuthError) askToken(err);
    else say(`Could not refresh: ${err.message}`);
  } finally {
    ui.busy = false;
    if (ui.again) {
      ui.again = false;
      setTimeout(refresh, 0);
    } else schedule();
  }
}

// a panel whose route another version of the node may not have: shown on 200 only
async function optional(path, render) {
  const panel = path === "/targets" ? "targets-panel" : "schedules-panel";
  const res = await api("GET", path);
  if (res.status !== 200 || !res.body) {
    show(panel, false);
    return;
  }
  render(res.body);
  show(panel, true);
}

// ------------------------------------------------------------------ cluster

function renderCluster(info) {
  $("node-title").textContent = `node ${info.node}`;
  document.title = `Miyamoto ${info.node}`;
  $("cluster-summary").textContent =
    `this node ${info.node} is ${info.role}; leader ${info.leader ?? "none"}, term ${info.term}` +
    (info.version !== undefined ? `, roster version ${info.version}` : "");
  const rows = (info.members || []).map((m) => {
    const role = m.id === info.node ? info.role : m.leader ? "leader" : "follower";
    const offset = num(m.clock_offset);
    return el("tr", {"data-member": m.id},
      el("td", {}, m.id), el("td", {}, m.http), el("td", {}, m.zone ?? "-"),
      el("td", {}, role), el("td", {class: "last-heard"}, lastHeard(m, info.node)),
      el("td", {class: "num"}, offset === null ? "-" : `${(offset * 1000).toFixed(1)} ms` +
        (m.clock_skewed ? " (skewed)" : "")));
  });
  const down = (info.down || []).map((d) => el("tr", {"data-member": d.id, class: "member-down"},
    el("td", {}, d.id), el("td", {}, d.http), el("td", {}, d.zone ?? "-"),
    el("td", {class: "down"}, `down since ${when(d.down_since)}`),
    el("td", {class: "last-heard"}, num(d.last_heard) === null ? "never heard by this node"
      : `${ago(d.last_heard)} ago`),
    el("td", {}, "-")));
  $("cluster-table").tBodies[0].replaceChildren(...rows, ...down);
  const pick = $("chart-node");
  const ids = (info.members || []).map((m) => m.id);
  if (pick.options.length !== ids.length + 1 || ids.some((id, i) => pick.options[i + 1].value !== id)) {
    pick.replaceChildren(el("option", {value: ""}, "all, summed"),
      ...ids.map((id) => el("option", {value: id}, id)));
    pick.value = ids.includes(ui.chartNode) ? ui.chartNode : "";
  }
}

// ------------------------------------------------------------------ queues and rates

// Rates are differences of the queues' totals over at least MIN_RATE_SECONDS: a refresh
// right after another (a button's) would divide a burst by a few milliseconds.
function sample(queues) {
  const now = Date.now() / 1000;
  const totals = {};
  for (const q of queues) totals[q.name] = q.totals || {};
  const base = ui.base;
  if (base && now - base.t < MIN_RATE_SECONDS) return;
  ui.base = {t: now, totals};
  if (!base) return;
  const dt = now - base.t;
  const all = {t: now};
  for (const k of RATES) all[k] = 0;
  ui.queueRates = {};
  for (const q of queues) {
    const before = base.totals[q.name];
    if (!before) continue;
    const r = {};
    // a node that restarted counts from 0 again: never a negative rate
    for (const k of RATES) r[k] = Math.max(0, ((totals[q.name][k] || 0) - (before[k] || 0)) / dt);
    ui.queueRates[q.name] = r;
    for (const k of RATES) all[k] += r[k];
  }
  ui.rates.push(all);
  while (ui.rates.length && ui.rates[0].t < now - CHART_SECONDS) ui.rates.shift();
}

function queueRates(name) {
  return ui.queueRates[name] || null;
}

function renderQueues(queues) {
  const rows = queues.map((q) => {
    const counts = q.counts || {};  // tasks, each once; q.copies counts every replica
    const copies = q.copies || {};
    const r = queueRates(q.name);
    return el("tr", {"data-queue": q.name},
      el("td", {}, q.name),
      el("td", {class: q.paused ? "paused" : "running"}, q.paused ? "paused" : "running",
        // a pull queue's workers lease its tasks: its running ones are their leases
        q.mode === "pull" ? el("div", {class: "mode-pull", title: "mode pull: workers lease "
          + "its tasks (POST /queues/" + q.name + "/lease)"}, `pull, ${q.leased ?? 0} leased`) : null,
        (q.breakers || []).length ? el("div", {class: "breakers"}, ...q.breakers.map((b) =>
          el("div", {class: "breaker", title: `open on ${b.nodes} node(s)`}, `breaker open: ${b.origin}`))) : null),
      ...STATES.map((s) => el("td", {class: `num count-${s}`, title: `${counts[s] ?? 0} tasks, `
        + `${copies[s] ?? 0} copies over the nodes`}, counts[s] ?? 0)),
      ...RATES.map((k) => el("td", {class: `num rate-${k}`}, rate(r ? r[k] : null))),
      el("td", {class: "num latency", title: q.latency ? `${q.latency.count} deliveries` : null},
        q.latency && q.latency.count ? `${seconds(q.latency.p50)} / ${seconds(q.latency.p99)}` : "-"),
      el("td", {},
        q.paused ? el("button", {type: "button", class: "resume", onclick: () => control(q.name, "resume")}, "Resume")
          : el("button", {type: "button", class: "pause", onclick: () => control(q.name, "pause")}, "Pause"),
        el("button", {type: "button", class: "purge", onclick: () => control(q.name, "purge")}, "Purge")));
  });
  $("queues-table").tBodies[0].replaceChildren(...rows);
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

// the chart's points: the server's history (per step seconds), else the sampled rates
function chartPoints() {
  const sr = ui.series;
  if (!sr || !Array.isArray(sr.delivered)) return ui.rates;
  const n = sr.delivered.length;
  const points = [];
  for (let i = 0; i < n; i++) {
    const p = {t: sr.end - (n - i) * sr.step + sr.step / 2};
    for (const k of RATES) p[k] = (num(sr[k] && sr[k][i]) ?? 0) / sr.step;
    points.push(p);
  }
  return points;
}

async function loadRates() {
  const qs = new URLSearchParams({seconds: String(ui.range)});
  if (ui.chartNode) qs.set("node", ui.chartNode);
  const res = await api("GET", `/rates?${qs}`);
  ui.series = res.status === 200 && res.body ? res.body : null;
  const nodes = ui.series && Array.isArray(ui.series.nodes) ? ui.series.nodes : [];
  $("chart-nodes").textContent = !nodes.length ? "" : ui.chartNode ? `(node ${nodes.join(", ")})`
    : `(summed over ${nodes.join(", ")})`;
}

function renderChart() {
  const W = 640, H = 160, PAD = 30;
  const span = ui.series ? ui.range : CHART_SECONDS;
  const box = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `tasks per second, ${RANGES[span] || ""}`});
  const now = ui.series ? ui.series.end : Date.now() / 1000;
  const points = chartPoints();
  let top = 1;
  for (const p of points) for (const k of RATES) top = Math.max(top, p[k]);
  const x = (t) => PAD + ((t - (now - span)) / span) * (W - PAD - 5);
  const y = (v) => H - 15 - (v / top) * (H - 25);
  box.append(svg("line", {x1: PAD, y1: y(0), x2: W - 5, y2: y(0)}));
  const label = (text, lx, ly) => {
    const t = svg("text", {x: lx, y: ly, "font-size": 10});
    t.textContent = text;
    return t;
  };
  box.append(label(rate(top), 2, 12), label("0", 2, y(0)),
    label(span >= 3600 ? "-1 h" : "-5 min", 2, H - 2), label("now", W - 25, H - 2));
  for (const k of RATES) {
    const line = points.map((p) => `${x(p.t).toFixed(1)},${y(p[k]).toFixed(1)}`).join(" ");
    box.append(svg("polyline", {class: k, points: line}));
  }
  $("chart-title").textContent = `Rates, all queues (${RANGES[span] || `${span} s`})`;
  $("chart").replaceChildren(box);
}

function setRange(secs) {
  ui.range = secs;
  for (const b of document.querySelectorAll("button.range")) {
    b.setAttribute("aria-pressed", String(Number(b.dataset.seconds) === secs));
  }
  loadRates().then(renderChart).catch((err) => say(`Could not read the rates: ${err.message}`));
}

// ------------------------------------------------------------------ actions

async function act(method, path, done) {
  try {
    const res = await api(method, path);
    if (res.status !== 200) {
      say(`${method} ${path}: ${errorOf(res)}`);
      return null;
    }
    say(done(res.body), true);
    return res.body;
  } catch (err) {
    if (err instanceof AuthError) askToken(err);
    else say(`${method} ${path}: ${err.message}`);
    return null;
  } finally {
    refresh();
  }
}

function control(queue, action) {
  if (action === "purge" && !confirm(`Purge queue ${queue}? Every scheduled task of it is cancelled.`)) return;
  const q = encodeURIComponent(queue);
  act("POST", `/queues/${q}/${action}`, (b) =>
    action === "purge" ? `queue ${queue}: ${b.purged ?? 0} tasks purged` : `queue ${queue}: ${action}d`);
}

function failedAll(queue, action) {
  if (action === "delete" && !confirm(`Delete every failed task of queue ${queue}?`)) return;
  const q = encodeURIComponent(queue);
  act("POST", `/queues/${q}/failed/${action}`, (b) =>
    `queue ${queue}: ${b.count} failed tasks ${action === "retry" ? "retried" : "deleted"}` +
    (b.more ? " (more remain: repeat)" : ""));
}

async function retryTask(id) {
  const got = await act("POST", `/tasks/${encodeURIComponent(id)}/retry`, () => `task ${id}: retried`);
  if (got) openDetail(id);
}

function deleteTask(id, state) {
  const verb = state === "failed" ? "Delete" : "Cancel";
  if (!confirm(`${verb} task ${id}?`)) return;
  act("DELETE", `/tasks/${encodeURIComponent(id)}`, (b) => `task ${id}: ${b.state}`);
}

// ------------------------------------------------------------------ failed tasks

async function renderFailed(queues) {
  const withFailed = queues.filter((q) => (q.counts || {}).failed > 0);
  const lists = await Promise.all(withFailed.map((q) =>
    getJSON(`/queues/${encodeURIComponent(q.name)}/tasks?state=failed&limit=${FAILED_LIMIT}`)));
  const blocks = lists.map((list, i) => {
    const q = withFailed[i];
    const rows = (list.tasks || []).map((t) => el("tr", {"data-task": t.id},
      el("td", {}, el("a", {href: "#", onclick: (e) => { e.preventDefault(); openDetail(t.id); }}, t.id)),
      el("td", {}, t.name ?? "-"),
      el("td", {}, clip(t.url, 80)),
      el("td", {class: "num attempts"}, t.attempts),
      el("td", {class: "last-response"}, responseText(t.last_response),
        t.last_response && t.last_response.body ? el("pre", {class: "body"}, clip(t.last_response.body, BODY_CHARS)) : null),
      el("td", {}, when(t.finished)),
      el("td", {},
        el("button", {type: "button", class: "retry", onclick: () => retryTask(t.id)}, "Retry"),
        el("button", {type: "button", class: "delete", onclick: () => deleteTask(t.id, "failed")}, "Delete"))));
    const shown = rows.length < q.counts.failed ? ` (the ${rows.length} latest shown)` : "";
    return el("div", {class: "failed-queue", "data-queue": q.name},
      el("h3", {}, `queue ${q.name}: ${q.counts.failed} failed${shown} `,
        el("button", {type: "button", class: "retry-all", onclick: () => failedAll(q.name, "retry")}, "Retry all"),
        el("button", {type: "button", class: "delete-all", onclick: () => failedAll(q.name, "delete")}, "Delete all")),
      el("div", {class: "scroll"}, el("table", {},
        el("thead", {}, el("tr", {}, ...["id", "name", "url", "attempts", "last response", "failed at", "actions"]
          .map((h) => el("th", {}, h)))),
        el("tbody", {}, ...rows))));
  });
  $("failed-lists").replaceChildren(...blocks);
  show("failed-none", blocks.length === 0);
}

// ------------------------------------------------------------------ task lookup

async function lookup(ev) {
  ev.preventDefault();
  const key = $("lookup-key").value.trim();
  const queue = $("lookup-queue").value.trim() || "default";
  if (!key) return;
  $("lookup-message").textContent = "looking up…";
  try {
    let res = ID_RE.test(key) ? await api("GET", `/tasks/${encodeURIComponent(key)}`) : {status: 404};
    if (res.status === 404) {
      const qs = new URLSearchParams({name: key, queue});
      res = await api("GET", `/tasks?${qs}`);
    }
    if (res.status !== 200) {
      $("lookup-message").textContent = res.status === 404
        ? `No task has the id ${key}, nor the name ${key} in queue ${queue}.` : errorOf(res);
      ui.detailId = null;
      show("task-detail", false);
      return;
    }
    $("lookup-message").textContent = "";
    ui.detailId = res.body.id;
    renderDetail(res.body);
  } catch (err) {
    if (err instanceof AuthError) askToken(err);
    else $("lookup-message").textContent = err.message;
  }
}

function openDetail(id) {
  ui.detailId = id;
  refreshDetail();
  $("lookup-panel").scrollIntoView();
}

async function refreshDetail() {
  const id = ui.detailId;
  if (!id) return;
  const res = await api("GET", `/tasks/${encodeURIComponent(id)}`);
  if (id !== ui.detailId) return;
  if (res.status === 200) renderDetail(res.body);
  else {
    $("lookup-message").textContent = `task ${id}: ${errorOf(res)}`;
    show("task-detail", false);
  }
}

// why a scheduled task waits, when its target's breaker says so
function waiting(t, short) {
  if (t.state !== "scheduled") return null;
  const b = ui.targets[originOf(t.url)];
  if (!b || b.state === "closed") return null;
  if (short) return el("div", {class: "why"}, `waiting: breaker ${b.state.replace("_", " ")}`);
  return el("span", {class: "why"}, ` waiting: the circuit breaker of ${b.origin} is ${b.state.replace("_", " ")}` +
    (num(b.retry_at) !== null ? `, next probe ${when(b.retry_at)}` : "") + ` (${b.failures} failures)`);
}

function pairs(obj) {
  const entries = obj && typeof obj === "object" ? Object.entries(obj) : [];
  if (!entries.length) return "none";
  return el("div", {}, ...entries.map(([k, v]) => el("div", {}, el("code", {}, k), ": ",
    typeof v === "string" ? v : JSON.stringify(v))));
}

function bodyView(t) {
  if (typeof t.body !== "string") return "none (the params are the body)";
  const cut = num(t.body_chars) !== null && t.body_chars > t.body.length ? ` (first ${t.body.length} of ${t.body_chars} characters)` : "";
  return el("span", {}, `${t.content_type ?? "no content type"}${cut}`,
    el("pre", {class: "body"}, clip(t.body, BODY_CHARS * 4)));
}

function renderDetail(t) {
  const last = t.last_response;
  const fields = [
    ["id", t.id], ["name", t.name ?? "-"], ["queue", t.queue],
    ["state", el("span", {}, el("span", {class: `task-state state-${t.state}`}, t.state), waiting(t))],
    ["url", `${t.method} ${t.url}`],
    ["labels", pairs(t.labels)],
    ["params", pairs(t.params)], ["headers", pairs(t.headers)], ["body", bodyView(t)],
    ["attempts", `${t.attempts}${t.max_attempts ? ` of ${t.max_attempts}` : ""}`],
    ["created", when(t.created)], ["next attempt", when(t.next_attempt)],
    ["lease", t.lease_until ? el("span", {}, "held by its worker until ", when(t.lease_until))
      : t.lease ? `${t.lease} s once its worker answers 202` : "-"],
    ["finished", when(t.finished)],
    ["last response", el("span", {}, responseText(last),
      last && last.body ? el("pre", {class: "body"}, clip(last.body, BODY_CHARS)) : null)],
    ["replicas", (t.replicas || []).join(", ") || "-"],
    ["copies", (t.copies || []).map((c) => `${c.node}#${c.replica} ${c.state}`).join(", ") || "-"],
  ];
  const dl = el("dl", {class: "task"});
  for (const [k, v] of fields) dl.append(el("dt", {}, k), el("dd", {class: `field-${k.replace(" ", "-")}`}, v));
  const history = (t.history || []).map((a) => el("tr", {},
    el("td", {}, when(a.start)), el("td", {class: "num"}, num(a.duration) === null ? "-" : `${(a.duration * 1000).toFixed(1)} ms`),
    el("td", {}, a.node), el("td", {}, a.status ?? "-"), el("td", {}, a.error ?? "")));
  const buttons = el("p", {},
    el("button", {type: "button", class: "retry", onclick: () => retryTask(t.id)}, "Retry"),
    el("button", {type: "button", class: "delete", onclick: () => deleteTask(t.id, t.state)},
      t.state === "failed" ? "Delete" : "Cancel"));
  $("task-detail").replaceChildren(el("h3", {}, `task ${t.id}`), dl, buttons,
    el("h3", {}, "attempts (newest first)"),
    history.length ? el("div", {class: "scroll"}, el("table", {},
      el("thead", {}, el("tr", {}, ...["start", "duration", "node", "status", "error"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...history))) : el("p", {}, "none yet"));
  show("task-detail", true);
}

// ------------------------------------------------------------------ browsing tasks

function browseFilter() {
  const f = {state: $("browse-state").value};
  for (const [k, id] of [["queue", "browse-queue"], ["target", "browse-target"], ["name_prefix", "browse-name"], ["label", "browse-label"]]) {
    const v = $(id).value.trim();
    if (v) f[k] = v;
  }
  return f;
}

async function browsePage(cursor) {
  const b = ui.browse;
  const qs = new URLSearchParams({...b.filter, limit: String(BROWSE_LIMIT)});
  if (cursor) qs.set("cursor", cursor);
  $("browse-message").textContent = "reading…";
  try {
    const res = await api("GET", `/tasks?${qs}`);
    if (res.status !== 200) {
      $("browse-message").textContent = errorOf(res);
      return;
    }
    renderBrowse(res.body, cursor);
  } catch (err) {
    if (err instanceof AuthError) askToken(err);
    else $("browse-message").textContent = err.message;
  }
}

function renderBrowse(page, cursor) {
  const b = ui.browse;
  const ended = !["scheduled", "running"].includes(b.filter.state);
  $("browse-when").textContent = ended ? "ended" : "next attempt";
  const rows = (page.tasks || []).map((t) => el("tr", {"data-task": t.id},
    el("td", {}, el("a", {href: "#", onclick: (e) => { e.preventDefault(); openDetail(t.id); }}, t.id)),
    el("td", {}, t.queue), el("td", {}, t.name ?? "-"), el("td", {}, clip(t.url, 80), waiting(t, true)),
    el("td", {class: "num"}, t.attempts),
    el("td", {}, when(ended ? t.finished : t.next_attempt ?? t.eta))));
  $("browse-table").tBodies[0].replaceChildren(...rows);
  b.next = page.next_cursor || null;
  if (cursor) b.cursors.push(cursor);
  const pageNo = b.cursors.length;  // 0: the first page
  $("browse-next").disabled = !b.next;
  $("browse-first").disabled = !cursor;
  const nodes = Array.isArray(page.nodes) ? ` from ${page.nodes.join(", ")}` : "";
  $("browse-message").textContent = `${rows.length ? `page ${pageNo + 1}: ${rows.length} tasks` : "no tasks on this page"}` +
    `${nodes}${b.next ? "; more on the next page" : "; the last page"}`;
}

function startBrowse(ev) {
  if (ev) ev.preventDefault();
  ui.browse = {filter: browseFilter(), cursors: [], next: null};
  browsePage(null);
}

// ------------------------------------------------------------------ footer links
// With a token, a plain link would open a 401 page: the script fetches with the token
// and shows the answer as text in the page.
async function openRaw(ev) {
  if (!token()) return;  // no token: the plain link works
  ev.preventDefault();
  const path = new URL(ev.currentTarget.href).pathname;
  try {
    const r = await fetch(path, {headers: {Authorization: `Bearer ${token()}`}, cache: "no-store",
      credentials: "omit"});
    const body = await r.text();
    $("raw-title").textContent = `GET ${path}: HTTP ${r.status}`;
    $("raw-body").textContent = path.endsWith(".json") && r.ok ? JSON.stringify(JSON.parse(body), null, 2) : body;
    show("raw-panel", true);
    $("raw-panel").scrollIntoView();
  } catch (err) {
    say(`GET ${path}: ${err.message}`);
  }
}

// ------------------------------------------------------------------ targets, schedules

function renderTargets(body) {
  ui.targets = {};
  for (const t of body.targets || []) ui.targets[t.origin] = t;
  const rows = (body.targets || []).map((t) => el("tr", {"data-origin": t.origin},
    el("td", {}, t.origin), el("td", {class: `target-${t.state}`}, t.state),
    el("td", {class: "num"}, t.failures ?? "-"), el("td", {class: "num"}, t.inflight ?? "-"),
    el("td", {}, when(t.retry_at))));
  $("targets-table").tBodies[0].replaceChildren(...rows);
}

function renderSchedules(body) {
  const rows = (body.schedules || []).map((s) => el("tr", {"data-schedule": s.name},
    el("td", {}, s.name),
    el("td", {}, s.cron !== undefined && s.cron !== null ? `cron ${s.cron}` : `every ${s.every} s`),
    el("td", {}, s.timezone ?? "-"), el("td", {}, s.paused ? "paused" : "active"),
    el("td", {}, ...(s.next || []).slice(0, 3).map((t) => el("div", {}, when(t)))),
    el("td", {}, ...(s.last_task_ids || []).slice(-3).map((id) => el("div", {},
      el("a", {href: "#", onclick: (e) => { e.preventDefault(); openDetail(String(id)); }}, id))))));
  $("schedules-table").tBodies[0].replaceChildren(...rows);
}

// ------------------------------------------------------------------ start

function start() {
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("token-input").value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $("token-input").value = "";
    ui.ask = null;
    show("token-panel", false);
    say("");
    refresh();
  });
  $("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    refresh();
  });
  $("refresh-toggle").addEventListener("click", () => {
    ui.auto = !ui.auto;
    $("refresh-toggle").textContent = ui.auto ? "Pause refresh" : "Resume refresh";
    $("refreshed").textContent = ui.auto ? "auto-refresh on (every 2 s)" : "auto-refresh paused";
    schedule();
  });
  $("refresh-now").addEventListener("click", () => refresh());
  $("lookup-form").addEventListener("submit", lookup);
  $("browse-form").addEventListener("submit", startBrowse);
  $("browse-next").addEventListener("click", () => browsePage(ui.browse.next));
  $("browse-first").addEventListener("click", () => startBrowse(null));
  for (const b of document.querySelectorAll("button.range")) {
    b.addEventListener("click", () => setRange(Number(b.dataset.seconds)));
  }
  $("chart-node").addEventListener("change", () => {
    ui.chartNode = $("chart-node").value;
    setRange(ui.range);
  });
  for (const a of document.querySelectorAll("footer a.raw")) a.addEventListener("click", openRaw);
  $("raw-close").addEventListener("click", () => show("raw-panel", false));
  refresh();
}

document.addEventListener("DOMContentLoaded", start);
