// History first, then live (issue 36): a subscription's backfill as a progress
// bar over its matches, and the editor's "Try on the last hour" (POST
// /subscriptions/preview: the query over retained events, nothing registered).

import { api, ApiError } from "./api.js";
import { formatNumber } from "./charts.js";

const $ = (sel) => document.querySelector(sel);
const PREVIEW_LIMIT = 100; // witnesses asked for
const PREVIEW_ROWS = 20; // of them drawn
const PREVIEW_COLUMNS = 10;

// Still moving: its JSON changes from one reading to the next.
export function backfillRunning(b) {
  return Boolean(b) && (b.state === "running" || b.state === "handing_over");
}

// The subscriptions table's badge: "backfill 45%" while it runs, "backfill failed"; none once live.
export function backfillBadge(b) {
  if (!b || b.state === "live") return null;
  const badge = document.createElement("span");
  badge.className = "badge backfill";
  badge.textContent = b.state === "failed" ? "backfill failed" : `backfill ${percent(b) ?? "…"}`;
  badge.title = describe(b);
  return badge;
}

function percent(b) {
  return b.events_total ? `${Math.floor((100 * b.events_done) / b.events_total)}%` : null;
}

function describe(b) {
  const range = `from t1 = ${b.from}${b.to === null || b.to === undefined ? "" : ` to ${b.to}`}`;
  const found = `${formatNumber(b.witnesses)} witness${b.witnesses === 1 ? "" : "es"}`;
  if (b.state === "live") return `live: ${found} replayed over the history ${range}, then the live events`;
  if (b.state === "failed") return `failed: ${b.error || "no reason given"}`;
  const of = b.events_total === null || b.events_total === undefined ? "" : ` of ${formatNumber(b.events_total)}`;
  const what = b.state === "handing_over" ? "handing over to the live engine" : "running over history";
  return `${what}: ${formatNumber(b.events_done)}${of} events ${range}, ${found} so far`;
}

// The bar above the matches of the selected subscription: hidden when it has no backfill,
// marked "live" once it handed over.
export function drawBackfill(b) {
  const box = $("#backfill");
  box.hidden = !b;
  if (!b) return;
  box.dataset.state = b.state;
  const bar = $("#backfill-bar");
  if (b.state === "live") bar.value = 1;
  else if (b.events_total) bar.value = b.events_done / b.events_total;
  else bar.removeAttribute("value"); // total not known yet: an indeterminate bar
  $("#backfill-label").textContent = b.state === "live" ? "backfill live" : b.state === "failed"
    ? "backfill failed" : `backfill ${percent(b) ?? ""}`.trim();
  $("#backfill-text").textContent = describe(b);
}

function cell(text) {
  return Object.assign(document.createElement("td"), { textContent: text });
}

function showWitnesses(witnesses) {
  const table = $("#preview-witnesses");
  const columns = [];
  for (const w of witnesses.slice(0, PREVIEW_ROWS)) {
    for (const k of Object.keys(w)) {
      if (k !== "replay" && !columns.includes(k) && columns.length < PREVIEW_COLUMNS) columns.push(k);
    }
  }
  const head = document.createElement("tr");
  head.append(...columns.map((c) => Object.assign(document.createElement("th"), { textContent: c })));
  table.tHead.replaceChildren(...(witnesses.length ? [head] : []));
  table.tBodies[0].replaceChildren(...witnesses.slice(0, PREVIEW_ROWS).map((w) => {
    const tr = document.createElement("tr");
    tr.append(...columns.map((c) => cell(w[c] === undefined ? "" : String(w[c]))));
    return tr;
  }));
}

// The errors of a 400, each as the server words it: line, column, message and the caret excerpt.
function errorText(err) {
  const data = err.data || {};
  if (data.errors && data.errors.length) {
    return data.errors.map((e) => (e.line ? `line ${e.line}, column ${e.column}: ${e.message}` : e.message)
      + (e.excerpt ? `\n${e.excerpt.replace(/\n$/, "")}` : "")).join("\n");
  }
  if (data.retained && !err.message.includes(`from ${data.retained.from} to ${data.retained.to}`)) {
    return `${err.message} (this server retains events from ${data.retained.from} to ${data.retained.to})`;
  }
  return err.message;
}

// Run the editor's query over the last hour of retained events: the count, the range and the first witnesses.
// `onErrors(errors)` marks a 400's errors in the editor.
export async function tryOnHistory(kind, text, onErrors, from = "-1h") {
  const box = $("#preview");
  const status = $("#preview-status");
  box.hidden = false;
  status.className = "status checking";
  status.textContent = "running over the last hour…";
  showWitnesses([]);
  try {
    let r;
    let over = "the last hour";
    try {
      r = await api("POST", "/subscriptions/preview", { [kind]: text, from, limit: PREVIEW_LIMIT });
    } catch (err) { // less than an hour is retained: try it over all there is, and say so
      if (!(err instanceof ApiError && err.data && err.data.retained && err.data.retained.from !== null
            && !err.data.errors)) throw err;
      r = await api("POST", "/subscriptions/preview", { [kind]: text, from: "retained", limit: PREVIEW_LIMIT });
      over = "all the retained events (less than an hour is kept)";
    }
    status.className = `status ${r.count ? "valid" : ""}`.trim();
    const shown = r.count > PREVIEW_ROWS ? ` (the first ${Math.min(PREVIEW_ROWS, r.witnesses.length)} below)` : "";
    status.textContent = `${formatNumber(r.count)} witness${r.count === 1 ? "" : "es"} over ${over}: `
      + `${formatNumber(r.events)} events from t1 = ${r.from} to ${r.to}${shown}`
      + (r.count ? "" : ". Nothing would have matched; Register still runs it on the live events.");
    status.dataset.count = r.count;
    showWitnesses(r.witnesses);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    status.className = "status invalid preview-error";
    status.textContent = errorText(err);
    delete status.dataset.count;
    if (err.data && err.data.errors) onErrors(err.data.errors);
  }
}
