// The automaton view: states, edges and output streams laid out by dagre,
// drawn as SVG. Live instance counts are updated in place (no new layout).

import dagre from "../vendor/dagre/dagre.esm.js";

const SVG = "http://www.w3.org/2000/svg";
const CHAR = 7.2; // px per character of the 12px monospace font
const LINE = 15;
const WRAP = 36; // characters per predicate label line

function el(name, attrs = {}, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Break a predicate at AND / OR so labels stay narrow.
function wrap(text) {
  const words = text.split(/ (?=AND |OR )/);
  const lines = [];
  for (const w of words) {
    const last = lines.length - 1;
    if (last >= 0 && lines[last].length + w.length + 1 <= WRAP) lines[last] += " " + w;
    else lines.push(w);
  }
  return lines;
}

function edgeTitle(e) {
  return `${e.kind} edge\n${e.predicate}${e.map && e.map.length ? "\n" + e.map.join("\n") : ""}`;
}

function edgeLabel(group, x, y, edge) {
  group.append(el("rect", { x: x - edge.width / 2, y: y - edge.height / 2 - 2, width: edge.width,
    height: edge.height + 4, rx: 3, class: "label-bg" }));
  const text = el("text", { x, y: y - edge.height / 2 + 10, class: "label", "text-anchor": "middle" });
  edge.lines.forEach((line, i) => text.append(el("tspan", { x, dy: i ? 13 : 0 }, line)));
  group.append(text);
}

// A loop above the box (whose top edge is at y = top, centred on cx) that
// rises to `peak` above it, with its label on the top.
function drawLoop(svg, key, loop, cx, top, peak, spread) {
  const reach = peak / 0.75; // a cubic with both controls at `reach` peaks at 3/4 of it
  const group = el("g", { class: `edge ${loop.kind}`, "data-kind": loop.kind, "data-from": key, "data-to": key });
  group.append(el("title", {}, edgeTitle(loop)));
  const x0 = cx - spread;
  const x1 = cx + spread;
  group.append(el("path", { d: `M${x0},${top}C${x0},${top - reach} ${x1},${top - reach} ${x1},${top}`,
    "marker-end": `url(#arrow-${loop.kind})` }));
  edgeLabel(group, cx, top - peak, loop);
  svg.append(group);
}

function clipToBox(p, node, box) {
  if (Math.abs(p.x - node.x) > box.width / 2) p.x = node.x + Math.sign(p.x - node.x) * (box.width / 2);
}

function countText(n) {
  return n === 1 ? "1 instance" : `${n} instances`;
}

function stateLines(s, multi, automata) {
  const kind = s.start ? "start" : s.end ? "end" : "state";
  const head = `${multi ? automata[s.automaton].name + " · " : ""}${kind} ${s.id}`;
  const lines = [{ text: head, cls: "title" }];
  lines.push({ text: s.input_stream ? `on ${s.input_stream}` : "no input (end)", cls: "stream" });
  for (const a of s.schema) lines.push({ text: `${a.name} ${a.type}`, cls: "attr" });
  if (s.instances !== null) lines.push({ text: countText(s.instances), cls: "count" });
  return lines;
}

export function renderAutomaton(container, graph) {
  const multi = graph.automata.length > 1;
  const g = new dagre.graphlib.Graph({ multigraph: true });
  g.setGraph({ rankdir: "LR", nodesep: 36, ranksep: 70, edgesep: 20, marginx: 16, marginy: 16 });
  g.setDefaultEdgeLabel(() => ({}));
  const boxes = new Map();
  const label = (text) => {
    const lines = text ? wrap(text) : [];
    return { lines, width: lines.length ? Math.max(...lines.map((l) => l.length)) * CHAR * 0.92 + 8 : 0,
      height: lines.length * 13 };
  };
  // Filter and rebind edges are loops drawn above their state: the state's
  // box in dagre is made tall (and wide) enough to hold them.
  const loops = new Map();
  for (const e of graph.edges.filter((e) => e.from === e.to)) {
    if (!loops.has(e.from)) loops.set(e.from, []);
    loops.get(e.from).push({ ...e, ...label(e.predicate) });
  }
  const addBox = (key, box) => {
    box.width = Math.max(...box.lines.map((l) => l.text.length)) * CHAR + 24;
    box.height = box.lines.length * LINE + 14;
    box.loops = loops.get(key) || [];
    box.loopSpace = box.loops.reduce((h, l) => h + l.height + 26, 0);
    boxes.set(key, box);
    // as much room below as above, so that the box stays at the node's centre where edges meet it
    g.setNode(key, { width: Math.max(box.width, ...box.loops.map((l) => l.width)),
      height: box.height + 2 * box.loopSpace });
  };
  const addEdge = (from, to, edge, name) => {
    g.setEdge(from, to, { ...edge, ...label(edge.label), labelpos: "c" }, name);
  };

  for (const s of graph.states) addBox(s.key, { kind: s.start ? "start" : s.end ? "end" : "state", state: s,
    lines: stateLines(s, multi, graph.automata) });
  graph.edges.forEach((e, i) => {
    if (e.from !== e.to) addEdge(e.from, e.to, { kind: e.kind, label: e.predicate, title: edgeTitle(e) }, `e${i}`);
  });
  for (const s of graph.states) {
    for (const o of s.outputs) {
      const key = `out:${o.name}`;
      if (!boxes.has(key)) addBox(key, { kind: "output", lines: [{ text: `⇒ ${o.name}`, cls: "title" },
        { text: o.type === "OUT" ? "output stream" : "internal (RESUB)", cls: "stream" }] });
      addEdge(s.key, key, { kind: "output", label: "", title: `publishes ${o.name}` }, `o:${s.key}:${o.name}`);
    }
  }
  graph.links.forEach((l, i) => addEdge(`out:${l.stream}`, l.to, { kind: "link", label: "",
    title: `${l.stream} is read by this automaton` }, `l${i}`));
  const resub = graph.resubscriptions || { reads: [], read_by: [] };
  resub.reads.forEach((r, i) => {
    const key = `sub:${r.subscription}:${r.stream}`;
    addBox(key, { kind: "other", lines: [{ text: `${r.subscription}${r.name ? " " + r.name : ""}`, cls: "title" },
      { text: `publishes ${r.stream}`, cls: "stream" }] });
    for (const s of graph.states.filter((s) => s.start && s.input_stream === r.stream)) {
      addEdge(key, s.key, { kind: "resub", label: "", title: "resubscription" }, `r${i}:${s.key}`);
    }
  });
  resub.read_by.forEach((r, i) => {
    const key = `sub:${r.subscription}:reads:${r.stream}`;
    addBox(key, { kind: "other", lines: [{ text: `${r.subscription}${r.name ? " " + r.name : ""}`, cls: "title" },
      { text: `reads ${r.stream}`, cls: "stream" }] });
    if (boxes.has(`out:${r.stream}`)) {
      addEdge(`out:${r.stream}`, key, { kind: "resub", label: "", title: "resubscription" }, `b${i}`);
    }
  });

  dagre.layout(g);
  const { width, height } = g.graph();
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, width, height, class: "automaton",
    preserveAspectRatio: "xMinYMin meet" });
  const defs = el("defs");
  for (const kind of ["forward", "filter", "rebind", "output", "link", "resub"]) {
    const marker = el("marker", { id: `arrow-${kind}`, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7,
      markerHeight: 7, orient: "auto-start-reverse", class: `arrow ${kind}` });
    marker.append(el("path", { d: "M0,0L10,5L0,10z" }));
    defs.append(marker);
  }
  svg.append(defs);

  for (const e of g.edges()) {
    const edge = g.edge(e);
    const group = el("g", { class: `edge ${edge.kind}`, "data-kind": edge.kind, "data-from": e.v, "data-to": e.w });
    group.append(el("title", {}, edge.title));
    const pts = edge.points || [];
    if (pts.length) { // a node wider than its box (for a loop's label): end the edge at the box
      clipToBox(pts[0], g.node(e.v), boxes.get(e.v));
      clipToBox(pts[pts.length - 1], g.node(e.w), boxes.get(e.w));
    }
    const d = pts.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join("");
    group.append(el("path", { d, "marker-end": `url(#arrow-${edge.kind})` }));
    if (edge.lines.length) {
      const mid = pts[Math.floor(pts.length / 2)] || { x: 0, y: 0 };
      edgeLabel(group, edge.x ?? mid.x, edge.y ?? mid.y, edge);
    }
    svg.append(group);
  }

  for (const key of g.nodes()) {
    const n = g.node(key);
    const box = boxes.get(key);
    const left = n.x - box.width / 2;
    const top = n.y - box.height / 2;
    let reach = 0;
    box.loops.forEach((loop, k) => { // the k-th loop goes around the ones before it
      reach += loop.height + 26;
      const spread = box.width / 2 - 10 - 8 * (box.loops.length - 1 - k);
      drawLoop(svg, key, loop, n.x, top, reach - loop.height / 2 - 4, spread);
    });
    const group = el("g", { class: `node ${box.kind}`, "data-key": key, transform: `translate(${left},${top})` });
    group.append(el("rect", { width: box.width, height: box.height, rx: box.kind === "state" ? 4 : 10 }));
    if (box.kind === "end") {
      group.append(el("rect", { x: 3, y: 3, width: box.width - 6, height: box.height - 6, rx: 3, class: "inner" }));
    }
    box.lines.forEach((line, i) => {
      const attrs = { x: 12, y: 19 + i * LINE, class: line.cls };
      if (line.cls === "count") attrs["data-state"] = key;
      group.append(el("text", attrs, line.text));
    });
    svg.append(group);
  }
  container.replaceChildren(svg);
}

// New instance counts (state key -> count) into the drawn graph.
export function updateCounts(container, counts) {
  for (const t of container.querySelectorAll("text.count")) {
    const n = counts[t.dataset.state];
    if (n !== undefined) t.textContent = countText(n);
  }
}
