"""Read and write AIR, the XML automaton format of the original Cayuga.

Reading is hardened: documents are bounded in size, DOCTYPEs (and so entity
declarations) are refused, no entity is expanded and nothing is fetched from
the network. Each document is validated against ``air/air.xsd`` with lxml and
then checked for the structural rules of docs/design/air-format.md; every error names the
element, its line and what to fix.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Iterable

from lxml import etree

from air.errors import ExprSyntaxError, SourceError
from air.expr import Compare, Dur, Ref, parse_air_expr, to_air, walk
from air.names import name_problem
from air.model import (
    Attribute, Automaton, Clause, ComplexAtom, Computed, DurationAtom, DynamicAtom, Edge,
    IndexHint, ModelError, OutputStream, Predicate, Rename, State, StaticAtom, StreamSchema,
    normalize_type,
)

#: Largest AIR document accepted, in bytes.
MAX_AIR_BYTES = 4 * 1024 * 1024


#: The refusal of a text nested deeper than Python's stack allows (e.g. 5,000 parentheses).
TOO_DEEP = "the text is nested too deeply (expressions or brackets thousands of levels deep); simplify it"


class AirError(SourceError):
    """A malformed or inconsistent AIR document."""

    kind = "air"


@lru_cache(maxsize=1)
def _schema() -> etree.XMLSchema:
    xsd = resources.files("air").joinpath("air.xsd").read_bytes()
    return etree.XMLSchema(etree.fromstring(xsd, _parser()))


def _parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False,
        huge_tree=False, remove_comments=True, remove_pis=True,
    )


def _parse_xml(data: str | bytes, what: str) -> etree._Element:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if len(raw) > MAX_AIR_BYTES:
        raise AirError(f"{what} is {len(raw)} bytes; the limit is {MAX_AIR_BYTES}")
    if b"<!DOCTYPE" in raw or b"<!ENTITY" in raw:
        line = raw[: max(raw.find(b"<!DOCTYPE"), raw.find(b"<!ENTITY"))].count(b"\n") + 1
        raise AirError(
            f"{what}: DOCTYPE and ENTITY declarations are not allowed (no entity expansion); "
            "remove them", line, 1,
        )
    try:
        return etree.fromstring(raw, _parser())
    except etree.XMLSyntaxError as exc:
        line, col = exc.position if exc.position else (0, 0)
        raise AirError(f"{what} is not well-formed XML: {exc.msg}", line, col) from None


def _el(e: etree._Element) -> str:
    attrs = " ".join(f'{k}="{v if len(v) <= 40 else v[:40] + "..."}"' for k, v in e.attrib.items())
    return f"<{e.tag}{' ' + attrs if attrs else ''}>"


#: Attributes of AIR elements that hold a name (air/names.py: letters, digits and
#: underscores, at most MAX_NAME_LENGTH): tag -> ((attribute, what it names), ...).
#: They end up in URLs, file paths, metric labels and log lines.
NAME_ATTRIBUTES: dict[str, tuple[tuple[str, str], ...]] = {
    "NFA": (("Name", "automaton name"),),
    "Node": (("NodeID", "node id"), ("InputStreamName", "input stream name")),
    "AttrName": (("Name", "attribute name"),),
    "StaticPred": (("EventAttr", "attribute name"),),
    "DynamicPred": (("EventAttr", "attribute name"), ("NodeAttr", "attribute name")),
    "OldNewAttrPair": (("OldAttr", "attribute name"), ("NewAttr", "attribute name")),
    "UDF": (("Attr", "attribute name"),),
    "ForwardEdge": (("Destination", "node id"),),
    "OutputStreamName": (("Name", "output stream name"),),
    "IndexAttr": (("EvAttrName", "attribute name"), ("NodeAttrName", "attribute name")),
}


def _check_names(root: etree._Element) -> None:
    """Refuse the first name that breaks the rule of air/names.py, naming the
    element, its line and the rule (before the XSD, whose messages cannot)."""
    for e in root.iter():
        for attr, what in NAME_ATTRIBUTES.get(e.tag, ()):
            value = e.get(attr)
            if value is None:
                continue
            problem = name_problem(value, what=what)
            if problem is not None:
                raise AirError(f"{_el(e)}: {problem}", e.sourceline or 0)


# --------------------------------------------------------------------------- reading


def load_air(data: str | bytes, *, name: str = "") -> Automaton:
    """Parse one AIR document holding a single ``<NFA>``."""
    autos = load_air_many(data, name=name)
    if len(autos) != 1:
        raise AirError(f"expected one <NFA>, found {len(autos)}; use load_air_many")
    return autos[0]


def load_air_many(data: str | bytes, *, name: str = "") -> list[Automaton]:
    """Parse an AIR document: one ``<NFA>`` or several inside ``<NFAs>``."""
    try:
        return _load_many(data, name)
    except RecursionError:  # an expression nested thousands deep in an Expr attribute
        raise AirError(TOO_DEEP) from None
    except AirError as exc:
        if exc.source or not exc.line:
            raise
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        raise AirError(exc.message, exc.line, exc.column, text) from None


def _load_many(data: str | bytes, name: str) -> list[Automaton]:
    root = _parse_xml(data, "AIR document")
    if root.tag not in ("NFA", "NFAs"):
        raise AirError(f"root element must be <NFA> (or <NFAs>), not <{root.tag}>", root.sourceline or 0)
    _check_names(root)
    schema = _schema()
    if not schema.validate(root):
        err = schema.error_log.last_error
        msg = err.message.replace("Element '", "element <").replace("': ", ">: ", 1)
        raise AirError(f"invalid AIR: {msg}", err.line, err.column)
    nfas = [root] if root.tag == "NFA" else list(root)
    out = []
    for i, nfa in enumerate(nfas):
        nfa_name = nfa.get("Name") or (name if len(nfas) == 1 else f"{name}#{i}")
        out.append(_build(nfa, nfa_name))
    return out


def _predicate(edge: etree._Element, is_start: bool) -> Predicate:
    ev = edge.find("EvalFunc")
    if ev is None:
        return Predicate()
    clauses = ev.findall("PredClause")
    if not clauses:
        return Predicate()  # an empty <EvalFunc> is TRUE
    return Predicate(tuple(Clause(tuple(_atom(a, is_start) for a in c)) for c in clauses))


def _op(text: str) -> str:
    return "!=" if text == "<>" else text


def _expr(e: etree._Element, attr: str, predicate: bool):
    text = e.get(attr)
    try:
        return parse_air_expr(text, predicate=predicate)
    except ExprSyntaxError as exc:
        raise AirError(
            f"{_el(e)}: bad expression in {attr}: {exc.message} (at column {exc.column})",
            e.sourceline or 0,
        ) from None


def _atom(a: etree._Element, is_start: bool):
    tag = a.tag
    if tag == "StaticPred":
        return StaticAtom(a.get("EventAttr"), _op(a.get("OP")), a.get("Const"))
    if tag == "DynamicPred":
        if is_start:
            raise AirError(f"{_el(a)}: a START node has no stored instance to compare with",
                           a.sourceline or 0)
        return DynamicAtom(a.get("EventAttr"), _op(a.get("OP")), a.get("NodeAttr"))
    if tag == "DurationPred":
        kind = a.get("Type")
        if kind == "COMPOSITE" and is_start:
            raise AirError(
                f"{_el(a)}: a COMPOSITE duration predicate is not allowed on a START node's edge "
                "(there is no composite event yet); use Type=\"EVENT\"", a.sourceline or 0)
        return DurationAtom(kind, _op(a.get("OP")), float(a.get("Const")))
    expr = _expr(a, "Expr", predicate=True)
    if not isinstance(expr, Compare):
        raise AirError(f"{_el(a)}: a ComplexPred must hold one comparison, e.g. NODE.x > EV.y",
                       a.sourceline or 0)
    return ComplexAtom(expr)


def _schema_map(edge: etree._Element) -> tuple[tuple, bool]:
    sm = edge.find("SchemaMap")
    if sm is None:
        return (), False
    entries = []
    for m in sm:
        if m.tag == "OldNewAttrPair":
            entries.append(Rename(m.get("OldAttrSource"), m.get("OldAttr"), m.get("NewAttr")))
        else:
            entries.append(Computed(_expr(m, "Expr", predicate=False), m.get("Attr")))
    return tuple(entries), True


def _edge(e: etree._Element, dest: str, is_start: bool) -> Edge:
    entries, has_map = _schema_map(e)
    return Edge(dest, _predicate(e, is_start), entries, has_map, e.get("Type") == "DEL")


def _build(nfa: etree._Element, name: str) -> Automaton:
    raw_nodes = nfa.findall("Node")
    ids: dict[str, etree._Element] = {}
    for n in raw_nodes:
        nid = n.get("NodeID")
        if nid in ids:
            raise AirError(f"{_el(n)}: duplicate NodeID {nid!r} (first at line {ids[nid].sourceline})",
                           n.sourceline or 0)
        ids[nid] = n
    states: list[State] = []
    for n in raw_nodes:
        states.append(_node(n, ids))
    if not any(s.is_start for s in states):
        raise AirError("the automaton has no START node", nfa.sourceline or 0)
    auto = Automaton(tuple(states), name)
    _check(auto, ids)
    return auto


def _node(n: etree._Element, ids: dict[str, etree._Element]) -> State:
    nid = n.get("NodeID")
    is_start = n.get("NodeType") == "START"
    stream = n.get("InputStreamName")
    line = n.sourceline or 0
    if is_start and not stream:
        raise AirError(f"{_el(n)}: a START node needs an InputStreamName", line)
    schemas = n.findall("Schema")
    if len(schemas) > 1:
        raise AirError(f"{_el(n)}: more than one <Schema>", schemas[1].sourceline or 0)
    if not is_start and not schemas:
        raise AirError(f"{_el(n)}: an INTERMEDIATE_OR_END node needs a <Schema>", line)
    attrs: list[Attribute] = []
    if schemas:
        seen = set()
        for a in schemas[0]:
            if a.get("Name") in seen:
                raise AirError(f"{_el(a)}: duplicate attribute {a.get('Name')!r} in the schema",
                               a.sourceline or 0)
            seen.add(a.get("Name"))
            attrs.append(Attribute(a.get("Name"), normalize_type(a.get("Type"))))
    filters = n.findall("FilterEdge")
    rebinds = n.findall("RebindEdge")
    for kind, found in (("FilterEdge", filters), ("RebindEdge", rebinds)):
        if found and is_start:
            raise AirError(f"{_el(found[0])}: a START node cannot have a {kind}", found[0].sourceline or 0)
        if len(found) > 1:
            raise AirError(f"{_el(found[1])}: a node has at most one {kind}", found[1].sourceline or 0)
    if filters and not stream:
        raise AirError(f"{_el(filters[0])}: an end node (no InputStreamName) cannot have a FilterEdge",
                       filters[0].sourceline or 0)
    filt = _predicate(filters[0], False) if filters else (None if is_start or not stream else Predicate())
    rebind = None
    if rebinds:
        r = rebinds[0]
        if r.find("SchemaMap") is None:
            raise AirError(f"{_el(r)}: a RebindEdge needs a <SchemaMap> that rebuilds the node's schema",
                           r.sourceline or 0)
        rebind = _edge(r, nid, False)
    forwards = []
    for f in n.findall("ForwardEdge"):
        dest = f.get("Destination")
        if dest not in ids:
            raise AirError(f"{_el(f)}: no node has NodeID {dest!r}", f.sourceline or 0)
        forwards.append(_edge(f, dest, is_start))
    if (forwards or rebind) and not stream:
        raise AirError(f"{_el(n)}: a node with outgoing edges needs an InputStreamName", line)
    outputs = tuple(OutputStream(o.get("Name"), o.get("Type") or "OUT") for o in n.findall("OutputStreamName"))
    hints = tuple(
        IndexHint(h.tag, h.get("IndexType") or "",
                  tuple((c.get("Type") or "", c.get("EvAttrName") or "", c.get("NodeAttrName") or "")
                        for c in h))
        for h in n if h.tag in ("FilterPredIndex", "FRPredIndex", "DynFilterPredIndex")
    )
    return State(nid, is_start, stream, tuple(attrs), filt, rebind, tuple(forwards), outputs, hints, line)


def _check(auto: Automaton, ids: dict[str, etree._Element]) -> None:
    """Schema maps must produce exactly the destination schema; NODE references
    must name attributes of the source state."""
    for s in auto.states:
        src = set(s.schema_names())
        edges = ([s.rebind] if s.rebind else []) + list(s.forwards)
        elems = ids[s.id].findall("RebindEdge") + ids[s.id].findall("ForwardEdge")
        for edge, el in zip(edges, elems):
            dest = auto.state(edge.destination)
            if dest.is_start:
                raise AirError(f"{_el(el)}: an edge cannot lead into a START node", el.sourceline or 0)
            produced: list[str] = []
            for m in edge.schema_map:
                produced.append(m.new if isinstance(m, Rename) else m.attr)
                node_refs = ([m.old] if isinstance(m, Rename) and m.source == "NODE" else
                             [r.name for r in walk(m.expr) if isinstance(r, Ref) and r.source == "NODE"]
                             if isinstance(m, Computed) else [])
                for ref in node_refs:
                    if ref not in src:
                        raise AirError(
                            f"{_el(el)}: the schema map reads NODE.{ref}, which node {s.id} does not "
                            f"have (its schema: {', '.join(sorted(src)) or 'empty'})", el.sourceline or 0)
                if isinstance(m, Computed) and any(isinstance(x, Dur) for x in walk(m.expr)):
                    raise AirError(f"{_el(el)}: DUR cannot be used in a schema map", el.sourceline or 0)
            dups = {p for p in produced if produced.count(p) > 1}
            if dups:
                raise AirError(f"{_el(el)}: the schema map sets {', '.join(sorted(dups))} more than once",
                               el.sourceline or 0)
            want = dest.schema_names()
            missing = [a for a in want if a not in produced]
            extra = [a for a in produced if a not in want]
            if missing or extra:
                parts = []
                if missing:
                    parts.append(f"does not produce {', '.join(missing)}")
                if extra:
                    parts.append(f"produces {', '.join(extra)}, which is not in the schema")
                raise AirError(
                    f"{_el(el)}: the schema map {' and '.join(parts)} of node {dest.id} "
                    f"(schema: {', '.join(want)})", el.sourceline or 0)
            for clause in edge.predicate.clauses:
                for atom in clause.atoms:
                    _check_node_refs(atom, src, s, el)
        if s.filter is not None:
            fel = ids[s.id].find("FilterEdge")
            for clause in s.filter.clauses:
                for atom in clause.atoms:
                    _check_node_refs(atom, src, s, fel if fel is not None else ids[s.id])


def _check_node_refs(atom, src: set[str], s: State, el) -> None:
    if isinstance(atom, DynamicAtom):
        refs = [atom.node_attr]
    elif isinstance(atom, ComplexAtom):
        refs = [r.name for r in walk(atom.expr) if isinstance(r, Ref) and r.source == "NODE"]
    else:
        return
    for ref in refs:
        if ref not in src:
            raise AirError(f"{_el(el)}: the predicate reads NODE.{ref}, which node {s.id} does not have",
                           el.sourceline or 0)


# --------------------------------------------------------------------------- stream schemas


def load_stream_types(data: str | bytes) -> list[StreamSchema]:
    """Parse the original's ``<StreamType Name=..><AttrNameType Name Type/>``
    schema files (a namespace is allowed; several may sit under one root)."""
    root = _parse_xml(data, "stream schema document")

    def local(e) -> str:
        return etree.QName(e).localname

    found = [root] if local(root) == "StreamType" else [e for e in root if local(e) == "StreamType"]
    if not found:
        raise AirError("no <StreamType> element found", root.sourceline or 0)
    out = []
    for st in found:
        name = st.get("Name")
        if not name:
            raise AirError(f"{_el(st)}: a StreamType needs a Name", st.sourceline or 0)
        problem = name_problem(name, what="stream name", identifier=True)
        if problem is not None:
            raise AirError(f"{_el(st)}: {problem}", st.sourceline or 0)
        attrs = []
        for a in st:
            if local(a) != "AttrNameType" or not a.get("Name") or not a.get("Type"):
                raise AirError(f"<{local(a)}> in StreamType {name}: expected <AttrNameType Name=.. Type=..>",
                               a.sourceline or 0)
            problem = name_problem(a.get("Name"), what="attribute name", identifier=True)
            if problem is not None:
                raise AirError(f"{_el(a)}: {problem}", a.sourceline or 0)
            try:
                attrs.append(Attribute(a.get("Name"), normalize_type(a.get("Type"))))
            except ModelError as exc:
                raise AirError(str(exc), a.sourceline or 0) from None
        out.append(StreamSchema(name, tuple(attrs)))
    return out


# --------------------------------------------------------------------------- writing


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _write_pred(lines: list[str], pred: Predicate) -> None:
    if pred.is_true and len(pred.clauses) == 1:
        return
    lines.append("<EvalFunc>")
    for c in pred.clauses:
        lines.append("<PredClause>")
        for a in c.atoms:
            if isinstance(a, StaticAtom):
                lines.append(f'<StaticPred EventAttr="{_x(a.event_attr)}" OP="{_x(a.op)}" Const="{_x(a.const)}"/>')
            elif isinstance(a, DynamicAtom):
                lines.append(f'<DynamicPred EventAttr="{_x(a.event_attr)}" OP="{_x(a.op)}" NodeAttr="{_x(a.node_attr)}"/>')
            elif isinstance(a, DurationAtom):
                lines.append(f'<DurationPred Type="{a.kind}" OP="{_x(a.op)}" Const="{_fmt_num(a.const)}"/>')
            else:
                lines.append(f'<ComplexPred Expr="{_x(to_air(a.expr))}"/>')
        lines.append("</PredClause>")
    lines.append("</EvalFunc>")


def _write_map(lines: list[str], entries: Iterable) -> None:
    lines.append("<SchemaMap>")
    for m in entries:
        if isinstance(m, Rename):
            lines.append(f'<OldNewAttrPair OldAttrSource="{m.source}" OldAttr="{_x(m.old)}" NewAttr="{_x(m.new)}"/>')
        else:
            lines.append(f'<UDF Expr="{_x(to_air(m.expr))}" Attr="{_x(m.attr)}"/>')
    lines.append("</SchemaMap>")


def _x(s: str) -> str:
    # tab, newline and CR as references: a parser turns them into spaces in an attribute value
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("\t", "&#9;").replace("\n", "&#10;").replace("\r", "&#13;"))


def dump_air(auto: Automaton) -> str:
    """Write ``auto`` as AIR in the original dialect; :func:`load_air` reads it back equal."""
    lines = ["<NFA>"]
    for s in auto.states:
        stream = f' InputStreamName="{_x(s.input_stream)}"' if s.input_stream else ""
        ntype = "START" if s.is_start else "INTERMEDIATE_OR_END"
        lines.append(f'<Node NodeID="{_x(s.id)}" NodeType="{ntype}"{stream}>')
        if s.schema or not s.is_start:  # an empty one too: the reader wants it on every other node
            lines.append("<Schema>")
            for a in s.schema:
                lines.append(f'<AttrName Name="{_x(a.name)}" Type="{a.type}"/>')
            lines.append("</Schema>")
        if s.filter is not None and not s.is_start:
            lines.append("<FilterEdge>")
            _write_pred(lines, s.filter)
            lines.append("</FilterEdge>")
        for kind, edge in ([("RebindEdge", s.rebind)] if s.rebind else []) + [("ForwardEdge", f) for f in s.forwards]:
            dest = f' Destination="{_x(edge.destination)}"' if kind == "ForwardEdge" else ""
            typ = ' Type="DEL"' if edge.resets_start else ""
            lines.append(f"<{kind}{dest}{typ}>")
            _write_pred(lines, edge.predicate)
            if edge.has_map or kind == "RebindEdge":
                _write_map(lines, edge.schema_map)
            lines.append(f"</{kind}>")
        for h in s.index_hints:
            it = f' IndexType="{_x(h.index_type)}"' if h.index_type else ""
            lines.append(f"<{h.kind}{it}>")
            for t, ev, nd in h.entries:
                nd_attr = f' NodeAttrName="{_x(nd)}"' if nd else ""
                lines.append(f'<IndexAttr Type="{_x(t)}" EvAttrName="{_x(ev)}"{nd_attr}/>')
            lines.append(f"</{h.kind}>")
        for o in s.outputs:
            lines.append(f'<OutputStreamName Name="{_x(o.name)}" Type="{o.type}"/>')
        lines.append("</Node>")
    lines.append("</NFA>")
    return "\n".join(lines) + "\n"
