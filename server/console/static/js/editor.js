// The query editor: a plain textarea over a backdrop that marks each error at
// its line and column, and each warning (a clause that keeps instances without
// a time bound) in another colour; validated through POST
// /subscriptions/validate as you type. A warning never makes a query invalid.
// The language switch picks CEL (AIR XML when the text starts with '<') or SASE.

import { api } from "./api.js";

const DELAY_MS = 250;

function escapeHtml(text) {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

export function queryKind(text, language = "cel") {
  if (language === "sase") return "sase";
  return text.trimStart().startsWith("<") ? "air" : "cel";
}

const PLACEHOLDERS = {
  cel: "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs",
  sase: "EVENT SEQ(Stock a, Stock b) WHERE [Name] AND b.Price > a.Price WITHIN 1 hour",
};

// Offsets in `text` of each 1-based line start.
function lineStarts(text) {
  const starts = [0];
  for (let i = 0; i < text.length; i++) if (text[i] === "\n") starts.push(i + 1);
  return starts;
}

// [start, end) of the text an error at (line, column) points at: the word there, or one character.
function errorSpan(text, starts, line, column) {
  if (!line || line > starts.length) return null;
  const lineEnd = line < starts.length ? starts[line] - 1 : text.length;
  const start = Math.min(starts[line - 1] + Math.max(column, 1) - 1, lineEnd);
  let end = start;
  while (end < lineEnd && /[\w$.]/.test(text[end])) end++;
  return [start, Math.max(end, start + 1)];
}

export class Editor {
  constructor(root, { onResult }) {
    this.textarea = root.querySelector("textarea");
    this.backdrop = root.querySelector(".backdrop");
    this.gutter = root.querySelector(".gutter");
    this.onResult = onResult;
    this.language = "cel";
    this.seq = 0;
    this.timer = null;
    this.errors = [];
    this.warnings = [];
    this.textarea.addEventListener("input", () => this.changed());
    this.textarea.addEventListener("scroll", () => this.syncScroll());
    new ResizeObserver(() => this.paint()).observe(this.textarea); // a new width wraps the lines anew
    this.paint();
  }

  get text() {
    return this.textarea.value;
  }

  // "cel", "air" or "sase": what the text is sent as
  get kind() {
    return queryKind(this.text, this.language);
  }

  setLanguage(language) {
    this.language = language;
    this.textarea.placeholder = PLACEHOLDERS[language] || PLACEHOLDERS.cel;
    this.changed();
  }

  set text(value) {
    this.textarea.value = value;
    this.changed();
  }

  changed() {
    this.errors = [];
    this.warnings = [];
    this.paint();
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.validate(), DELAY_MS);
    this.onResult({ state: "checking" });
  }

  async validate() {
    const text = this.text;
    const seq = ++this.seq;
    if (!text.trim()) {
      this.onResult({ state: "empty" });
      return;
    }
    let result;
    try {
      result = await api("POST", "/subscriptions/validate", { [queryKind(text, this.language)]: text });
    } catch (err) {
      if (seq === this.seq) this.onResult({ state: "failed", error: err });
      return;
    }
    if (seq !== this.seq) return; // the text changed meanwhile: a newer answer is coming
    this.show(result.errors || [], result.warnings || []);
    this.onResult({ state: result.valid ? "valid" : "invalid", result });
  }

  showErrors(errors) {
    this.errors = errors;
    this.paint();
  }

  // Errors and warnings at once (one repaint); warnings of AIR (column 0) mark only the line number.
  show(errors, warnings) {
    this.errors = errors;
    this.warnings = warnings;
    this.paint();
  }

  // Redraw the marks behind the text and the line numbers. Long lines wrap: the
  // backdrop holds one block per line, wrapped as the textarea wraps it, and
  // each line number takes the height its line takes there.
  paint() {
    const text = this.text;
    const starts = lineStarts(text);
    // errors first: where a warning and an error overlap, the error's mark wins
    const spans = [
      ...this.errors.map((e, i) => ({ e, i, kind: "error", span: errorSpan(text, starts, e.line, e.column) })),
      ...this.warnings.map((e, i) => ({ e, i, kind: "warning",
        span: e.column > 0 ? errorSpan(text, starts, e.line, e.column) : null })),
    ].filter((x) => x.span).sort((a, b) => a.span[0] - b.span[0] || (a.kind === "error" ? -1 : 1));
    const lines = starts.map(() => "");
    const lineOf = (offset) => {
      let lo = 0;
      let hi = starts.length - 1;
      while (lo < hi) {
        const mid = (lo + hi + 1) >> 1;
        if (starts[mid] <= offset) lo = mid; else hi = mid - 1;
      }
      return lo;
    };
    // plain text from `from` to `to`, split at its newlines into the lines it spans
    const plain = (from, to) => {
      let at = from;
      while (at < to) {
        const ln = lineOf(at);
        const end = Math.min(to, ln + 1 < starts.length ? starts[ln + 1] - 1 : text.length);
        lines[ln] += escapeHtml(text.slice(at, end));
        at = end + 1; // past the newline
      }
    };
    let at = 0;
    for (const { e, i, kind, span } of spans) {
      if (span[0] < at) continue; // overlapping marks: the first wins
      plain(at, span[0]);
      // a mark never crosses a line end: at most it covers the newline, shown as a space
      lines[lineOf(span[0])] += `<mark class="${kind}-mark" data-${kind}="${i}" data-line="${e.line}" `
        + `data-column="${e.column}">${escapeHtml(text.slice(span[0], span[1]).replace("\n", " "))}</mark>`;
      at = span[1];
    }
    plain(at, text.length);
    this.backdrop.innerHTML = lines.map((h) => `<div class="line">${h || "<br>"}</div>`).join("");
    const bad = new Set(this.errors.map((e) => e.line));
    const warned = new Set(this.warnings.map((e) => e.line));
    const heights = [...this.backdrop.children].map((d) => d.offsetHeight);
    const number = (n) => (bad.has(n) ? `<b>${n}</b>` : warned.has(n) ? `<i class="warning">${n}</i>` : n);
    this.gutter.innerHTML = starts.map((_, i) => `<div style="height:${heights[i] || 18}px">`
      + `${number(i + 1)}</div>`).join("");
    this.syncScroll();
  }

  syncScroll() {
    this.backdrop.scrollTop = this.textarea.scrollTop;
    this.backdrop.scrollLeft = this.textarea.scrollLeft;
    this.gutter.scrollTop = this.textarea.scrollTop;
  }

  // Put the caret on an error's (or a warning's) position.
  focusError(e) {
    const starts = lineStarts(this.text);
    const span = errorSpan(this.text, starts, e.line, e.column);
    if (!span) return;
    this.textarea.focus();
    this.textarea.setSelectionRange(span[0], span[1]);
  }
}
