// The console page: one EventSource for the overview, one for the selected booking's timeline. No framework, no
// build step: everything the page needs is served by the console itself (it works offline).
"use strict";

const $ = (selector) => document.querySelector(selector);
const HEADERS = { "Content-Type": "application/json", "X-Concierge-Console": "1" };
let supervised = false;
let operator = false;
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

// No login (or a session gone): the console serves its login page at "/".
function toLogin() { window.location.assign("/"); }

async function send(method, url, body) {
  const response = await fetch(url, { method, headers: HEADERS, body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 401) toLogin();
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
  document.querySelectorAll(".control").forEach((el) => el.classList.toggle("hidden", !supervised || !operator));
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

// hotel-api's faults change what it answers: a price change and a name suffix (concierge fault --price-change)
function answerFaults(f) {
  const parts = [];
  if (f.price_change_pct) parts.push(`price change ${f.price_change_pct > 0 ? "+" : ""}${f.price_change_pct}%`);
  if (f.name_suffix) parts.push(`name suffix (${f.name_suffix.length} chars)`);
  return parts;
}

function renderFaults(faults) {
  $("#faults").replaceChildren(...Object.entries(faults).map(([name, f]) => {
    const p = document.createElement("p");
    p.dataset.provider = name;
    let active = Boolean(f && (f.latency_s || f.error_rate || f.hang || (!f.models && answerFaults(f).length)));
    if (!f) p.textContent = `${name}: unknown (no admin routes)`;
    else if (f.models) {
      const set = Object.entries(f.models).map(([model, m]) => [model, modelFaults(m)]).filter(([, words]) => words);
      active = set.length > 0;
      p.textContent = active ? `${name}: ${set.map(([model, words]) => `${model}: ${words}`).join("; ")}` : `${name}: no faults`;
    } else if (!active) p.textContent = `${name}: no faults`;
    else p.textContent = `${name}: ${[`latency ${f.latency_s}s · error rate ${f.error_rate} · hang ${f.hang ? "on" : "off"}`, ...answerFaults(f)].join(" · ")}`;
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
  source.onerror = async () => {
    $("#mode").textContent = "console unreachable; reconnecting…";
    try { if ((await fetch("/api/session")).status === 401) { source.close(); toLogin(); } } catch (e) { /* unreachable: keep trying */ }
  };
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

// ------------------------------------------------------------------------------------------------ chat panel
// One EventSource on the chat's journal (relayed by the console from concierge-agent, whichever replica answers):
// the model's tokens grow the answer being written, tool calls and results are a line each, an approval is a card
// with its two buttons, the booking's own steps are relayed as they happen (click one: its timeline below).

let chatId = null;
let chatSource = null;
let writing = null; // the assistant answer tokens are being appended to, and the attempt they belong to
const toolNames = new Map(); // a result names only the call it answers: each call's tool by its id

function chatLine(cls, text, kind) {
  const li = Object.assign(document.createElement("li"), { className: cls, textContent: text });
  li.dataset.kind = kind;
  $("#chat-log").append(li);
  li.scrollIntoView({ block: "nearest" });
  return li;
}

function args(value) {
  if (!value || typeof value !== "object") return value === undefined ? "" : String(value);
  return Object.entries(value).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ");
}

function resultSummary(entry) {
  let result = entry.result !== undefined ? entry.result : entry.content;
  if (typeof result === "string") { try { result = JSON.parse(result); } catch (e) { return result.slice(0, 160); } }
  if (result && typeof result === "object") {
    if (result.error) return `error ${result.error.code}: ${result.error.message || ""}`;
    if (Array.isArray(result.offers)) return `${result.found ?? result.offers.length} offer(s)`;
    if (result.booking_id) return `booking ${result.booking_id} ${result.status || ""}`;
  }
  return JSON.stringify(result).slice(0, 160);
}

function approvalCard(approval) {
  const id = approval.approval_id;
  let li = document.querySelector(`#chat-log li.approval[data-approval-id="${CSS.escape(id)}"]`);
  if (li) return li;
  li = chatLine("approval", "", "approval_requested");
  li.dataset.approvalId = id;
  // the server's own terms first; the hotel after them, quoted behind hotel-api's label (docs/concierge.md)
  const quoted = (value) => JSON.stringify(String(value ?? ""));
  const currency = /^[A-Z]{3}$/.test(String(approval.currency)) ? approval.currency : quoted(approval.currency);
  const money = (value) => (typeof value === "number" ? value.toFixed(2) : quoted(value));
  const cancel = approval.action === "cancel";
  const refund = cancel && approval.refund
    ? `, refund ${money(approval.refund.amount)} ${currency} (fee ${money(approval.refund.fee)} ${currency})` : "";
  const what = cancel ? `Cancel booking ${approval.booking_id}` : "Book";
  const hotel = Object.assign(document.createElement("span"), {
    className: "third-party",
    textContent: `hotel ${quoted(approval.hotel_id)}, named by hotel-api ${quoted(approval.hotel_name)}`,
  });
  li.append(`${what}: ${approval.checkin} → ${approval.checkout}, ${approval.guests} guest(s), ` +
    `total ${money(approval.total_price)} ${currency}${refund}? (expires ${time(approval.expires_at)})`,
    document.createElement("br"), hotel, document.createElement("br"));
  for (const [label, approve] of [["Approve", true], ["Refuse", false]]) {
    const button = Object.assign(document.createElement("button"), { textContent: label, type: "button" });
    button.dataset.approve = String(approve);
    button.className = approve ? "" : "danger";
    button.addEventListener("click", () => decide(id, approve, li));
    button.disabled = true;
    li.append(button);
  }
  parked(id, li);
  return li;
}

// the entry is written as the turn stops: the buttons work once the chat says it waits for this approval
async function parked(id, li) {
  for (let tries = 0; tries < 10 && li.isConnected && !li.classList.contains("decided"); tries++) {
    const result = await send("GET", `/api/chats/${encodeURIComponent(chatId)}?wait=20`);
    if (result.ok && result.body.status !== "running") {
      const waiting = result.body.pending_approval && result.body.pending_approval.approval_id === id;
      li.querySelectorAll("button").forEach((b) => { b.disabled = !waiting; });
      li.dataset.ready = String(waiting);
      return;
    }
  }
}

function approvalDecided(id, approve) {
  const li = document.querySelector(`#chat-log li.approval[data-approval-id="${CSS.escape(id)}"]`);
  if (!li) return;
  li.querySelectorAll("button").forEach((b) => b.remove());
  li.classList.add("decided");
  li.dataset.decision = approve ? "approved" : "refused";
  li.append(approve ? "approved" : "refused");
}

function bookingStatus(bookingId, kind) {
  const out = $("#chat-booking");
  out.dataset.bookingId = bookingId;
  if (["confirmed", "failed", "cancelled"].includes(kind)) {
    out.dataset.status = kind;
    out.className = kind;
    out.textContent = `booking ${bookingId}: ${kind}`;
  } else if (!out.dataset.status || out.dataset.bookingId !== bookingId) {
    out.dataset.status = "";
    out.className = "muted";
    out.textContent = `booking ${bookingId}: ${kind}…`;
  }
}

function chatEntry(entry) {
  const kind = entry.kind;
  if (kind === "token") {
    // a token carries its model call and that call's attempt: a new attempt is the answer starting over
    const attempt = `${entry.call}/${entry.attempt}`;
    if (!writing || writing.attempt !== attempt) {
      if (writing) chatLine("tool lost", `the answer broke off; the model was asked again (attempt ${entry.attempt})`, "retry");
      writing = { li: chatLine("assistant", "", "assistant"), attempt };
      writing.li.dataset.streaming = "true";
    }
    writing.li.textContent += entry.text ?? entry.content ?? "";
    return;
  }
  if (kind === "assistant_message") {
    const li = writing ? writing.li : chatLine("assistant", "", "assistant");
    const said = entry.text ?? entry.content;
    if (said) li.textContent = said;
    li.dataset.streaming = "false";
    writing = null;
    return;
  }
  writing = kind === "user_message" || kind === "turn_finished" ? null : writing;
  if (kind === "user_message") chatLine("user", entry.text ?? entry.content ?? "", kind);
  else if (kind === "tool_call") {
    toolNames.set(entry.tool_call_id, entry.name);
    chatLine("tool", `→ ${entry.name}(${args(entry.arguments ?? entry.args)})`, kind);
  } else if (kind === "tool_result") {
    chatLine("tool", `← ${entry.name || toolNames.get(entry.tool_call_id) || "tool"}: ${resultSummary(entry)}`, kind);
  }
  else if (kind === "approval_requested") approvalCard(entry.approval || entry);
  else if (kind === "approval_decided") approvalDecided(entry.approval_id, entry.approve ?? entry.approved);
  else if (kind === "booking") {
    const inner = entry.entry && typeof entry.entry === "object" ? entry.entry : entry;
    const bookingId = entry.booking_id || inner.booking_id;
    const step = inner.booking_kind || (inner === entry ? entry.booking_entry_kind : inner.kind) || inner.step || "";
    bookingStatus(bookingId, step);
    // the story, as `concierge book` tells it: steps as they start, replays, losses, the outcome (its timeline below)
    if (step === "step_finished" || (step === "call" && !inner.replayed)) return;
    const li = chatLine("booking", `booking ${bookingId}: ${step}${inner.step && step !== inner.step ? ` ${inner.step}` : ""}`, kind);
    li.dataset.bookingId = bookingId;
    li.addEventListener("click", () => follow(bookingId));
  } else if (kind === "turn_finished") {
    chatLine("turn", `turn ${entry.outcome}${entry.error ? `: ${entry.error.code || JSON.stringify(entry.error)}` : ""}`, kind).dataset.outcome = entry.outcome;
    $("#chat-send").disabled = false;
  } else if (["owner_lost", "resumed", "handed_off"].includes(kind)) {
    chatLine("tool lost", `${kind} ${entry.instance || entry.owner || ""}`, kind);
  }
}

function openChat(id) {
  if (chatSource) chatSource.close();
  chatId = id;
  writing = null;
  $("#chat-id").textContent = id;
  $("#chat-log").replaceChildren();
  Object.assign($("#chat-booking"), { textContent: "", className: "muted" });
  delete $("#chat-booking").dataset.status;
  $("#chat-panel").dataset.chatId = id;
  chatSource = new EventSource(`/api/chats/${encodeURIComponent(id)}/events`);
  chatSource.onmessage = (event) => chatEntry(JSON.parse(event.data));
  chatSource.addEventListener("unknown", () => { chatSource.close(); chatLine("turn", "unknown chat", "unknown"); });
}

async function loadChats() {
  const result = await send("GET", "/api/chats");
  if (!result.ok) return;
  const list = $("#chat-list");
  const chats = (result.body && result.body.chats) || [];
  list.replaceChildren(Object.assign(document.createElement("option"), { value: "", textContent: "recent chats…" }),
    ...chats.map((c) => Object.assign(document.createElement("option"), { value: c.chat_id, textContent: `${c.chat_id} · ${c.status}` })));
}

async function newChat() {
  const result = await send("POST", "/api/chats");
  if (!result.ok) { $("#chat-result").textContent = `refused: ${describeError(result)}`; return null; }
  openChat(result.body.chat_id);
  loadChats();
  return result.body.chat_id;
}

async function say(event) {
  event.preventDefault();
  const input = $("#chat-text");
  const text = input.value;
  if (!text.trim()) return;
  const id = chatId || await newChat();
  if (!id) return;
  const result = await send("POST", `/api/chats/${encodeURIComponent(id)}/messages`, { text });
  const out = $("#chat-result");
  if (result.ok) {
    input.value = "";
    out.textContent = `turn ${result.body.turn_id}: ${result.body.status}`;
    out.dataset.turnId = result.body.turn_id;
  } else {
    out.textContent = `refused: ${describeError(result)}`;
  }
}

async function decide(approvalId, approve, li) {
  li.querySelectorAll("button").forEach((b) => { b.disabled = true; });
  const body = approve ? { approve, payment_token: $("#chat-card").value } : { approve };
  const result = await send("POST", `/api/chats/${encodeURIComponent(chatId)}/approvals/${encodeURIComponent(approvalId)}`, body);
  $("#chat-result").textContent = result.ok ? `approval ${approvalId}: ${approve ? "approved" : "refused"}` : `refused: ${describeError(result)}`;
  if (!result.ok) li.querySelectorAll("button").forEach((b) => { b.disabled = false; });
}

// A chaos run (`concierge chaos` started by the console): its output polled while it runs, the verdict at the end.
let chaosPoll = null;

function showChaos(run) {
  $("#chaos-output").textContent = run.lines.join("\n");
  const out = $("#chaos-result");
  out.dataset.state = run.running ? "running" : run.exit_code === null ? "idle" : "done";
  out.dataset.exitCode = run.exit_code === null ? "" : String(run.exit_code);
  if (run.running) out.textContent = `running: ${run.command}`;
  else if (run.exit_code !== null) out.textContent = `${run.command}: exit ${run.exit_code} (${run.exit_code === 0 ? "promise kept" : "see the verdict"})`;
  if (!run.running && chaosPoll) { clearInterval(chaosPoll); chaosPoll = null; }
  if (run.running && !chaosPoll) chaosPoll = setInterval(pollChaos, 1000);
}

async function pollChaos() {
  const result = await send("GET", "/api/chaos");
  if (result.ok) showChaos(result.body);
}

async function startChaos(event) {
  event.preventDefault();
  const form = new FormData($("#chaos-form"));
  const body = { duration_s: Number(form.get("duration_s")), clients: Number(form.get("clients")) };
  if (form.get("seed") !== "") body.seed = Number(form.get("seed"));
  const result = await send("POST", "/api/chaos", body);
  if (result.ok) showChaos(result.body);
  else $("#chaos-result").textContent = `refused: ${describeError(result)}`;
}

async function stopChaos() {
  const result = await send("DELETE", "/api/chaos");
  if (!result.ok) $("#chaos-result").textContent = `stop refused: ${describeError(result)}`;
}

// Who the page is for: a person sees their own bookings and chats, the operator everything and its buttons.
async function whoami() {
  const result = await send("GET", "/api/session");
  if (!result.ok) return;
  operator = result.body.operator;
  $("#who").textContent = operator ? `operator (${result.body.via})` : `logged in as ${result.body.who}`;
  document.querySelectorAll(".operator").forEach((el) => el.classList.toggle("hidden", !operator));
  if (operator) pollChaos();
}

async function logout() {
  await send("POST", "/api/logout");
  toLogin();
}

function init() {
  const checkin = new Date(Date.now() + 40 * 86400 * 1000);
  $("#book-form [name=checkin]").value = checkin.toISOString().slice(0, 10);
  $("#book-form").addEventListener("submit", book);
  $("#fault-form").addEventListener("submit", inject);
  $("#clear-faults").addEventListener("click", clearFaults);
  $("#chat-form").addEventListener("submit", say);
  $("#chat-new").addEventListener("click", newChat);
  $("#chat-list").addEventListener("change", (event) => { if (event.target.value) openChat(event.target.value); });
  loadChats();
  $("#chaos-form").addEventListener("submit", startChaos);
  $("#chaos-stop").addEventListener("click", stopChaos);
  $("#logout").addEventListener("click", logout);
  whoami();
  watch();
}

init();

// ---------------------------------------------------------------------------------------------- cascade demo
let demoStream = null;

function followDemo() {
  if (demoStream) demoStream.close();
  const out = $("#demo-output");
  out.textContent = "";
  demoStream = new EventSource("/api/demo/stream");
  demoStream.onmessage = (event) => {
    out.textContent += event.data + "\n";
    out.scrollTop = out.scrollHeight;
  };
  demoStream.addEventListener("end", (event) => {
    const code = JSON.parse(event.data).exit_code;
    out.textContent += code === null ? "" : `(demo ended, exit ${code})\n`;
    demoStream.close();
    demoStream = null;
  });
}

async function startDemo(layers) {
  const answer = await send("POST", "/api/demo/cascade", { layers });
  if (!answer.ok) {
    $("#demo-output").textContent = (answer.body && answer.body.error && answer.body.error.message) || `HTTP ${answer.status}`;
    return;
  }
  followDemo();
}

$("#demo-on").addEventListener("click", () => startDemo("on"));
$("#demo-off").addEventListener("click", () => startDemo("off"));
$("#demo-stop").addEventListener("click", () => send("DELETE", "/api/demo"));
