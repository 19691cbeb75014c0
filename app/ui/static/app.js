// Jobfair's dashboard: plain modern JavaScript, no libraries (ADR 022).
//
// Every figure comes from the public API, asked with the key the user signed in with;
// the page asks only for what that key may see (GET /v2/whoami says its role and
// scope), so a scoped key never meets a 403 here.  Data is written with textContent
// only: a tenant called "<img onerror=...>" is shown as text.

const KEY = "jobfair.key";
const REFRESH_MS = 1000; // the overview is at most this (plus one request) behind
const GONE_AFTER_MS = 120_000; // a worker not seen for this long is marked: maybe gone
const PAGE = 25; // tenants per page of a job type, jobs per page of the browser
const VARIABLES_SHOWN = 10_000; // characters of a job's variables drawn at most

let caller = null; // GET /v2/whoami
let timer = null; // the current view's refresh
const throughput = new Map(); // type -> [{at, total}] sampled by this page (fallback)

// -- the API ---------------------------------------------------------------------------

class Problem extends Error {
  constructor(status, body) {
    super(body && body.detail ? `${body.title || status}: ${body.detail}` : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const answer = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit", cache: "no-store",
  });
  if (answer.status === 204) return null;
  const text = await answer.text();
  let parsed = null;
  try { parsed = text ? JSON.parse(text) : null; } catch { parsed = null; }
  if (!answer.ok) {
    // Refused: said only of a key that was given (the first visit has none yet).
    if (answer.status === 401) signIn(key ? "The key was refused: " + ((parsed && parsed.detail) || "401") : "");
    throw new Problem(answer.status, parsed);
  }
  return parsed;
}

const isAdmin = () => caller && caller.role === "admin";
const q = (params) => {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") s.set(k, v);
  const t = s.toString();
  return t ? "?" + t : "";
};

// -- drawing ---------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const num = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
function age(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}
const pct = (f) => `${(100 * f).toFixed(1)} %`;
const plural = (n, one, many = one + "s") => `${num(n)} ${n === 1 ? one : many}`;
const jobHref = (key) => `#/jobs/${encodeURIComponent(key)}`;
const tenantHref = (t) => `#/tenants/${encodeURIComponent(t)}`;
const typeHref = (t) => `#/types/${encodeURIComponent(t)}`;

// A lane's shares (docs/dashboard.md): realised and entitled over the window's
// activations, and (with ready jobs) entitled now: its weight over the weights of its
// type's lanes with ready jobs, unpaused.
function shareBar(lane) {
  const w = (f) => `width:${Math.max(0, Math.min(1, f)) * 100}%`;
  const bar = (cls, f, label) => {
    const span = el("span");
    span.style.cssText = w(f);
    return el("div", { class: `bar ${cls}`, role: "img", "aria-label": `${label} ${pct(f)}` }, span);
  };
  const entitled = lane.entitledShare ?? lane.configuredShare;
  return el("div", { class: "share" },
    bar("realised", lane.realizedShare, "realised share"),
    bar("entitled", entitled, "entitled share"),
    el("small", {}, `${pct(lane.realizedShare)} realised · ${pct(entitled)} entitled`,
      lane.ready ? el("span", { "data-field": "entitled-now" }, ` · ${pct(lane.configuredShare)} entitled now`) : null));
}

const HELD_BY = {
  tenantPaused: "tenant paused", typePaused: "type paused",
  tenantCap: "tenant's cap", typeCap: "type's cap",
  tenantRate: "tenant's rate limit", typeRate: "type's rate limit",
  keyCap: "fairness key's cap", perKeyCap: "type's cap per fairness key",
};

// What holds a lane back now (with its figures), and what held it in the window.
function holdTags(lane) {
  const now = (lane.heldBy || []).map((h) => {
    const what = HELD_BY[h.reason] || h.reason;
    const figures = "limit" in h ? ` ${num(h.active)}/${num(h.limit)}` : "nextTokenInMs" in h ? ` · next token in ${age(h.nextTokenInMs)}` : "";
    return el("span", { class: "tag capped", "data-held": h.reason, title: `held back now by its ${what}` }, `held: ${what}${figures}`);
  });
  const window = Object.entries(lane.heldInWindow || {}).sort((a, b) => b[1] - a[1]);
  const past = window.length ? el("div", { class: "muted small", "data-field": "held-window" },
    "held in the window: " + window.map(([r, f]) => `${HELD_BY[r] || r} ${pct(f)}`).join(", ")) : null;
  return [...now, minimumTag(lane), ...keyCapTags(lane), past];
}

// Its tenant's guaranteed minimum against its active jobs (ADR 042): below it, its ready
// jobs are served before the weighted share.
function minimumTag(lane) {
  if (!lane.minActiveJobs) return null;
  const active = lane.tenantActive ?? 0;
  const below = active < lane.minActiveJobs;
  return el("span", { class: `tag ${below ? "late" : "muted"}`, "data-minimum": below ? "below" : "reached",
    title: below ? "below its minimum: its ready jobs are served before the weighted share" : "at its minimum: weights decide" },
    `minimum ${num(active)}/${num(lane.minActiveJobs)}${below ? " · served first" : ""}`);
}

// Its fairness keys at their caps now (ADR 040), each with its running jobs and its cap;
// a FIFO key whose head is out or FAILED (ADR 041), with its head.
function keyCapTags(lane) {
  const keys = lane.keys || [];
  const waiting = keys.filter((k) => k.head && k.headState !== "CREATED").map((k) =>
    el("span", { class: `tag ${k.headState === "FAILED" ? "late" : "capped"}`, "data-key-head": k.fairnessKey,
      title: "a FIFO key: its next job waits for its head to end (a FAILED head until an operator revives or cancels it)" },
      `key ${k.fairnessKey} waits for job ${k.head} (${k.headState})`));
  return [...waiting, ...keys.filter((k) => k.held && !k.head).map((k) => {
    const cap = keyCapOf(k);
    return el("span", { class: "tag capped", "data-held-key": k.fairnessKey, title: "a fairness key at its cap: its next job waits for one of its running jobs to end" },
      `key ${k.fairnessKey} at its cap${cap === null ? "" : ` ${num(k.active)}/${num(cap)}`}`);
  })];
}

// The cap that binds a key of the type: the least of its own and its type's per-key cap.
function keyCapOf(k) {
  const caps = [k.maxActiveJobs, k.maxActivePerKey].filter((c) => c !== null && c !== undefined);
  return caps.length ? Math.min(...caps) : null;
}

// "No activation of this type for N" when its lanes wait while nothing is served.
function idleNote(type) {
  const idle = type.noActivationForMs;
  if (idle === null || idle === undefined || idle < 5000 || !type.ready) return null;
  return el("span", { class: "tag late", "data-field": "idle" },
    `no activation of this type for ${type.noActivationSinceStart ? "at least " : ""}${age(idle)}`);
}

function sparkline(points, label) {
  const wide = 120, high = 24;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", wide);
  svg.setAttribute("height", high);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  const top = Math.max(1, ...points);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  const step = points.length > 1 ? wide / (points.length - 1) : wide;
  line.setAttribute("points", points.map((p, i) => `${(i * step).toFixed(1)},${(high - 2 - (p / top) * (high - 4)).toFixed(1)}`).join(" "));
  svg.append(line);
  return svg;
}

function table(headers, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map(([h, cls]) => el("th", { class: cls, scope: "col" }, h)))),
    el("tbody", {}, rows));
}

function notice(message) {
  const box = document.getElementById("notice");
  box.textContent = message || "";
  box.hidden = !message;
}

function show(...nodes) {
  const view = document.getElementById("view");
  view.replaceChildren(...nodes);
}

// -- signing in ------------------------------------------------------------------------

function signIn(reason) {
  stop();
  const form = document.getElementById("sign-in").content.firstElementChild.cloneNode(true);
  form.querySelector(".error").textContent = reason || "";
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, form.elements.key.value.trim());
    try {
      await start();
    } catch (err) {
      form.querySelector(".error").textContent = err.message;
    }
  });
  show(form);
  form.elements.key.focus();
}

async function start() {
  caller = await api("/v2/whoami");
  const who = document.getElementById("who");
  const scope = (s) => (s === "*" ? "all" : s.join(", "));
  who.textContent = caller.auth === "off"
    ? "auth off (loopback)"
    : `${caller.role} key ${caller.keyId} · tenants: ${scope(caller.tenants)} · types: ${scope(caller.types)}`;
  document.getElementById("sign-out").hidden = caller.auth === "off";
  route();
}

// -- the views -------------------------------------------------------------------------

function stop() {
  if (timer) clearTimeout(timer);
  timer = null;
}

// Redraw ``draw`` now and then every REFRESH_MS while the view is current; ``live.again``
// redraws at once (after a click), never running two draws of the view at a time.
function live(draw) {
  stop();
  const token = {};
  live.current = token;
  let running = false;
  let again = false;
  const tick = async () => {
    if (live.current !== token) return;
    running = true;
    const started = performance.now();
    try {
      await draw();
      // Each redraw's time, request included, for bench/dashboard.py (and devtools).
      performance.measure("jobfair:refresh", { start: started });
      notice("");
    } catch (err) {
      if (err.status !== 401) notice(`Could not refresh: ${err.message}`);
    } finally {
      running = false;
    }
    if (live.current !== token) return;
    if (again) {
      again = false;
      await tick();
      return;
    }
    timer = setTimeout(tick, REFRESH_MS);
  };
  live.again = () => {
    if (live.current !== token) return;
    if (running) { again = true; return; }
    stop();
    tick();
  };
  return tick();
}

// A type nobody configured has the server's defaults, which only its own record says:
// asked once per type and kept (a configured type comes with the list each refresh).
const defaults = new Map();
async function withDefaults(byType, types) {
  const missing = types.filter((t) => !byType.has(t) && !defaults.has(t));
  await Promise.all(missing.map(async (t) => {
    defaults.set(t, await api(`/v2/job-types/${t.split("/").map(encodeURIComponent).join("/")}`));
  }));
  for (const t of types) if (!byType.has(t) && defaults.has(t)) byType.set(t, defaults.get(t));
}

function agingBound(config) {
  // A job's priority rises by agingStep every agingIntervalMs until 100: from 0 that
  // takes this long (the bound an oldest ready age is read against).
  if (!config) return null;
  return Math.ceil(100 / config.agingStep) * config.agingIntervalMs;
}

function sample(type) {
  const now = Date.now();
  const series = throughput.get(type.type) || [];
  const total = type.tenants.reduce((s, t) => s + t.activatedLastMinute, 0);
  series.push({ at: now, total });
  while (series.length && series[0].at < now - 15 * 60_000) series.shift();
  throughput.set(type.type, series);
  return series.map((p) => p.total);
}

const overviewState = { search: "", pages: new Map() };

async function overview() {
  const search = el("input", {
    type: "search", placeholder: "tenant contains…", "aria-label": "Search tenants",
    value: overviewState.search,
  });
  const body = el("div", { id: "types" });
  search.addEventListener("input", () => { overviewState.search = search.value; overviewState.pages.clear(); live.again(); });
  show(el("h1", {}, "Overview"),
    el("div", { class: "toolbar" }, search,
      el("span", { class: "legend" },
        el("span", {}, el("span", { class: "swatch realised" }), "realised share (last minute)"),
        el("span", {}, el("span", { class: "swatch entitled" }), "entitled share (of the same activations, by weight, given who waited and who was held)"),
        el("span", {}, "entitled now: its weight over the weights with ready jobs now"))),
    body);
  await live(async () => {
    const [stats, configs, paused] = await Promise.all([
      api("/v2/stats"),
      isAdmin() ? api("/v2/job-types").then((a) => a.jobTypes) : Promise.resolve([]),
      isAdmin() ? api("/v2/tenants").then((a) => a.tenants) : Promise.resolve([]),
    ]);
    const byType = new Map(configs.map((c) => [c.type, c]));
    if (isAdmin()) await withDefaults(byType, stats.jobTypes.map((t) => t.type));
    const pausedTenants = new Set(paused.filter((t) => t.paused).map((t) => t.tenantId));
    const cards = stats.jobTypes.map((type) => typeCard(type, byType.get(type.type), pausedTenants));
    // A redraw replaces the cards: keep the keyboard's place (a pager button) across it.
    const focused = document.activeElement && document.activeElement.dataset.focus;
    body.replaceChildren(...(cards.length ? cards : [el("p", { class: "muted" }, "No job types yet: create a job and it appears here.")]));
    if (focused) { const again = body.querySelector(`[data-focus="${CSS.escape(focused)}"]`); if (again) again.focus(); }
  });
}

function typeCard(type, config, pausedTenants) {
  const needle = overviewState.search.toLowerCase();
  const tenants = type.tenants.filter((t) => !needle || t.tenantId.toLowerCase().includes(needle));
  const total = type.tenantCount ?? tenants.length;
  const pages = Math.max(1, Math.ceil(tenants.length / PAGE));
  const page = Math.min(overviewState.pages.get(type.type) || 0, pages - 1);
  const shown = tenants.slice(page * PAGE, page * PAGE + PAGE);
  const bound = agingBound(config);
  // The server's last 15 minutes when it gives them, else what this page has sampled.
  const series = type.activatedPerMinute
    ? type.activatedPerMinute.filter((n) => n !== null)
    : sample(type);
  const rows = shown.map((t) => {
    const late = bound !== null && t.oldestPendingAgeMs !== null && t.oldestPendingAgeMs > bound;
    return el("tr", { "data-tenant": t.tenantId },
      el("td", {}, el("a", { href: tenantHref(t.tenantId) }, t.tenantId),
        (t.paused || pausedTenants.has(t.tenantId)) && el("span", { class: "tag paused" }, "paused"),
        holdTags(t)),
      el("td", { class: "num", "data-field": "weight" }, num(t.weight)),
      el("td", { class: "num", "data-field": "ready" }, num(t.ready)),
      el("td", { class: "num", "data-field": "delayed" }, num(t.delayed)),
      el("td", { class: "num", "data-field": "active" }, num(t.active)),
      el("td", { class: late ? "num late" : "num", "data-field": "oldest" },
        age(t.oldestPendingAgeMs), bound !== null ? el("span", { class: "muted" }, ` / ${age(bound)}`) : null),
      el("td", { class: "num", "data-field": "activated" }, num(t.activatedLastMinute)),
      el("td", {}, shareBar(t)));
  });
  const pager = pages > 1 ? el("div", { class: "toolbar" },
    el("button", { type: "button", "data-focus": `prev:${type.type}`, disabled: page === 0, onclick: () => { overviewState.pages.set(type.type, page - 1); live.again(); } }, "← Previous"),
    el("span", { class: "muted" }, `page ${page + 1} of ${pages} · ${plural(tenants.length, "tenant")}`),
    el("button", { type: "button", "data-focus": `next:${type.type}`, disabled: page >= pages - 1, onclick: () => { overviewState.pages.set(type.type, page + 1); live.again(); } }, "Next →")) : null;
  return el("section", { class: "card", "data-type": type.type, "aria-label": `job type ${type.type}` },
    el("h2", {}, el("a", { href: typeHref(type.type) }, type.type),
      (type.paused || (config && config.paused)) && el("span", { class: "tag paused" }, "paused"),
      config && config.maxActiveJobs !== null && el("span", { class: "tag capped" }, `cap ${config.maxActiveJobs}`)),
    el("div", { class: "totals" },
      el("span", {}, "ready ", el("b", { "data-field": "ready" }, num(type.ready))),
      el("span", {}, "delayed ", el("b", { "data-field": "delayed" }, num(type.delayed))),
      el("span", {}, "active ", el("b", { "data-field": "active" }, num(type.active))),
      el("span", {}, "oldest ready ", el("b", { "data-field": "oldest" }, age(type.oldestPendingAgeMs)),
        bound !== null ? ` (aging bound ${age(bound)})` : ""),
      el("span", {}, type.activatedPerMinute ? "activations per minute, last 15 min " : "activations in the last minute, as sampled here ",
        sparkline(series, `activations per minute, latest ${num(series[series.length - 1] || 0)}`),
        el("b", {}, num(series[series.length - 1] || 0))),
      el("span", {}, plural(total, "tenant")),
      idleNote(type)),
    table([["tenant"], ["weight", "num"], ["ready", "num"], ["delayed", "num"], ["active", "num"], ["oldest ready / bound", "num"], ["activated last min", "num"], ["share"]], rows),
    pager);
}

// Tenants and job types: list and edit.

async function tenantsView() {
  if (!isAdmin()) return mine("tenants");
  const answer = await api("/v2/tenants");
  show(el("h1", {}, "Tenants"),
    el("p", { class: "muted" }, "Configured tenants. Any other tenant has weight 1 and no cap. Open one by name:"),
    openBy("tenant id", tenantHref),
    table([["tenant"], ["weight", "num"], ["max active jobs", "num"], ["state"]],
      answer.tenants.map((t) => el("tr", {},
        el("td", {}, el("a", { href: tenantHref(t.tenantId) }, t.tenantId)),
        el("td", { class: "num" }, num(t.weight)),
        el("td", { class: "num" }, t.maxActiveJobs === null ? "none" : num(t.maxActiveJobs)),
        el("td", {}, t.paused ? el("span", { class: "tag paused" }, "paused") : "")))));
}

function mine(what) {
  const list = what === "tenants" ? caller.tenants : caller.types;
  const href = what === "tenants" ? tenantHref : typeHref;
  show(el("h1", {}, what === "tenants" ? "Tenants" : "Job types"),
    el("p", { class: "muted" }, "Configuration is for admin keys; this key's scope:"),
    list === "*" ? el("p", {}, "all") : el("ul", {}, list.map((x) => el("li", {}, el("a", { href: href(x) }, x)))));
}

function openBy(label, href) {
  const input = el("input", { "aria-label": label, placeholder: label, required: true });
  return el("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); location.hash = href(input.value); } },
    input, el("button", { type: "submit" }, "Open"));
}

function field(name, label, value, attrs = {}) {
  return el("label", {}, label, el("input", { name, value: value ?? "", ...attrs }));
}

function editForm(fields, save) {
  const error = el("p", { class: "error", role: "alert" });
  const done = el("span", { class: "muted", "aria-live": "polite" });
  const form = el("form", { class: "inline" }, fields, el("button", { type: "submit", class: "primary" }, "Save"), done);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.textContent = "";
    done.textContent = "";
    try {
      await save(form.elements);
      done.textContent = "saved";
    } catch (err) {
      error.textContent = err.message;
    }
  });
  return el("div", {}, form, error);
}

// "" is null (no cap); anything else goes as typed, so the API judges it (a bad value
// shows the API's own 400 message, and nothing changes).
const intOrNull = (v) => (v.trim() === "" ? null : Number.isInteger(Number(v)) ? Number(v) : v);
const numOrNull = (v) => (v.trim() === "" ? null : Number.isFinite(Number(v)) ? Number(v) : v);
// A PUT replaces the whole configuration: the rate limit is in every form that saves one
// (an empty rate: no limit; what is not a number goes as typed, for the API to refuse).
const rateFields = (config) => [
  field("ratePerSecond", "rate limit, per second (empty: none)", config.rateLimit ? config.rateLimit.perSecond : null, { inputmode: "decimal" }),
  field("rateBurst", "rate limit, burst", config.rateLimit ? config.rateLimit.burst : null, { inputmode: "decimal" }),
];
const rateLimit = (f) => (f.ratePerSecond.value.trim() === "" ? null
  : { perSecond: numOrNull(f.ratePerSecond.value), burst: numOrNull(f.rateBurst.value) });

function pauseButton(path, paused, redraw) {
  const verb = paused ? "resume" : "pause";
  return el("button", { type: "button", onclick: async () => {
    try { await api(`${path}/${verb}`, { method: "POST" }); await redraw(); } catch (err) { notice(err.message); }
  } }, paused ? "Resume" : "Pause");
}

async function tenantView(tenant) {
  const path = `/v2/tenants/${encodeURIComponent(tenant)}`;
  const draw = async () => {
    const [config, stats] = await Promise.all([
      isAdmin() ? api(path) : Promise.resolve(null),
      api("/v2/stats"),
    ]);
    const lanes = stats.jobTypes.flatMap((t) => t.tenants.filter((x) => x.tenantId === tenant).map((x) => ({ type: t.type, ...x })));
    show(el("h1", {}, `Tenant ${tenant}`, config && config.paused && el("span", { class: "tag paused" }, "paused")),
      config && el("section", { class: "card" }, el("h2", {}, "Configuration"),
        editForm([
          field("weight", "weight (1–10000)", config.weight, { inputmode: "numeric" }),
          field("maxActiveJobs", "max active jobs (empty: none)", config.maxActiveJobs, { inputmode: "numeric" }),
          field("minActiveJobs", "guaranteed minimum of active jobs (empty: none)", config.minActiveJobs ?? null, { inputmode: "numeric" }),
          ...rateFields(config),
        ], async (f) => {
          await api(path, { method: "PUT", body: { weight: intOrNull(f.weight.value), maxActiveJobs: intOrNull(f.maxActiveJobs.value), minActiveJobs: intOrNull(f.minActiveJobs.value), rateLimit: rateLimit(f) } });
        }),
        "paused" in config ? pauseButton(path, config.paused, draw) : null),
      el("section", { class: "card" }, el("h2", {}, "Job types"),
        table([["type"], ["weight", "num"], ["ready", "num"], ["delayed", "num"], ["active", "num"], ["oldest ready", "num"], ["share"]],
          lanes.map((l) => el("tr", { "data-type": l.type },
            el("td", {}, el("a", { href: typeHref(l.type) }, l.type), holdTags(l)),
            el("td", { class: "num", "data-field": "weight" }, num(l.weight)),
            el("td", { class: "num" }, num(l.ready)), el("td", { class: "num" }, num(l.delayed)),
            el("td", { class: "num" }, num(l.active)), el("td", { class: "num" }, age(l.oldestPendingAgeMs)),
            el("td", {}, shareBar(l)))))),
      el("p", {}, el("a", { href: `#/jobs?tenantId=${encodeURIComponent(tenant)}` }, "This tenant's jobs")));
  };
  await draw();
}

async function typesView() {
  if (!isAdmin()) return mine("types");
  const answer = await api("/v2/job-types");
  show(el("h1", {}, "Job types"), openBy("job type", typeHref),
    table([["type"], ["max active jobs", "num"], ["aging interval", "num"], ["aging step", "num"], ["state"]],
      answer.jobTypes.map((t) => el("tr", {},
        el("td", {}, el("a", { href: typeHref(t.type) }, t.type)),
        el("td", { class: "num" }, t.maxActiveJobs === null ? "none" : num(t.maxActiveJobs)),
        el("td", { class: "num" }, age(t.agingIntervalMs)), el("td", { class: "num" }, num(t.agingStep)),
        el("td", {}, t.paused ? el("span", { class: "tag paused" }, "paused") : "")))));
}

async function typeView(type) {
  const path = `/v2/job-types/${type.split("/").map(encodeURIComponent).join("/")}`;
  const draw = async () => {
    const [config, stats] = await Promise.all([
      isAdmin() ? api(path) : Promise.resolve(null),
      api("/v2/stats" + q({ type })),
    ]);
    const card = stats.jobTypes.length ? typeCard(stats.jobTypes[0], config, new Set()) : el("p", { class: "muted" }, "No jobs of this type.");
    show(el("h1", {}, `Job type ${type}`, config && config.paused && el("span", { class: "tag paused" }, "paused")),
      config && el("section", { class: "card" }, el("h2", {}, "Configuration"),
        editForm([
          field("maxActiveJobs", "max active jobs (empty: none)", config.maxActiveJobs, { inputmode: "numeric" }),
          field("agingIntervalMs", "aging interval, ms", config.agingIntervalMs, { inputmode: "numeric" }),
          field("agingStep", "aging step", config.agingStep, { inputmode: "numeric" }),
          field("maxActivePerKey", "max active jobs per fairness key (empty: none)", config.maxActivePerKey ?? null, { inputmode: "numeric" }),
          el("label", {}, "order inside each fairness key",
            el("select", { name: "keyOrdering" },
              el("option", { value: "", selected: !config.keyOrdering }, "by priority"),
              el("option", { value: "fifo", selected: config.keyOrdering === "fifo" }, "fifo: one at a time, in creation order"))),
          ...rateFields(config),
        ], async (f) => {
          // A PUT sets the whole configuration: what the form does not show is sent as it is.
          await api(path, { method: "PUT", body: {
            maxActiveJobs: intOrNull(f.maxActiveJobs.value),
            agingIntervalMs: intOrNull(f.agingIntervalMs.value), agingStep: intOrNull(f.agingStep.value),
            rateLimit: rateLimit(f), fairnessBy: config.fairnessBy,
            maxActivePerKey: intOrNull(f.maxActivePerKey.value),
            keyOrdering: f.keyOrdering.value || null,
          } });
        }),
        "paused" in config ? pauseButton(path, config.paused, draw) : null),
      card,
      el("p", {}, el("a", { href: `#/jobs?type=${encodeURIComponent(type)}` }, "This type's jobs")));
  };
  await draw();
}

// The job browser.

const STATES = ["", "CREATED", "ACTIVATED", "COMPLETED", "FAILED", "ERROR_THROWN", "CANCELED"];

async function jobsView(params) {
  const filters = { type: params.get("type") || "", tenantId: params.get("tenantId") || "", state: params.get("state") || "",
    createdAfter: params.get("createdAfter") || "", createdBefore: params.get("createdBefore") || "" };
  const cursors = [null]; // the cursor of each page seen, for "Previous"
  const list = el("div");
  const form = el("form", { class: "inline", onsubmit: (e) => {
    e.preventDefault();
    location.hash = "#/jobs" + q(Object.fromEntries(["type", "tenantId", "state", "createdAfter", "createdBefore"].map((n) => [n, form.elements[n].value])));
  } },
    field("type", "type", filters.type), field("tenantId", "tenant", filters.tenantId),
    el("label", {}, "state", el("select", { name: "state" }, STATES.map((s) => el("option", { value: s, selected: s === filters.state }, s || "any")))),
    field("createdAfter", "created after (RFC 3339)", filters.createdAfter),
    field("createdBefore", "created before", filters.createdBefore),
    el("button", { type: "submit" }, "Filter"));
  show(el("h1", {}, "Jobs"), form, list);
  const load = async (page) => {
    const answer = await api("/v2/jobs" + q({ ...filters, limit: PAGE, cursor: cursors[page] }));
    if (answer.nextCursor) cursors[page + 1] = answer.nextCursor;
    list.replaceChildren(
      jobTable(answer.items),
      el("div", { class: "toolbar" },
        el("button", { type: "button", disabled: page === 0, onclick: () => load(page - 1) }, "← Newer"),
        el("span", { class: "muted" }, `page ${page + 1}`),
        el("button", { type: "button", disabled: !answer.nextCursor, onclick: () => load(page + 1) }, "Older →")));
  };
  try { await load(0); } catch (err) { list.replaceChildren(el("p", { class: "error" }, err.message)); }
}

function jobTable(items, extra) {
  return table([["job"], ["type"], ["tenant"], ["state"], ["created"], ["attempts", "num"], ["last error"], ...(extra ? [[""]] : [])],
    items.map((j) => el("tr", { "data-job": j.jobKey },
      el("td", {}, el("a", { href: jobHref(j.jobKey) }, j.jobKey)),
      el("td", {}, j.type), el("td", {}, j.tenantId), el("td", {}, j.state),
      el("td", {}, j.createdAt), el("td", { class: "num" }, num(j.activationCount)),
      el("td", { "data-field": "error" }, [j.errorCode, j.errorMessage].filter(Boolean).join(": ")),
      extra ? el("td", {}, extra(j)) : null)));
}

async function jobView(key) {
  const path = `/v2/jobs/${encodeURIComponent(key)}`;
  const draw = async () => {
    const [job, history, why] = await Promise.all([api(path), api(path + "/history").catch(() => null), api(path + "/explain").catch(() => null)]);
    const variables = JSON.stringify(job.variables, null, 2);
    const actions = [];
    if (job.state === "FAILED" && caller.role !== "producer") actions.push(el("button", { type: "button", onclick: () => act(() => api(path, { method: "PATCH", body: { changeset: { retries: 1 } } }), draw) }, "Retry"));
    if ((job.state === "CREATED" || job.state === "ACTIVATED") && caller.role !== "worker") actions.push(el("button", { type: "button", class: "danger", onclick: () => confirm(`Cancel job ${key}?`) && act(() => api(path + "/cancel", { method: "POST" }), draw) }, "Cancel"));
    const record = Object.entries(job).filter(([k]) => k !== "variables" && k !== "customHeaders");
    show(el("h1", {}, `Job ${key}`), el("div", { class: "toolbar" }, actions),
      why ? explanation(why) : null,
      el("section", { class: "card" }, el("dl", { class: "record" }, record.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v === null ? "—" : String(v))]))),
      el("details", { class: "card" }, el("summary", {}, `variables (${num(variables.length)} characters)`),
        el("pre", {}, variables.length > VARIABLES_SHOWN ? variables.slice(0, VARIABLES_SHOWN) + "\n… (cut)" : variables)),
      el("details", { class: "card" }, el("summary", {}, "custom headers"), el("pre", {}, JSON.stringify(job.customHeaders, null, 2))),
      el("section", { class: "card" }, el("h2", {}, "History"),
        history ? table([["at"], ["event"], ["activation", "num"], ["worker"], ["error"], ["retries left", "num"]],
          history.items.map((h) => el("tr", {}, el("td", {}, h.at), el("td", {}, h.event), el("td", { class: "num" }, num(h.activationCount)),
            el("td", {}, h.worker || ""), el("td", {}, [h.errorCode, h.errorMessage].filter(Boolean).join(": ")), el("td", { class: "num" }, num(h.retries)))))
          : el("p", { class: "muted" }, "No history available."),
        history && history.truncated ? el("p", { class: "muted" }, "Older entries were pruned.") : null));
  };
  await draw();
}

// Why it waits (GET /v2/jobs/{key}/explain): each reason in words, with its figures.
function reasonText(r) {
  switch (r.reason) {
    case "delayed": return `delayed by ${r.by === "retryBackOff" ? "its retry back-off" : "its runAt"} until ${r.until}`;
    case "tenantCap": case "typeCap": case "keyCap": case "perKeyCap": return `held by its ${HELD_BY[r.reason]}: ${num(r.active)} of ${num(r.limit)} active`;
    case "tenantRate": case "typeRate": return `held by its ${HELD_BY[r.reason]}: next token at ${r.nextTokenAt}`;
    case "tenantPaused": case "typePaused": return `held: ${HELD_BY[r.reason]}`;
    case "behindInKey": return `${plural(r.ahead, "job")} ahead of it in its fairness key`;
    case "otherKeysFirst": return `its lane serves fairness key ${r.nextKey} first (its turn)`;
    case "otherLanesFirst": return `other tenants' turns first (its lane's virtual time is ${r.vtimeLag} ahead)`;
    case "nobodyAsking": return `nobody is asking: no worker asked for its type for ${r.forS} s (last: ${r.lastAskedAt || "not in a day"})`;
    case "activated": return `running: activated by ${r.worker || "(unnamed)"} at ${r.activatedAt}, lease until ${r.leaseUntil}`;
    default: {
      const error = [r.errorCode, r.errorMessage].filter(Boolean).join(": ");
      return `${r.reason} at ${r.finishedAt}${error ? ` (${error})` : ""}; ${r.revivedBy || "nothing revives it"}`;
    }
  }
}

function explanation(e) {
  const items = e.reasons.length ? e.reasons.map((r) => el("li", { "data-reason": r.reason }, reasonText(r)))
    : [el("li", {}, "nothing holds it: it is taken on its lane's next turn")];
  const facts = [];
  if (e.state === "CREATED") facts.push(`activatable now: ${e.activatableNow ? "yes" : "no"} · the next activation of its lane takes it: ${e.nextInLane ? "yes" : "no"}`);
  if (e.priority) facts.push(`priority ${e.priority.priority}, effective ${e.priority.effective} now${e.priority.topAt ? `; top priority by aging at ${e.priority.topAt}` : ""}`);
  if (e.lane) facts.push(`its lane: weight ${num(e.lane.weight)} · ${pct(e.lane.realizedShare)} realised · ${pct(e.lane.entitledShare)} entitled (window) · ${pct(e.lane.configuredShare)} entitled now`);
  const held = Object.entries((e.lane && e.lane.heldInWindow) || {});
  if (held.length) facts.push(`its lane was held in the window: ${held.map(([r, f]) => `${HELD_BY[r] || r} ${pct(f)}`).join(", ")}`);
  if (e.queue) facts.push(`${num(e.queue.aheadInKey)}${e.queue.aheadInKeyAtLeast ? "+" : ""} ahead in its key · ${num(e.queue.readyInLane)}${e.queue.readyInLaneAtLeast ? "+" : ""} ready in its lane over ${plural(e.queue.keysBacklogged, "key")}`);
  if (e.state === "CREATED") facts.push(e.estimatedStartAt ? `estimated start (an estimate): ${e.estimatedStartAt}` : "estimated start: cannot be estimated (held, or its lane was not served)");
  return el("section", { class: "card", "aria-label": "why it waits" }, el("h2", {}, e.state === "CREATED" ? "Why it waits" : "Where it stands"),
    el("ul", { class: "reasons" }, items), ...facts.map((f) => el("p", { class: "muted" }, f)));
}

async function act(call, redraw) {
  try { await call(); notice(""); await redraw(); } catch (err) { notice(err.message); }
}

// Failures: FAILED and ERROR_THROWN jobs, retried one by one or all (in bounded batches).

async function failuresView(params) {
  const filters = { type: params.get("type") || "", tenantId: params.get("tenantId") || "" };
  // What the last "Retry all" said: kept across the redraw that follows it (each draw
  // builds its own status line, and the redraw after a retry would drop the answer).
  let said = "";
  const draw = async () => {
    const [failed, thrown] = await Promise.all([
      api("/v2/jobs" + q({ ...filters, state: "FAILED", limit: PAGE })),
      api("/v2/jobs" + q({ ...filters, state: "ERROR_THROWN", limit: PAGE })),
    ]);
    const canRetry = caller.role !== "producer";
    const retryOne = (j) => canRetry ? el("button", { type: "button", onclick: () => act(() => api(`/v2/jobs/${j.jobKey}`, { method: "PATCH", body: { changeset: { retries: 1 } } }), draw) }, "Retry") : null;
    const status = el("p", { class: "muted", "aria-live": "polite" }, said);
    const say = (text) => { said = text; status.textContent = text; };
    const retryAll = isAdmin() && failed.items.length ? el("button", { type: "button", class: "primary", onclick: async () => {
      const scope = [filters.type && `type ${filters.type}`, filters.tenantId && `tenant ${filters.tenantId}`].filter(Boolean).join(", ") || "every type and tenant";
      const matching = Object.fromEntries(Object.entries(filters).filter(([, v]) => v));
      let counted;
      try {
        counted = await api("/v2/jobs/retry", { method: "POST", body: { ...matching, limit: 100000, dryRun: true } });
      } catch (err) { say(err.message); return; }
      const n = `${counted.more ? "more than " : ""}${plural(counted.count, "FAILED job")}`;
      if (!confirm(`Retry ${n} of ${scope}?`)) return;
      let count = 0;
      try {
        for (;;) { // bounded batches: each call revives at most 1,000
          const answer = await api("/v2/jobs/retry", { method: "POST", body: { ...matching, limit: 1000 } });
          count += answer.count;
          say(`${num(count)} retried…`);
          if (!answer.more) break;
        }
        say(`${num(count)} jobs retried.`);
      } catch (err) { say(err.message); }
      await draw().catch(() => {});
    } }, "Retry all FAILED") : null;
    show(el("h1", {}, "Failures"),
      el("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); location.hash = "#/failures" + q({ type: e.target.elements.type.value, tenantId: e.target.elements.tenantId.value }); } },
        field("type", "type", filters.type), field("tenantId", "tenant", filters.tenantId), el("button", { type: "submit" }, "Filter")),
      el("section", { class: "card", "aria-label": "failed jobs" }, el("h2", {}, "FAILED (retries exhausted)"),
        el("div", { class: "toolbar" }, retryAll, status),
        jobTable(failed.items, retryOne), failed.nextCursor ? el("p", { class: "muted" }, el("a", { href: "#/jobs" + q({ ...filters, state: "FAILED" }) }, "more in the job browser")) : null),
      el("section", { class: "card", "aria-label": "thrown errors" }, el("h2", {}, "ERROR_THROWN (business errors)"), jobTable(thrown.items)));
  };
  try { await draw(); } catch (err) { show(el("h1", {}, "Failures"), el("p", { class: "error" }, err.message)); }
}

// The sum of a Prometheus series' samples in /metrics' text (every process's, when
// several serve: the exposition already sums them).
function metricSum(text, name) {
  let total = null;
  for (const line of text.split("\n")) {
    if (line.startsWith(name + " ") || line.startsWith(name + "{")) {
      const value = Number(line.slice(line.lastIndexOf(" ") + 1));
      if (Number.isFinite(value)) total = (total || 0) + value;
    }
  }
  return total;
}

async function workersView() {
  if (!isAdmin()) {
    show(el("h1", {}, "Workers"), el("p", { class: "muted" }, "The workers seen are shown to admin keys."));
    return;
  }
  await live(async () => {
    const [answer, metrics] = await Promise.all([
      api("/v2/workers"),
      fetch("/metrics", { headers: sessionStorage.getItem(KEY) ? { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` } : {}, cache: "no-store", credentials: "omit" })
        .then((r) => (r.ok ? r.text() : "")),
    ]);
    const waiters = metricSum(metrics, "jobfair_waiters");
    const streams = metricSum(metrics, "jobfair_streams");
    show(el("h1", {}, "Workers"),
      el("p", { "data-field": "waiting" }, waiters === null ? "Waiting now: unknown (no /metrics)"
        : `Waiting now: ${num(waiters)} long polls and streams, of which ${num(streams)} streams`),
      el("p", { class: "muted" }, `A worker not seen for ${age(GONE_AFTER_MS)} is marked so: it may be gone, or idle on a stream (a stream is seen when it opens and when it is given jobs).`),
      table([["type"], ["worker"], ["last seen"], ["last activated"]],
        answer.items.map((w) => {
          const ago = Date.now() - Date.parse(w.lastSeenAt);
          const gone = ago > GONE_AFTER_MS;
          return el("tr", { "data-worker": w.worker, class: gone ? "gone" : null }, el("td", {}, w.type),
            el("td", {}, w.worker, gone ? el("span", { class: "tag paused", "data-field": "gone" }, `not seen for ${age(ago)}`) : null),
            el("td", { title: w.lastSeenAt }, `${age(Math.max(0, ago))} ago`), el("td", { title: w.lastActivatedAt || "" }, w.lastActivatedAt ? `${age(Math.max(0, Date.now() - Date.parse(w.lastActivatedAt)))} ago` : "—"));
        })));
  });
}

// -- routing ---------------------------------------------------------------------------

function route() {
  stop();
  live.current = null;
  notice("");
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  for (const a of document.querySelectorAll("#nav a")) {
    const target = a.getAttribute("href").slice(2).split("/")[0];
    if ((parts[0] || "") === target) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const views = {
    "": () => overview(),
    tenants: () => (parts[1] !== undefined ? tenantView(parts.slice(1).join("/")) : tenantsView()),
    types: () => (parts[1] !== undefined ? typeView(parts.slice(1).join("/")) : typesView()),
    jobs: () => (parts[1] !== undefined ? jobView(parts[1]) : jobsView(params)),
    failures: () => failuresView(params),
    workers: () => workersView(),
  };
  const view = views[parts[0] || ""];
  if (!view) return show(el("h1", {}, "Not found"), el("p", {}, el("a", { href: "#/" }, "Back to the overview")));
  Promise.resolve(view()).catch((err) => { if (err.status !== 401) show(el("p", { class: "error" }, err.message)); });
  document.getElementById("view").focus({ preventScroll: true });
}

window.addEventListener("hashchange", route);
document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  caller = null;
  document.getElementById("who").textContent = "";
  signIn("");
});
start().catch((err) => { if (err.status !== 401) show(el("p", { class: "error" }, err.message)); });
