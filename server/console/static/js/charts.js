// Small time-series charts (SVG, no library) and the rates they plot.

const SVG = "http://www.w3.org/2000/svg";
const POINTS = 120; // two minutes at one reading a second

export function formatNumber(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
  if (a >= 100 || Number.isInteger(v)) return String(Math.round(v));
  return v.toFixed(1);
}

export function formatSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1e3).toFixed(s < 1e-2 ? 1 : 0) + " ms";
  return s.toFixed(1) + " s";
}

// A span of time, from microseconds to years.
export function formatDuration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return formatSeconds(s);
  const units = [[31557600, "y"], [86400, "d"], [3600, "h"], [60, "min"]];
  for (const [size, name] of units) if (s >= 2 * size) return `${formatNumber(s / size)} ${name}`;
  return `${s.toFixed(1)} s`;
}

export class Sparkline {
  constructor(parent, id, label, format = formatNumber) {
    this.values = [];
    this.format = format;
    this.el = document.createElement("figure");
    this.el.className = "chart";
    this.el.id = `chart-${id}`;
    this.el.innerHTML = `<figcaption>${label}</figcaption><output>–</output>`;
    this.svg = document.createElementNS(SVG, "svg");
    this.svg.setAttribute("viewBox", `0 0 ${POINTS} 40`);
    this.svg.setAttribute("preserveAspectRatio", "none");
    this.area = document.createElementNS(SVG, "path");
    this.area.setAttribute("class", "area");
    this.line = document.createElementNS(SVG, "path");
    this.line.setAttribute("class", "line");
    this.svg.append(this.area, this.line);
    this.el.append(this.svg);
    parent.append(this.el);
  }

  set label(text) {
    this.el.querySelector("figcaption").textContent = text;
  }

  // A new reading; ``text`` is shown instead of the formatted value when given (e.g. "idle").
  push(value, text) {
    this.values.push(value);
    if (this.values.length > POINTS) this.values.shift();
    this.el.querySelector("output").textContent = text ?? this.format(value);
    const known = this.values.filter((v) => v !== null && v !== undefined);
    const max = Math.max(1e-12, ...known);
    const offset = POINTS - this.values.length;
    let d = "";
    this.values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      const y = 38 - (36 * v) / max;
      d += `${d ? "L" : "M"}${offset + i},${y.toFixed(2)}`;
    });
    this.line.setAttribute("d", d);
    this.area.setAttribute("d", d ? `${d}L${POINTS},40L${offset + this.values.findIndex((v) => v != null)},40Z` : "");
  }
}

// Per-second rate between two readings of a running total.
export function rate(now, before, dt) {
  if (before === undefined || now === undefined || dt <= 0) return null;
  return Math.max(0, (now - before) / dt);
}

// The 99th percentile of the latencies observed between two readings of a
// cumulative histogram ([[upper bound, count], ...], the last bound null for +Inf):
// the upper bound of the first bucket that holds 99% of them (null: none observed).
export function percentile(buckets, previous, q = 0.99) {
  if (!previous || previous.length !== buckets.length) return null;
  const total = buckets[buckets.length - 1][1] - previous[previous.length - 1][1];
  if (total <= 0) return null;
  for (let i = 0; i < buckets.length; i++) {
    if (buckets[i][1] - previous[i][1] >= q * total) return buckets[i][0] ?? buckets[i - 1]?.[0] ?? null;
  }
  return null;
}
