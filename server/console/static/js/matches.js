// Live matches of one subscription over its WebSocket: a bounded table that
// can be paused and filtered. Witnesses come several to a message (?batch=N:
// one JSON object per line) so a burst costs few messages; the table is
// redrawn at most once per frame.

import { wsProtocols, wsUrl } from "./api.js";

export const KEEP = 1000; // witnesses kept in memory, newest first
const SHOW = 200; // rows drawn
const MAX_COLUMNS = 12;
const BATCH = 500; // witnesses per WebSocket message at most

export class Matches {
  constructor(panel) {
    this.table = panel.querySelector("#matches");
    this.status = panel.querySelector("#match-status");
    this.pauseButton = panel.querySelector("#pause");
    this.filterInput = panel.querySelector("#match-filter");
    this.title = panel.querySelector("#match-sub");
    this.badge = panel.querySelector("#match-inexact");
    this.rows = []; // {w, text}, oldest first
    this.columns = ["stream", "t0", "t1"];
    this.received = 0;
    this.replayed = 0; // witnesses of the subscription's backfill ("replay": true), over history
    this.paused = false;
    this.sid = null;
    this.ws = null;
    this.frame = null;
    this.connection = ""; // the connection's state, shown after the counts
    this.pauseButton.addEventListener("click", () => this.setPaused(!this.paused));
    panel.querySelector("#clear").addEventListener("click", () => this.clear());
    this.filterInput.addEventListener("input", () => this.schedule());
  }

  // Watch a subscription's witnesses: from the next one on, or, with `fromSeq`, from its witness number
  // `fromSeq` (the history of one that ran over retained events first: its replayed witnesses included).
  watch(sid, fromSeq = null) {
    this.stop();
    this.sid = sid;
    this.nextSeq = fromSeq; // numbered witnesses ("<seq> {...}") from here; null: plain ones from now
    this.clear();
    this.setInexact(null);
    this.title.textContent = sid ? `of ${sid}` : "";
    this.pauseButton.disabled = !sid;
    if (sid) this.connect();
  }

  connect() {
    const sid = this.sid;
    const params = this.nextSeq === null ? { batch: BATCH } : { batch: BATCH, from: this.nextSeq };
    const ws = new WebSocket(wsUrl(`/ws/subscriptions/${encodeURIComponent(sid)}`, params), wsProtocols());
    this.ws = ws;
    this.connection = "connecting…";
    ws.onopen = () => { this.connection = "live"; this.schedule(); };
    ws.onmessage = (msg) => this.receive(msg.data);
    ws.onclose = (ev) => {
      if (this.ws !== ws) return; // replaced or stopped on purpose
      this.ws = null;
      this.connection = `disconnected (${ev.code}${ev.reason ? ": " + ev.reason : ""})`;
      this.schedule();
      const start = ev.code === 4410 && /starts at (\d+)/.exec(ev.reason || ""); // the log no longer holds the start
      if (start) this.nextSeq = Number(start[1]);
      // 4401 bad token, 4404 no such subscription, 4409 a broken one: retrying would not help
      if (ev.code !== 4401 && ev.code !== 4404 && ev.code !== 4409 && ev.code !== 1001) {
        setTimeout(() => { if (this.sid === sid && !this.ws) this.connect(); }, 2000);
      }
    };
  }

  stop() {
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close();
  }

  // A control message: {"control": "inexact", ...} says the subscription lost partial matches
  // (the server shed state); it is shown as a badge, never as a match.
  setInexact(message) {
    this.badge.hidden = !message;
    this.badge.textContent = message ? `inexact since #${message.since_seq}` : "";
    this.badge.title = message ? message.message : "";
  }

  receive(text) {
    if (text.startsWith('{"control":')) {
      const message = JSON.parse(text);
      if (message.control === "inexact") this.setInexact(message);
      return;
    }
    for (let line of text.split("\n")) {
      if (!line) continue;
      if (this.nextSeq !== null) { // "<seq> {...}": resume after it on a reconnect, none twice
        const space = line.indexOf(" ");
        this.nextSeq = Number(line.slice(0, space)) + 1;
        line = line.slice(space + 1);
      }
      const w = JSON.parse(line);
      this.received++;
      if (w.replay === true) this.replayed++;
      for (const k of Object.keys(w)) {
        if (k !== "replay" && !this.columns.includes(k) && this.columns.length < MAX_COLUMNS) this.columns.push(k);
      }
      this.rows.push({ w, text: line.toLowerCase() });
    }
    if (this.rows.length > KEEP) this.rows.splice(0, this.rows.length - KEEP);
    this.schedule();
  }

  clear() {
    this.rows = [];
    this.received = 0;
    this.replayed = 0;
    this.columns = ["stream", "t0", "t1"];
    this.schedule();
  }

  setPaused(paused) {
    this.paused = paused;
    this.pauseButton.textContent = paused ? "Resume" : "Pause";
    this.pauseButton.classList.toggle("active", paused);
    this.schedule();
  }

  schedule() {
    if (this.frame === null) this.frame = requestAnimationFrame(() => { this.frame = null; this.draw(); });
  }

  draw() {
    const note = [`${this.received} received`, `${this.rows.length} kept (at most ${KEEP})`];
    if (this.replayed) note.splice(1, 0, `${this.replayed} replayed from history`);
    if (this.paused) note.push("paused");
    if (this.connection) note.push(this.connection);
    this.status.textContent = note.join(" · ");
    this.status.dataset.received = this.received;
    this.status.dataset.replayed = this.replayed;
    if (this.paused) return;
    const needle = this.filterInput.value.trim().toLowerCase();
    const shown = [];
    for (let i = this.rows.length - 1; i >= 0 && shown.length < SHOW; i--) {
      if (!needle || this.rows[i].text.includes(needle)) shown.push(this.rows[i].w);
    }
    const head = document.createElement("tr");
    for (const c of this.columns) head.append(Object.assign(document.createElement("th"), { textContent: c }));
    this.table.tHead.replaceChildren(head);
    const body = document.createDocumentFragment();
    for (const w of shown) {
      const tr = document.createElement("tr");
      for (const c of this.columns) {
        const v = w[c];
        tr.append(Object.assign(document.createElement("td"), { textContent: v === undefined ? "" : String(v) }));
      }
      if (w.replay === true) { // found over history by the subscription's backfill, before it went live
        tr.className = "replay";
        tr.title = "replayed: found over the retained history when the subscription was registered with a start";
        tr.firstChild.prepend(Object.assign(document.createElement("span"),
          { className: "badge replay", textContent: "replayed" }), " ");
      }
      body.append(tr);
    }
    this.table.tBodies[0].replaceChildren(body);
  }
}
