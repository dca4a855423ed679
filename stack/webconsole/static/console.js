// The console page: one EventSource for the overview, one for the selected booking's timeline. No framework, no
// build step: everything the page needs is served by the console itself (it works offline).
"use strict";

const $ = (selector) => document.querySelector(selector);
const HEADERS = { "Content-Type": "application/json", "X-Concierge-Console": "1" };
let supervised = false;
let timeline = null;
let selected = null;

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) td.className = cls;
  return td;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function time(iso) {
  if (!iso) return "-";
  const d = new Date(typeof iso === "number" ? iso * 1000 : iso);
  return isNaN(d) ? String(iso) : d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.floor(seconds);
  return s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s` : `${Math.floor(s / 3600)}h`;
}

async function send(method, url, body) {
  const response = await fetch(url, { method, headers: HEADERS, body: body === undefined ? undefined : JSON.stringify(body) });
  let payload = null;
  try { payload = await response.json(); } catch (e) { payload = null; }
  return { ok: response.ok, status: response.status, body: payload };
}

function describeError(result) {
  const body = result.body || {};
  if (Array.isArray(body.detail)) {
    return body.detail.map((d) => `${(d.loc || []).filter((p) => p !== "body").join(".")}: ${d.msg}`).join("; ");
  }
  if (body.error) return `${body.error.code}: ${body.error.message || ""}`;
  return `HTTP ${result.status}`;
}

// ------------------------------------------------------------------------------------------------ overview

function renderServices(services) {
  fill($("#services tbody"), services.map((s) => {
    const tr = document.createElement("tr");
    tr.dataset.instance = s.name;
    const ready = s.ready === true ? "ready" : s.ready === false ? `not ready (${s.detail})` : "-";
    tr.append(cell(s.name), cell(s.state, s.state), cell(ready, s.ready ? "ok" : "bad"), cell(s.pid),
      cell(s.restarts), cell(duration(s.uptime_s)));
    const controls = document.createElement("td");
    controls.className = "control";
    for (const op of ["kill", "stop", "start"]) {
      const button = document.createElement("button");
      button.textContent = op;
      button.dataset.op = op;
      button.dataset.target = s.name;
      button.className = op === "start" ? "" : "danger";
      button.addEventListener("click", () => control(op, s.name));
      controls.append(button);
    }
    tr.append(controls);
    return tr;
  }));
  document.querySelectorAll(".control").forEach((el) => el.classList.toggle("hidden", !supervised));
}

function renderResilience(circuits, bulkheads) {
  fill($("#circuits tbody"), circuits.map((c) => {
    const tr = document.createElement("tr");
    tr.append(cell(c.instance), cell(c.name), cell(c.state, c.state));
    return tr;
  }));
  fill($("#bulkheads tbody"), bulkheads.map((b) => {
    const tr = document.createElement("tr");
    tr.append(cell(b.instance), cell(b.name), cell(`${b.in_use} / ${b.max}`, b.in_use >= b.max ? "bad" : ""));
    return tr;
  }));
}

function renderQueue(data) {
  const dl = $("#queue");
  if (!data.queue) {
    dl.replaceChildren(Object.assign(document.createElement("dd"), { textContent: data.queue_error || "unknown" }));
  } else {
    const items = [];
    for (const key of ["depth", "max_size", "in_flight", "delayed", "oldest_age_s", "recovered_total", "dead_lettered_total", "dlq_depth"]) {
      items.push(Object.assign(document.createElement("dt"), { textContent: key.replaceAll("_", " ") }));
      items.push(Object.assign(document.createElement("dd"), { textContent: String(data.queue[key]), id: `queue-${key}` }));
    }
    dl.replaceChildren(...items);
  }
  $("#dlq").replaceChildren(...(data.dlq.length ? data.dlq.map((e) => Object.assign(document.createElement("li"), {
    textContent: `${e.thread_id} · ${e.reason} · ${e.attempts} attempts · ${e.error}`,
  })) : [Object.assign(document.createElement("li"), { textContent: "empty", className: "muted" })]));
}

// llm-api's faults are per model: the ones that are set, in a few words each
function modelFaults(f) {
  const parts = [];
  if (f.first_token_latency_s) parts.push(`first token ${f.first_token_latency_s}s`);
  if (f.token_delay_s) parts.push(`${f.token_delay_s}s a token`);
  if (f.error_rate || f.error_count) parts.push(`error ${f.error_status}${f.error_count ? ` × next ${f.error_count}` : ""}${f.error_rate ? ` rate ${f.error_rate}` : ""}`);
  for (const [key, words] of [["hang", "hang"], ["loop_tool", "loop"], ["context_length_exceeded", "context exceeded"]]) if (f[key]) parts.push(words);
  if (f.cut_after_tokens !== null && f.cut_after_tokens !== undefined) parts.push(`cut after ${f.cut_after_tokens}`);
  if (f.malformed_tool_args) parts.push(`args ${f.malformed_tool_args}`);
  if (f.rpm || f.tpm) parts.push(`limits ${f.rpm ?? "-"} rpm ${f.tpm ?? "-"} tpm`);
  return parts.join(" · ");
}

function renderFaults(faults) {
  $("#faults").replaceChildren(...Object.entries(faults).map(([name, f]) => {
    const p = document.createElement("p");
    p.dataset.provider = name;
    let active = Boolean(f && (f.latency_s || f.error_rate || f.hang));
    if (!f) p.textContent = `${name}: unknown (no admin routes)`;
    else if (f.models) {
      const set = Object.entries(f.models).map(([model, m]) => [model, modelFaults(m)]).filter(([, words]) => words);
      active = set.length > 0;
      p.textContent = active ? `${name}: ${set.map(([model, words]) => `${model}: ${words}`).join("; ")}` : `${name}: no faults`;
    } else if (!active) p.textContent = `${name}: no faults`;
    else p.textContent = `${name}: latency ${f.latency_s}s · error rate ${f.error_rate} · hang ${f.hang ? "on" : "off"}`;
    p.className = active ? "warn" : "muted";
    return p;
  }));
}

function renderBookings(data) {
  $("#bookings-error").textContent = data.bookings_error ? `bookings: ${data.bookings_error}` : "";
  fill($("#bookings tbody"), (data.bookings || []).map((b) => {
    const tr = document.createElement("tr");
    tr.className = "booking" + (b.booking_id === selected ? " selected" : "");
    tr.dataset.bookingId = b.booking_id;
    tr.append(cell(b.booking_id), cell(b.status, b.status), cell(time(b.created_at)), cell(time(b.updated_at)));
    const actions = document.createElement("td");
    if (!["confirmed", "failed", "cancelled"].includes(b.status)) {
      const button = document.createElement("button");
      button.textContent = "cancel";
      button.className = "danger";
      button.dataset.cancel = b.booking_id;
      button.addEventListener("click", (event) => { event.stopPropagation(); cancel(b.booking_id); });
      actions.append(button);
    }
    tr.append(actions);
    tr.addEventListener("click", () => follow(b.booking_id));
    return tr;
  }));
}

function render(data) {
  supervised = data.supervised;
  $("#mode").textContent = supervised ? "under concierge up (supervised)" : "watching (no supervisor: kill/stop/start hidden)";
  $("#clock").textContent = time(data.at);
  renderServices(data.services);
  renderResilience(data.circuits, data.bulkheads);
  renderQueue(data);
  renderFaults(data.faults);
  renderBookings(data);
}

function watch() {
  const source = new EventSource("/api/stream");
  source.addEventListener("overview", (event) => render(JSON.parse(event.data)));
  source.onerror = () => { $("#mode").textContent = "console unreachable; reconnecting…"; };
}

// ------------------------------------------------------------------------------------------------ timeline

const SKIP = new Set(["kind", "at", "instance", "booking_id"]);

function entryLine(entry) {
  const li = document.createElement("li");
  li.className = entry.kind + (entry.replayed ? " replayed" : "");
  li.dataset.kind = entry.kind;
  const kind = Object.assign(document.createElement("span"), { className: "kind", textContent: entry.kind });
  const details = Object.entries(entry).filter(([k, v]) => !SKIP.has(k) && v !== null && v !== undefined && v !== "")
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
  li.append(`${time(entry.at)}  `, kind, ` ${entry.instance || ""}  ${details}`);
  return li;
}

function follow(bookingId) {
  if (timeline) timeline.close();
  selected = bookingId;
  $("#timeline-id").textContent = bookingId;
  const list = $("#timeline");
  list.replaceChildren();
  document.querySelectorAll("tr.booking").forEach((tr) => tr.classList.toggle("selected", tr.dataset.bookingId === bookingId));
  timeline = new EventSource(`/api/bookings/${encodeURIComponent(bookingId)}/events`);
  timeline.onmessage = (event) => list.append(entryLine(JSON.parse(event.data)));
  timeline.addEventListener("end", () => { timeline.close(); list.dataset.complete = "true"; });
  timeline.addEventListener("unknown", () => { timeline.close(); list.append(Object.assign(document.createElement("li"), { textContent: "unknown booking" })); });
}

// ------------------------------------------------------------------------------------------------ buttons

async function book(event) {
  event.preventDefault();
  const form = new FormData($("#book-form"));
  const body = { city: form.get("city"), checkin: form.get("checkin"), nights: Number(form.get("nights")),
    guests: Number(form.get("guests")), card: form.get("card") };
  const result = await send("POST", "/api/bookings", body);
  const out = $("#book-result");
  if (result.ok) {
    out.textContent = `booked ${result.body.booking_id} (${result.body.status})`;
    out.dataset.bookingId = result.body.booking_id;
    follow(result.body.booking_id);
  } else {
    out.textContent = `refused: ${describeError(result)}`;
  }
}

async function cancel(bookingId) {
  const result = await send("POST", `/api/bookings/${encodeURIComponent(bookingId)}/cancel`);
  $("#book-result").textContent = result.ok ? `cancel of ${bookingId}: ${result.body.status}` : `cancel refused: ${describeError(result)}`;
}

async function control(op, target) {
  $("#mode").textContent = `${op} ${target}…`;
  const result = await send("POST", `/api/services/${encodeURIComponent(target)}/${op}`);
  $("#mode").textContent = result.ok ? `${op} ${target}: done` : `${op} ${target}: ${describeError(result)}`;
}

async function inject(event) {
  event.preventDefault();
  const form = new FormData($("#fault-form"));
  const body = { latency_s: Number(form.get("latency_s")), error_rate: Number(form.get("error_rate")), hang: form.get("hang") === "on" };
  const result = await send("PUT", `/api/faults/${form.get("provider")}`, body);
  $("#fault-result").textContent = result.ok ? `${form.get("provider")}: faults set` : `refused: ${describeError(result)}`;
}

async function clearFaults() {
  const provider = new FormData($("#fault-form")).get("provider");
  const result = await send("DELETE", `/api/faults/${provider}`);
  $("#fault-result").textContent = result.ok ? `${provider}: faults cleared` : `refused: ${describeError(result)}`;
}

function init() {
  const checkin = new Date(Date.now() + 40 * 86400 * 1000);
  $("#book-form [name=checkin]").value = checkin.toISOString().slice(0, 10);
  $("#book-form").addEventListener("submit", book);
  $("#fault-form").addEventListener("submit", inject);
  $("#clear-faults").addEventListener("click", clearFaults);
  watch();
}

init();
