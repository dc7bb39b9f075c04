// The query editor: a plain textarea over a backdrop that marks each error at
// its line and column; validated through POST /subscriptions/validate as you type.

import { api } from "./api.js";

const DELAY_MS = 250;

function escapeHtml(text) {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

export function queryKind(text) {
  return text.trimStart().startsWith("<") ? "air" : "cel";
}

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
    this.seq = 0;
    this.timer = null;
    this.errors = [];
    this.textarea.addEventListener("input", () => this.changed());
    this.textarea.addEventListener("scroll", () => this.syncScroll());
    this.paint();
  }

  get text() {
    return this.textarea.value;
  }

  set text(value) {
    this.textarea.value = value;
    this.changed();
  }

  changed() {
    this.errors = [];
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
      result = await api("POST", "/subscriptions/validate", { [queryKind(text)]: text });
    } catch (err) {
      if (seq === this.seq) this.onResult({ state: "failed", error: err });
      return;
    }
    if (seq !== this.seq) return; // the text changed meanwhile: a newer answer is coming
    this.showErrors(result.errors || []);
    this.onResult({ state: result.valid ? "valid" : "invalid", result });
  }

  showErrors(errors) {
    this.errors = errors;
    this.paint();
  }

  // Redraw the line numbers and the marks behind the text.
  paint() {
    const text = this.text;
    const starts = lineStarts(text);
    const spans = this.errors
      .map((e, i) => ({ e, i, span: errorSpan(text, starts, e.line, e.column) }))
      .filter((x) => x.span)
      .sort((a, b) => a.span[0] - b.span[0]);
    let html = "";
    let at = 0;
    for (const { e, i, span } of spans) {
      if (span[0] < at) continue; // overlapping marks: the first wins
      html += escapeHtml(text.slice(at, span[0]));
      html += `<mark class="error-mark" data-error="${i}" data-line="${e.line}" data-column="${e.column}">`
        + `${escapeHtml(text.slice(span[0], span[1]).replace("\n", " "))}</mark>`;
      at = span[1];
    }
    this.backdrop.innerHTML = html + escapeHtml(text.slice(at)) + "\n";
    const bad = new Set(this.errors.map((e) => e.line));
    this.gutter.innerHTML = starts.map((_, i) => (bad.has(i + 1) ? `<b>${i + 1}</b>` : `${i + 1}`)).join("\n");
    this.syncScroll();
  }

  syncScroll() {
    this.backdrop.scrollTop = this.textarea.scrollTop;
    this.backdrop.scrollLeft = this.textarea.scrollLeft;
    this.gutter.scrollTop = this.textarea.scrollTop;
  }

  // Put the caret on an error's position.
  focusError(e) {
    const starts = lineStarts(this.text);
    const span = errorSpan(this.text, starts, e.line, e.column);
    if (!span) return;
    this.textarea.focus();
    this.textarea.setSelectionRange(span[0], span[1]);
  }
}
