// The console: overview (streams, subscriptions, charts), editor, automaton,
// live matches and a box to send test events. Plain ES modules, no build.

import { api, ApiError, AuthError, setToken, token } from "./api.js";
import { formatDuration, formatNumber, formatSeconds, percentile, rate, Sparkline } from "./charts.js";
import { Editor } from "./editor.js";
import { renderAutomaton, updateCounts } from "./graph.js";
import { backfillBadge, backfillRunning, drawBackfill, tryOnHistory } from "./history.js";
import { KEEP, Matches } from "./matches.js";

const $ = (sel) => document.querySelector(sel);
const POLL_MS = 1000;
const LIST_EVERY = 5; // refresh the stream and subscription lists every this many polls
const LAG_TITLE = "how far the engine's epoch is behind the newest event received, in the events' own time: "
  + "events waiting to be processed; idle when none came in or wait";

// The README's first subscription and the six events of examples/example9.jsonl.
const EXAMPLE_QUERY = `SELECT Name, Price_1 AS Before, Price AS After
FROM Stock NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock
PUBLISH Rising`;
const EXAMPLE_EVENTS = [
  [33000000, "IBM", 90, 15000], [33300000, "IBM", 85, 7000], [33420000, "Dell", 40, 11000],
  [33660000, "IBM", 81, 8000], [33780000, "MSFT", 25, 6000], [33840000, "IBM", 91, 9000],
].map(([t, Name, Price, Volume]) => JSON.stringify({ stream: "Stock", t0: t, t1: t, Name, Price, Volume })).join("\n");

const state = {
  selected: null, // subscription id
  backfill: null, // the selected subscription's backfill (GET /subscriptions/{id}), null when none
  previous: null, // last /stats reading
  polls: 0,
  streams: [],
  subs: [],
  subCount: -1,
  authWaiting: null,
  scopes: null, // what the token may do (GET /whoami: effective_scopes); null until known
};

const charts = {};
const matches = new Matches($("#matches-panel"));
const editor = new Editor($("#editor"), { onResult: showValidation });

// ------------------------------------------------------------------ auth

// Run `fn`; if the server wants a token, ask for one and run it again.
async function authed(fn) {
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (!(err instanceof AuthError)) throw err;
      await askToken(token() ? "That token was not accepted." : "");
    }
  }
}

function askToken(message) {
  if (!state.authWaiting) {
    const dialog = $("#login");
    $("#login-error").textContent = message;
    state.authWaiting = new Promise((resolve) => {
      dialog.addEventListener("close", async () => {
        setToken($("#token").value.trim());
        $("#logout").hidden = !token();
        state.authWaiting = null;
        await loadScopes().catch(() => {}); // another token: other scopes
        resolve();
      }, { once: true });
    });
    dialog.showModal();
  }
  return state.authWaiting;
}

// What the token may do (GET /whoami): the page shows only that. Elements marked
// data-scope="watch|manage|ingest|metrics" are hidden without the scope (admin has all).
async function loadScopes() {
  const me = await api("GET", "/whoami");
  state.scopes = new Set(me.effective_scopes);
  for (const el of document.querySelectorAll("[data-scope]")) el.hidden = !allowed(el.dataset.scope);
  const who = $("#whoami");
  who.hidden = !me.auth;
  who.textContent = me.auth ? `${me.name}: ${me.effective_scopes.join(", ")}` : "";
  who.title = me.own || me.prefixes.length
    ? `reaches ${[me.own ? "the subscriptions it registered" : "", ...me.prefixes.map((p) => `those named ${p}…`)]
      .filter(Boolean).join(" and ")}` : "";
  const noWatch = $("#no-watch");
  noWatch.hidden = allowed("watch");
  noWatch.textContent = allowed("watch") ? "" : `The token ${me.name} has no watch scope (its scopes: `
    + `${me.scopes.join(", ")}): streams, subscriptions and their matches are not shown. Forget it and enter `
    + `a token with watch to see them.`;
  return me;
}

function allowed(scope) {
  return state.scopes === null || state.scopes.has(scope);
}

// ------------------------------------------------------------------ overview

function setupCharts() {
  const parent = $("#charts");
  charts.events = new Sparkline(parent, "events", "events/s");
  charts.witnesses = new Sparkline(parent, "witnesses", "witnesses/s");
  charts.queue = new Sparkline(parent, "queue", "queue depth");
  charts.lag = new Sparkline(parent, "lag", "epoch lag", formatDuration);
  charts.lag.el.title = LAG_TITLE;
  charts.p99 = new Sparkline(parent, "p99", "engine latency p99", formatSeconds);
}

async function poll() {
  const s = await authed(() => api("GET", `/stats?limit=500`));
  const prev = state.previous;
  const dt = prev ? s.time - prev.time : 0;
  const eventsPerSecond = prev ? rate(s.events, prev.events, dt) : null;
  charts.events.push(eventsPerSecond);
  charts.witnesses.push(prev ? rate(s.witnesses, prev.witnesses, dt) : null);
  charts.queue.push(s.queue_depth);
  // The lag behind the newest event received, never behind the clock: an idle server's epoch falls behind
  // the clock by the time since its last event (7.4 s, then 35.9 s, as if the engine lagged), and
  // events that carry their own times (a replay, the README's 1970 quotes) by however old they are.
  // Idle: nothing came in since the last reading and nothing waits.
  const lag = s.stream_lag_seconds ?? 0;
  const idle = s.queue_depth === 0 && lag === 0 && !eventsPerSecond;
  charts.lag.push(lag, idle ? "idle" : lag === 0 ? "0 s" : undefined);
  charts.p99.push(percentile(s.latency_buckets, prev && prev.latency_buckets));
  const changed = state.subCount >= 0 && s.subscription_count !== state.subCount;
  if (changed || state.polls % LIST_EVERY === 0) await refreshLists();
  state.subCount = s.subscription_count;
  drawStreams(s, prev, dt);
  drawSubscriptions(s, prev, dt);
  state.previous = s;
  state.polls++;
  if (state.selected) {
    try {
      if (backfillRunning(state.backfill)) await loadBackfill(state.selected);
      if (changed) { // resubscription links may have come or gone
        await drawGraph(state.selected);
      } else {
        const c = await api("GET", `/subscriptions/${encodeURIComponent(state.selected)}/automaton/instances`);
        updateCounts($("#graph"), c.instances);
      }
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) select(null);
      else throw err;
    }
  }
}

async function refreshLists() {
  [state.streams, state.subs] = await Promise.all([api("GET", "/streams"), api("GET", "/subscriptions?limit=500")]);
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

// A cell for a name or a list of them: cut with an ellipsis when long, the whole text on hover.
function nameCell(text, cls = "") {
  const td = cell(text, `${cls} cut`.trim());
  td.title = text;
  return td;
}

function drawStreams(s, prev, dt) {
  const rows = state.streams.map((st) => {
    const tr = document.createElement("tr");
    tr.dataset.stream = st.name;
    const r = prev ? rate(s.streams[st.name] || 0, prev.streams[st.name] || 0, dt) : null;
    const schema = Object.entries(st.schema).map(([k, v]) => `${k} ${v}`).join(", ");
    tr.append(nameCell(st.name + (st.kind === "published" ? " ⇐" : ""), "name"), nameCell(schema, "schema"),
      cell(st.kind === "declared" ? formatNumber(r) : "", "num"));
    tr.dataset.kind = st.kind === "published" ? "published by a subscription" : "declared input stream";
    return tr;
  });
  $("#streams tbody").replaceChildren(...rows);
}

function drawSubscriptions(s, prev, dt) {
  $("#sub-count").textContent = `(${s.subscription_count})`;
  const rows = state.subs.map((sub) => {
    const now = s.subscriptions[sub.id] || { witnesses: 0, instances: sub.instances };
    const before = prev && prev.subscriptions[sub.id];
    const tr = document.createElement("tr");
    tr.dataset.sid = sub.id;
    tr.classList.toggle("selected", sub.id === state.selected);
    const last = cell("");
    if (allowed("manage")) { // a token without manage cannot delete: no button
      const del = document.createElement("button");
      del.textContent = "delete";
      del.className = "quiet delete";
      del.addEventListener("click", (ev) => { ev.stopPropagation(); removeSubscription(sub.id, del); });
      last.append(del);
    }
    const idCell = nameCell(sub.id, "name");
    if (now.inexact !== undefined) { // it lost partial matches when the server shed state: its witnesses may lack some
      const badge = Object.assign(document.createElement("span"), { className: "badge inexact", textContent: "inexact" });
      badge.title = `lost ${now.inexact} partial matches when the server shed state: its witnesses may lack some (see /health)`;
      idCell.append(" ", badge);
    }
    if (sub.broken) { // its stored query no longer compiles against the configuration: kept, not run
      const badge = Object.assign(document.createElement("span"), { className: "badge broken", textContent: "broken" });
      badge.title = `${sub.broken.reason}; ${sub.broken.fix}`;
      idCell.append(" ", badge);
      tr.classList.add("broken");
    }
    const backfill = backfillBadge(sub.id === state.selected && state.backfill ? state.backfill : sub.backfill);
    if (backfill) idCell.append(" ", backfill); // registered with a start in the history: how far it is
    tr.append(idCell, nameCell(sub.name || ""), nameCell(sub.outputs.join(", ")),
      cell(formatNumber(now.instances), "num"),
      cell(before ? formatNumber(rate(now.witnesses, before.witnesses, dt)) : "–", "num"), last);
    tr.addEventListener("click", () => select(sub.id));
    return tr;
  });
  $("#subscriptions tbody").replaceChildren(...rows);
}

// ------------------------------------------------------------------ selection and automaton

async function select(sid) {
  if (sid && sid === state.selected) { // again: redraw, keep the matches
    await authed(() => drawGraph(sid));
    return;
  }
  state.selected = sid;
  for (const tr of document.querySelectorAll("#subscriptions tbody tr")) {
    tr.classList.toggle("selected", tr.dataset.sid === sid);
  }
  state.backfill = null;
  drawBackfill(null);
  if (!sid) {
    matches.watch(null);
    $("#graph-title").textContent = "select a subscription";
    $("#graph").replaceChildren();
    return;
  }
  const broken = (state.subs.find((s) => s.id === sid) || {}).broken;
  if (broken) { // no automata to draw: say why instead
    matches.watch(sid);
    $("#graph-title").textContent = `${sid} is broken: ${broken.reason}; ${broken.fix}`;
    $("#graph").replaceChildren();
    return;
  }
  const sub = await authed(() => loadBackfill(sid)).catch(() => null);
  if (state.selected !== sid) return;
  // One that ran over history shows its latest witnesses, replayed ones included (they may all have come
  // before it was selected); any other its witnesses from now on.
  matches.watch(sid, sub && sub.backfill ? Math.max(1, (sub.last_seq || 0) - KEEP + 1) : null);
  await authed(() => drawGraph(sid));
}

// The selected subscription's backfill, drawn over its matches (read again each poll while it runs).
async function loadBackfill(sid) {
  const sub = await api("GET", `/subscriptions/${encodeURIComponent(sid)}`);
  if (state.selected !== sid) return sub;
  state.backfill = sub.backfill || null;
  drawBackfill(state.backfill);
  return sub;
}

async function drawGraph(sid) {
  const graph = await api("GET", `/subscriptions/${encodeURIComponent(sid)}/automaton`);
  if (state.selected !== sid) return;
  $("#graph-title").textContent = `${sid}${graph.name ? " " + graph.name : ""} → ${graph.outputs.join(", ")}`;
  renderAutomaton($("#graph"), graph);
}

async function removeSubscription(sid, button) {
  if (!button.classList.contains("confirm")) { // a second click within 3 s deletes
    button.classList.add("confirm");
    button.textContent = "sure?";
    setTimeout(() => { button.classList.remove("confirm"); button.textContent = "delete"; }, 3000);
    return;
  }
  await authed(() => api("DELETE", `/subscriptions/${encodeURIComponent(sid)}`));
  if (state.selected === sid) select(null);
  await refreshLists();
}

// ------------------------------------------------------------------ editor

// The warnings of a query (valid or registered): listed under the errors, in the
// warning colour, each clickable to its position; they never disable Register.
function showWarnings(warnings) {
  $("#warnings").replaceChildren(...(warnings || []).map((w) => {
    const li = document.createElement("li");
    li.className = "warning";
    li.dataset.line = w.line;
    li.dataset.column = w.column;
    li.dataset.code = w.code;
    const where = w.line ? `line ${w.line}${w.column ? `, column ${w.column}` : ""}: ` : "";
    li.textContent = `${where}warning: ${w.message}; ${w.fix}`;
    li.addEventListener("click", () => editor.focusError(w));
    return li;
  }));
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

function showValidation({ state: st, result, error }) {
  const box = $("#validation");
  const list = $("#errors");
  $("#register").disabled = st !== "valid";
  $("#try-history").disabled = st !== "valid" && st !== "invalid"; // an invalid one shows the server's errors
  box.className = `status ${st}`;
  if (st !== "invalid") list.replaceChildren();
  showWarnings(st === "valid" || st === "invalid" ? result.warnings : []);
  if (st === "checking") box.textContent = "checking…";
  else if (st === "empty") box.textContent = "";
  else if (st === "valid") {
    const outputs = result.outputs.join(", ") || "nothing";
    const warned = (result.warnings || []).length;
    box.textContent = `✓ valid ${editor.kind.toUpperCase()}; publishes ${outputs}`
      + (warned ? ` (${plural(warned, "warning")} below)` : "");
  } else if (st === "failed") {
    if (error instanceof AuthError) askToken("").then(() => editor.validate());
    box.textContent = `could not check: ${error.message}`;
  } else {
    box.textContent = result.errors.length === 1 ? "1 error" : `${result.errors.length} errors`;
    list.replaceChildren(...result.errors.map((e) => {
      const li = document.createElement("li");
      li.className = "error";
      li.dataset.line = e.line;
      li.dataset.column = e.column;
      li.textContent = e.line ? `line ${e.line}, column ${e.column}: ${e.message}` : e.message;
      li.addEventListener("click", () => editor.focusError(e));
      return li;
    }));
  }
}

async function register() {
  const text = editor.text;
  const name = $("#sub-name").value.trim() || undefined;
  const from = $("#sub-from").value || undefined; // a start in the retained history, or live only
  $("#register").disabled = true;
  try {
    const sub = await authed(() => api("POST", "/subscriptions", { [editor.kind]: text, name, from }));
    const v = $("#validation");
    if (sub.same_as && sub.same_as.length) {
      v.className = "status warning";
      v.textContent = `registered as ${sub.id}, identical to ${sub.same_as.join(", ")}: the same query, so the same `
        + `witnesses twice. Delete one of them, or register with a name: the same name and query again `
        + `returns the existing subscription instead of a new one.`;
    } else if (sub.backfill) {
      v.textContent = `registered as ${sub.id}: it runs over the retained events from t1 = ${sub.backfill.from} `
        + `first (their matches are marked replayed), then live`;
    } else {
      v.textContent = sub.registered_now === false ? `${sub.id} is already registered under this name with this `
        + `query: nothing new was registered` : `registered as ${sub.id}`;
    }
    editor.show([], sub.warnings || []);
    showWarnings(sub.warnings);
    try { // registered: a failure to show it is said over the automaton, never as the registration's
      await refreshLists();
      await select(sub.id);
    } catch (err) {
      $("#graph-title").textContent = `could not show ${sub.id}: ${err.message}`;
    }
  } catch (err) {
    if (err instanceof ApiError && err.data && err.data.errors) {
      editor.showErrors(err.data.errors);
      showValidation({ state: "invalid", result: err.data });
    } else if (err instanceof ApiError && err.data && err.data.retained) { // a start before the retained history
      const held = err.data.retained;
      $("#validation").className = "status invalid";
      const said = err.message.replace(/; use a later from, or 'retained'$/, ""); // said below in the form's terms
      $("#validation").textContent = `not registered: ${said}`
        + (err.message.includes(`from ${held.from} to ${held.to}`) ? "" : ` (this server retains events from `
          + `${held.from} to ${held.to})`) + `; pick a later start, or "from all retained events"`;
      $("#register").disabled = false;
    } else {
      showValidation({ state: "failed", error: err });
    }
  }
}

// ------------------------------------------------------------------ test events

async function sendEvents() {
  const out = $("#send-result");
  const lines = $("#events-input").value.split("\n");
  const events = [];
  const lineOf = [];
  const bad = [];
  lines.forEach((line, i) => {
    if (!line.trim()) return;
    try {
      events.push(JSON.parse(line));
      lineOf.push(i + 1);
    } catch (err) {
      bad.push(`line ${i + 1}: not JSON (${err.message})`);
    }
  });
  if (bad.length || !events.length) {
    out.className = "status invalid";
    out.textContent = bad.length ? bad.join("\n") : "nothing to send: one JSON event per line";
    return;
  }
  try {
    const r = await authed(() => api("POST", "/events", events));
    out.className = `status ${r.rejected.length ? "invalid" : r.late ? "warning" : "valid"}`;
    const lines = [`${r.accepted} accepted, ${r.rejected.length} rejected, ${r.late} late`,
      ...r.rejected.map((x) => `line ${lineOf[x.index]}: ${x.error}`)];
    if (r.late) lines.push(await lateReason(r.late, events));
    out.textContent = lines.join("\n");
  } catch (err) {
    out.className = "status invalid";
    out.textContent = err.message;
  }
}

// Why events were late, and what to do: their times are behind the stream's.
async function lateReason(n, events) {
  let floor = null;
  let unit = 1;
  try {
    const s = await api("GET", "/stats?limit=0");
    [floor, unit] = [s.late_before, s.time_unit_ms];
  } catch { /* the reason stands without the stream's time */ }
  const when = (t) => (floor === null ? "" : ` (${new Date(t * unit).toISOString().replace(".000Z", "Z")})`);
  const times = events.map((e) => e.t1 ?? e.t0).filter((t) => typeof t === "number");
  const own = times.length ? ` The events sent start at t1 = ${Math.min(...times)}${when(Math.min(...times))}.` : "";
  const those = n === 1 ? "This event was" : `These ${n} events were`;
  return `${those} late: dropped, because ${n === 1 ? "its time is" : "their times are"} behind the stream's: `
    + (floor === null ? "the server has already processed later events."
      : `the server has already processed events up to t1 = ${floor}${when(floor)}.`)
    + `${own} A stream moves forward in time only, so an event older than what was processed cannot be `
    + `matched. Send events with later times, or leave out t0 and t1 so the server stamps them with its `
    + `clock. The README example's times are fixed: on a server that has seen them it runs once; start `
    + `a server with an empty data directory to run it again.`;
}

// ------------------------------------------------------------------ start

async function health() {
  try {
    const h = await fetch("/health").then((r) => r.json());
    const held = h.holding_back ? ` · ${h.holding_back.subscription} holds ${h.holding_back.instances} instances` : "";
    const nInexact = Object.keys(h.inexact || {}).length;
    const inexact = nInexact ? ` · ${nInexact} inexact` : "";
    const nBroken = Object.keys(h.broken || {}).length;
    const broken = nBroken ? ` · ${nBroken} broken` : "";
    // engine workers (engine_workers): one restarted and catching up, stopped, or not answering, is named; each one's figures in the title
    const workers = h.workers || [];
    const odd = workers.filter((w) => w.state !== "running").map((w) => (w.state === "catching_up" && w.catch_up
      ? ` · worker ${w.worker} catching up ${Math.floor((100 * w.catch_up.events_done) / Math.max(w.catch_up.events_total, 1))}%`
      : ` · worker ${w.worker} ${w.state.replace("_", " ")}`
        + (w.state === "not_answering" && w.oldest_batch_s != null ? ` for ${Math.floor(w.oldest_batch_s)} s` : "")
        + (w.state === "not_answering" && w.busy_in && w.busy_in.function ? ` in ${w.busy_in.function}` : ""))).join("");
    const perWorker = workers.map((w) => `worker ${w.worker}: ${w.state.replace("_", " ")}, ${w.events} events, `
      + `${w.instances} instances, ${w.in_flight_batches} batches in flight, `
      + `${w.cpu_seconds == null ? "?" : w.cpu_seconds.toFixed(1)} s CPU`
      + `${w.cpu_wait_seconds == null ? "" : ` (${w.cpu_wait_seconds.toFixed(1)} s waiting for a core)`}`
      + `, ${w.restarts} restart${w.restarts === 1 ? "" : "s"}`);
    $("#health").textContent = `${h.status}${odd}${inexact}${broken}${held} · ${h.engine_build} engine · ${h.clients} client${h.clients === 1 ? "" : "s"}`;
    $("#health").title = [h.reason, ...perWorker].filter(Boolean).join("\n");
    $("#health").className = `pill ${h.status}`;
  } catch {
    $("#health").textContent = "server unreachable";
    $("#health").className = "pill degraded";
  }
}

function loop() {
  const step = allowed("watch") ? poll() : Promise.resolve(); // no overview to refresh without watch
  step.catch((err) => { $("#health").textContent = `error: ${err.message}`; })
    .finally(() => setTimeout(loop, POLL_MS));
}

setupCharts();
$("#register").addEventListener("click", register);
$("#try-history").addEventListener("click", () => authed(() => tryOnHistory(editor.kind, editor.text,
  (errors) => editor.showErrors(errors))).catch((err) => { $("#preview-status").textContent = err.message; }));
$("#graph").addEventListener("click", () => $("#graph").classList.toggle("actual")); // fit the panel, or full size
$("#send-events").addEventListener("click", sendEvents);
$("#language").addEventListener("change", (ev) => editor.setLanguage(ev.target.value));
$("#example").addEventListener("click", () => {
  $("#language").value = "cel";
  editor.language = "cel";
  if (allowed("manage")) editor.text = EXAMPLE_QUERY; // the editor validates: a manage operation
  $("#events-input").value = EXAMPLE_EVENTS;
});
$("#logout").hidden = !token();
$("#logout").addEventListener("click", () => { setToken(""); location.reload(); });
health();
setInterval(health, 5000);
authed(loadScopes).catch(() => {}).finally(loop);
