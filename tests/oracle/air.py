"""The oracle's own AIR reader (docs/design/air-format.md), with the standard library's
ElementTree: AIR text -> plain, immutable automata.

Predicates become ``Pred``: a tuple of clauses (OR), each a tuple of atoms
(AND); an empty tuple of clauses is TRUE, as is a missing ``<EvalFunc>``.
An atom is one of

    ("static", attr, op, const)        event attribute vs constant
    ("dynamic", attr, op, node_attr)   event attribute vs instance attribute
    ("duration", "EVENT"|"COMPOSITE", op, const)
    ("complex", tree)                  an expression tree of tests/oracle/expr.py

The load-time rejections docs/design/air-format.md lists are raised as :class:`OracleAirError`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from tests.oracle import expr

OPS = {"=": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
TYPES = {"int": "int", "integer": "int", "long": "int", "float": "float", "double": "float",
         "string": "string", "shortstring": "string", "str": "string", "bool": "bool", "boolean": "bool"}


class OracleAirError(ValueError):
    """AIR the oracle refuses to load, with the reason."""


@dataclass(frozen=True)
class Edge:
    pred: tuple                    # clauses (OR) of atoms (AND); () is TRUE
    mapping: tuple                 # ("EV"|"NODE", old, new) or ("UDF", tree, new)
    dest: str                      # destination node id (the node itself for a rebind edge)
    delete: bool                   # Type="DEL": the new instance starts at e.t1


@dataclass(frozen=True)
class State:
    id: str
    start: bool
    stream: str | None             # input stream; None for an end node
    schema: tuple                  # ((name, type), ...)
    filter: tuple                  # the filter predicate θ (TRUE when no FilterEdge)
    rebind: Edge | None
    forwards: tuple                # Edge, ...
    outputs: tuple                 # ((stream name, "OUT"|"RESUB"), ...)

    def names(self) -> tuple:
        return tuple(n for n, _ in self.schema)


@dataclass(frozen=True)
class Automaton:
    name: str
    states: tuple                  # State, ... in document order

    def state(self, sid: str) -> State:
        return next(s for s in self.states if s.id == sid)


def read_air(text: str, name: str = "") -> list[Automaton]:
    """Every ``<NFA>`` of an AIR document (a bare ``<NFA>`` or several under a wrapper)."""
    root = ET.fromstring(text)
    nfas = [root] if root.tag == "NFA" else list(root.iter("NFA"))
    if not nfas:
        raise OracleAirError("no <NFA> element")
    return [_automaton(n, name or n.get("Name", "")) for n in nfas]


def _automaton(nfa: ET.Element, name: str) -> Automaton:
    nodes = nfa.findall("Node")
    ids = [n.get("NodeID") for n in nodes]
    if len(set(ids)) != len(ids):
        raise OracleAirError(f"{name}: duplicate NodeID")
    schemas = {n.get("NodeID"): _schema(n) for n in nodes}
    states = tuple(_state(n, schemas, name) for n in nodes)
    if not any(s.start for s in states):
        raise OracleAirError(f"{name}: no START node")
    return Automaton(name, states)


def _schema(node: ET.Element) -> tuple:
    out = []
    for sch in node.findall("Schema"):
        for a in sch.findall("AttrName"):
            typ = a.get("Type", "")
            if typ.lower() not in TYPES:
                raise OracleAirError(f"unknown attribute type {typ!r}")
            out.append((a.get("Name"), TYPES[typ.lower()]))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise OracleAirError(f"node {node.get('NodeID')}: duplicate attribute in the schema: {names}")
    return tuple(out)


def _state(n: ET.Element, schemas: dict, name: str) -> State:
    sid = n.get("NodeID")
    start = n.get("NodeType") == "START"
    stream = n.get("InputStreamName") or None
    where = f"{name}: node {sid}"
    filters, rebinds = n.findall("FilterEdge"), n.findall("RebindEdge")
    if start and (filters or rebinds):
        raise OracleAirError(f"{where}: a START node has no filter or rebind edge")
    if stream is None and filters:
        raise OracleAirError(f"{where}: an end node (no input stream) has no filter edge")
    if len(filters) > 1 or len(rebinds) > 1:
        raise OracleAirError(f"{where}: at most one filter edge and one rebind edge")
    filt = _pred(filters[0], start, where) if filters else ()
    rebind = None
    if rebinds:
        r = rebinds[0]
        if r.find("SchemaMap") is None:
            raise OracleAirError(f"{where}: a rebind edge needs a SchemaMap")
        rebind = _edge(r, sid, schemas, start, where)
    forwards = []
    for f in n.findall("ForwardEdge"):
        dest = f.get("Destination")
        if dest not in schemas:
            raise OracleAirError(f"{where}: edge to unknown node {dest!r}")
        forwards.append(_edge(f, dest, schemas, start, where))
    outputs = tuple((o.get("Name"), o.get("Type") or "OUT") for o in n.findall("OutputStreamName"))
    return State(sid, start, stream, schemas[sid], filt, rebind, tuple(forwards), outputs)


def _edge(e: ET.Element, dest: str, schemas: dict, start: bool, where: str) -> Edge:
    mapping = []
    for sm in e.findall("SchemaMap"):
        for m in sm:
            if m.tag == "OldNewAttrPair":
                src = m.get("OldAttrSource")
                if start and src == "NODE":
                    raise OracleAirError(f"{where}: a START node's edge has no instance to read")
                mapping.append((src, m.get("OldAttr"), m.get("NewAttr")))
            elif m.tag == "UDF":
                tree = expr.parse(m.get("Expr"))
                if start and any(s == "NODE" for s, _ in expr.refs(tree)):
                    raise OracleAirError(f"{where}: a START node's edge has no instance to read")
                mapping.append(("UDF", tree, m.get("Attr")))
    produced = [m[2] for m in mapping]
    wanted = [a for a, _ in schemas[dest]]
    missing = [a for a in wanted if a not in produced]
    if missing:
        raise OracleAirError(f"{where}: the schema map to node {dest} does not produce {missing}")
    extra = [a for a in produced if a not in wanted]
    if extra:
        raise OracleAirError(f"{where}: the schema map to node {dest} produces {extra}, not in its schema")
    twice = sorted({a for a in produced if produced.count(a) > 1})
    if twice:
        raise OracleAirError(f"{where}: the schema map to node {dest} sets {twice} more than once")
    return Edge(_pred(e, start, where), tuple(mapping), dest, e.get("Type") == "DEL")


def _pred(edge: ET.Element, start: bool, where: str) -> tuple:
    ev = edge.find("EvalFunc")
    if ev is None:
        return ()
    clauses = []
    for pc in ev.findall("PredClause"):
        atoms = []
        for a in pc:
            op = OPS.get(a.get("OP", ""))
            if a.tag == "StaticPred":
                atoms.append(("static", a.get("EventAttr"), op, a.get("Const")))
            elif a.tag == "DynamicPred":
                if start:
                    raise OracleAirError(f"{where}: a START node's edge has no instance to compare with")
                atoms.append(("dynamic", a.get("EventAttr"), op, a.get("NodeAttr")))
            elif a.tag == "DurationPred":
                if start and a.get("Type") == "COMPOSITE":
                    raise OracleAirError(f"{where}: a COMPOSITE duration on a START node's edge")
                atoms.append(("duration", a.get("Type"), op, float(a.get("Const"))))
            elif a.tag == "ComplexPred":
                tree = expr.parse(a.get("Expr"))
                if tree[0] != "cmp":
                    raise OracleAirError(f"{where}: a ComplexPred holds one comparison: {a.get('Expr')!r}")
                atoms.append(("complex", tree))
            else:
                raise OracleAirError(f"{where}: unknown predicate element <{a.tag}>")
            if a.tag != "ComplexPred" and op is None:
                raise OracleAirError(f"{where}: unknown operator {a.get('OP')!r}")
        clauses.append(tuple(atoms))
    return tuple(clauses)
