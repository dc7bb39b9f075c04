"""Random VALID AIR automata and random streams, for differential fuzzing of
the engine against the oracle (tests/oracle/test_differential.py).

A case is a few automata over two base streams, ``Stock`` and ``Quote``; a
later automaton may read an earlier one's output streams (resubscription). Each
automaton is a chain START -> S1 -> ... -> END whose forward edges may skip
ahead, and it covers: filter predicates (absent, empty, DNF with OR clauses),
rebind edges (FOLD) with aggregates in UDFs, several forward edges,
``Type="DEL"`` forward and rebind edges, StaticPred / DynamicPred /
DurationPred (EVENT, COMPOSITE) / ComplexPred atoms with arithmetic, CONTAINS,
SIMILARITY and bare attribute names, OUT and RESUB outputs, outputs on
intermediate states (partial outputs), two output streams on one state,
repeated forward edges, nodes in any document order with any ids, ``<>``,
constants of another numeric type than their attribute, and the same automaton
loaded twice (its states merged by the engine). Streams mix point and interval events
with many simultaneous ones. Values come from small domains so that
predicates often hold; divisors are non-zero constants (some negative), so no
expression fails, unless asked for (``errors=True``). Then some divisors are
attributes that may be 0, and values, literals and exponents are also drawn
from the whole domain (docs/design/semantics.md#arithmetic-and-comparison): ints up to
the 64-bit extremes, floats from the smallest subnormal to the largest finite
one and -0.0, long and non-ASCII strings; so additions, products and powers
overflow and fail too. Expressions that may fail go only where every
evaluation order gives the same result (one-clause predicates, schema maps);
predicates of several clauses then get only operations that cannot fail
(a division by 2 or 3, a remainder by a constant).
"""

from __future__ import annotations

import math
import random
import re
import struct
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

from tests.oracle.machine import Event

BASE = {
    "Stock": (("Name", "string"), ("Price", "float"), ("Volume", "int")),
    "Quote": (("Name", "string"), ("Bid", "int")),
}
NAMES = ["A", "B", "C", "AB", "A&B<é", "Alpha Beta Gamma Delta", "Alpha Beta Gamma Delts",
         "Γάμμα Δέλτα 日本語 😀 x'y", "Γάμμα Δέλτα 日本語 😀 x'z", "", ("αβγδε ζηθ " * 30)[:299] + "😀"]
#: Event values only (an AIR literal cannot carry control characters).
EVENT_NAMES = ["tab\there", "nul\x00", "line\nbreak \u2028", "e\u0301\ufeff"]
OPS = ["=", "!=", "<", "<=", ">", ">="]
INT_MIN, INT_MAX = -2 ** 63, 2 ** 63 - 1
INT_EDGES = [INT_MIN, INT_MIN + 1, -2 ** 62, -2 ** 53 - 1, -2 ** 31, -7, 7, 2 ** 31 - 1, 2 ** 32, 2 ** 53 + 1,
             2 ** 60 + 1, 2 ** 62, INT_MAX - 1, INT_MAX]
FLOAT_EDGES = [-0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-300, 0.1, 2.0 ** 53, 9.2e18, 2.0 ** 63, 1e308,
               -1e308, 1.7976931348623157e308, -1.7976931348623157e308]
XML_OPS = {"<": "&lt;", "<=": "&lt;=", ">": "&gt;", ">=": "&gt;=", "=": "=", "!=": "!="}


@dataclass
class Case:
    seed: int
    automata: list[str]              # AIR texts, in load order (publishers first)
    streams: dict                    # every stream name -> ((attr, type), ...)
    events: list[Event]              # in t1 order
    schedule: list                   # per automaton: (add at t1 or None, remove at t1 or None)
    restart_at: int | None = None    # the engine's state is saved and loaded into a fresh engine
                                     # before this event (a snapshot; no effect on the witnesses)


def _num(rng: random.Random, typ: str, wide: bool = False):
    """A number from the small domain, or (``wide``, one time in four) from the whole one."""
    if wide and rng.random() < 0.25:
        if typ == "int":
            return rng.choice(INT_EDGES) if rng.random() < 0.7 else rng.randint(INT_MIN, INT_MAX)
        if rng.random() < 0.6:
            return rng.choice(FLOAT_EDGES)
        while True:  # any finite double, by its bits: magnitudes from 5e-324 to 1.8e308 alike
            x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            if math.isfinite(x):
                return x
    if typ == "int":
        return rng.choice([-3, -1, 0, 1, 2, 3, 4, 5])
    return rng.choice([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0])


def _value(rng: random.Random, typ: str, wide: bool = False, event: bool = False):
    if typ == "string":
        return rng.choice(NAMES + EVENT_NAMES) if wide and event and rng.random() < 0.3 else rng.choice(NAMES)
    return _num(rng, typ, wide)


def _lit(v) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


class _Gen:
    def __init__(self, rng: random.Random, errors: bool = False) -> None:
        self.rng = rng
        self.errors = errors
        self.may_fail = True  # False inside a predicate of several clauses (see eval_func)

    # ------------------------------------------------------------- expressions

    def num_expr(self, ev: tuple, node: tuple, typ: str, depth: int = 0) -> str:
        """A parenthesised expression of type ``typ`` ('int' or 'float'); a
        float expression may mix ints in."""
        rng = self.rng
        if self.errors and self.may_fail and depth == 0 and rng.random() < 0.3:
            # a divisor that may be 0: the expression may fail
            ints = [f"EV.{a}" for a, t in ev if t == "int"] + [f"NODE.{a}" for a, t in node if t == "int"]
            if ints:
                left = self.num_expr(ev, node, "int" if typ == "int" else rng.choice(["int", "float"]), 1)
                return f"({left}){rng.choice(['/', '%'])}({rng.choice(ints)})"
        ok = ("int",) if typ == "int" else ("int", "float")
        leaves = [f"EV.{a}" for a, t in ev if t in ok] + [f"NODE.{a}" for a, t in node if t in ok]
        if node and rng.random() < 0.2:  # a bare name: the event's if it has it, else the instance's
            bare = [a for a, t in ev + node if t in ok and not (a in dict(ev) and dict(ev)[a] not in ok)]
            leaves += bare
        wide = self.errors
        if depth >= 2 or rng.random() < 0.4:
            if leaves and rng.random() < 0.7:
                return rng.choice(leaves)
            return _lit(_num(rng, rng.choice(ok), wide))
        # with wide values, + - * ^ and negation may overflow: not where the order of evaluation decides
        safe = wide and not self.may_fail
        op = rng.choice(["/", "%"] if safe else ["+", "-", "*", "/", "%", "^", "neg"])
        if op == "neg":
            inner = self.num_expr(ev, node, typ, depth + 1)
            # -(-9223372036854775808) is the literal 9223372036854775808, out of range: refused on loading
            return inner if inner == str(INT_MIN) else f"-({inner})"
        if op in ("/", "%"):
            left = self.num_expr(ev, node, "int" if op == "%" and (typ == "int" or rng.random() < 0.7) else typ,
                                 depth + 1)
            divisors = [2, 3, -2, -3] if safe else [1, 2, 3, -1, -2, 7, -7]
            return f"({left}){op}({rng.choice(divisors)})"
        if op == "^":
            exps = [0, 1, 2] + ([3, 31, 62, 63, 64] if wide else [])
            if typ == "float" and wide and rng.random() < 0.4:  # a float power: negative, fractional
                exps = [-1, -2, 0.5, -0.5, 2.5, 300]
            return f"({self.num_expr(ev, node, typ, depth + 1)})^({rng.choice(exps)})"
        return f"({self.num_expr(ev, node, typ, depth + 1)}){op}({self.num_expr(ev, node, typ, depth + 1)})"

    def complex_atom(self, ev: tuple, node: tuple) -> str:
        rng = self.rng
        strs_ev = [a for a, t in ev if t == "string"]
        strs_node = [a for a, t in node if t == "string"]
        k = rng.random()
        if k < 0.15 and strs_ev:
            text = rng.choice(strs_ev)  # (draws in this order: replayed seeds must give the same cases)
            pattern = _lit(rng.choice(['A', 'B', 'Gamma', 'x']))
            return f"CONTAINS(EV.{text}, {pattern})={rng.choice([0, 1])}"
        if k < 0.25 and strs_ev and (strs_node or rng.random() < 0.5):
            other = f"NODE.{rng.choice(strs_node)}" if strs_node else _lit(rng.choice(NAMES))
            text = rng.choice(strs_ev)
            op, bound = rng.choice(['>', '>=', '<']), rng.choice([0, 0.5, 0.7, 1])
            return f"SIMILARITY({other}, EV.{text}){op}{bound}"
        if k < 0.32 and strs_ev and strs_node:
            return f"EV.{rng.choice(strs_ev)}{rng.choice(['=', '!='])}NODE.{rng.choice(strs_node)}"
        typ = rng.choice(["int", "float"])
        return f"{self.num_expr(ev, node, typ)}{rng.choice(OPS)}{self.num_expr(ev, node, typ)}"

    # ------------------------------------------------------------- predicates

    def atom(self, ev: tuple, node: tuple, start: bool) -> str:
        rng = self.rng
        kinds = ["static", "static", "complex"] + ([] if start else ["dynamic", "dynamic", "composite"]) + ["event"]
        kind = rng.choice(kinds)
        if kind == "dynamic":
            pairs = [(a, b) for a, t in ev for b, u in node if (t == "string") == (u == "string")]
            if pairs:
                a, b = rng.choice(pairs)
                op = rng.choice(["=", "=", "!="] if dict(ev)[a] == "string" else OPS)
                return f'<DynamicPred EventAttr="{a}" OP="{XML_OPS[op]}" NodeAttr="{b}"/>'
            kind = "static"
        if kind == "static":
            a, t = rng.choice(ev) if ev else ("", "")
            if not a:
                kind = "event"
            else:
                op = rng.choice(["=", "!="] if t == "string" else OPS)
                const = _value(rng, t, self.errors)
                if t != "string" and rng.random() < 0.2:  # 2.5 against an int, 3 against a float
                    const = rng.choice([2.5, -0.5, 3, 1])
                xop = "&lt;&gt;" if op == "!=" and rng.random() < 0.3 else XML_OPS[op]
                return f'<StaticPred EventAttr="{a}" OP="{xop}" Const={quoteattr(str(const))}/>'
        if kind in ("event", "composite"):
            typ = "EVENT" if kind == "event" else "COMPOSITE"
            return (f'<DurationPred Type="{typ}" OP="{XML_OPS[rng.choice(OPS)]}" '
                    f'Const="{rng.choice([0, 1, 2, 2.5, 3, 5])}"/>')
        return f"<ComplexPred Expr={quoteattr(self.complex_atom(ev, node))}/>"

    def eval_func(self, ev: tuple, node: tuple, start: bool, true_often: bool = False) -> str:
        rng = self.rng
        r = rng.random()
        if r < (0.35 if true_often else 0.15):
            return ""  # no EvalFunc: TRUE
        if r < (0.45 if true_often else 0.2):
            return "<EvalFunc>\n</EvalFunc>\n"  # empty: TRUE
        clauses = []
        n = rng.choice([1, 1, 1, 2, 2, 3])
        # Which clauses of an OR are evaluated once an expression in one fails is not fixed
        # (short-circuit order), so failing expressions go only into one-clause predicates,
        # where any failure or false atom makes the clause, and the predicate, false.
        self.may_fail = n == 1
        for _ in range(n):
            atoms = [self.atom(ev, node, start) for _ in range(rng.choice([1, 1, 2, 3]))]
            if rng.random() < 0.05:
                atoms = []  # an empty clause: AND of nothing, TRUE
            clauses.append("<PredClause>\n" + "\n".join(atoms) + "\n</PredClause>\n")
        self.may_fail = True
        return "<EvalFunc>\n" + "".join(clauses) + "</EvalFunc>\n"

    # ------------------------------------------------------------- schema maps

    def schema_map(self, ev: tuple, node: tuple, dest: tuple) -> str:
        rng = self.rng
        lines = []
        for a, t in dest:
            src_ev = [x for x, u in ev if u == t]
            src_node = [x for x, u in node if u == t]
            r = rng.random()
            if r < 0.4 and src_ev:
                lines.append(f'<OldNewAttrPair OldAttrSource="EV" OldAttr="{rng.choice(src_ev)}" NewAttr="{a}"/>')
            elif r < 0.75 and src_node:
                lines.append(f'<OldNewAttrPair OldAttrSource="NODE" OldAttr="{rng.choice(src_node)}" NewAttr="{a}"/>')
            elif t == "string":
                if src_ev and rng.random() < 0.5:
                    lines.append(f'<OldNewAttrPair OldAttrSource="EV" OldAttr="{rng.choice(src_ev)}" NewAttr="{a}"/>')
                else:
                    lines.append(f"<UDF Expr={quoteattr(_lit(rng.choice(NAMES)))} Attr=\"{a}\"/>")
            else:
                lines.append(f"<UDF Expr={quoteattr(self.num_expr(ev, node, t))} Attr=\"{a}\"/>")
        return "<SchemaMap>\n" + "\n".join(lines) + ("\n" if lines else "") + "</SchemaMap>\n"

    # ------------------------------------------------------------- automata

    def schema(self, ev: tuple) -> tuple:
        rng = self.rng
        n = rng.randint(1, 4)
        out, used = [], set()
        for i in range(n):
            if rng.random() < 0.4 and ev:  # reuse an event attribute's name (bare names, renaming)
                a, t = rng.choice(ev)
            else:
                a, t = f"x{i}", rng.choice(["int", "float", "string"])
            while a in used:
                a = f"{a}_{i}"
            used.add(a)
            out.append((a, t))
        return tuple(out)

    def automaton(self, idx: int, streams: dict) -> tuple[str, dict]:
        """AIR text of one automaton and the output streams it publishes."""
        rng = self.rng
        readable = list(streams)
        n_mid = rng.choice([1, 1, 2, 2, 3])
        inputs = [rng.choice(readable) for _ in range(n_mid + 1)]   # START, S1..Sn
        schemas = [()] + [self.schema(streams[inputs[i - 1]]) for i in range(1, n_mid + 1)]
        schemas.append(self.schema(streams[inputs[n_mid]]))       # END
        published = {}
        outputs = {}
        for i in range(1, n_mid + 1):
            if rng.random() < 0.2:
                name = f"P{idx}_{i}"
                outputs[i] = [(name, rng.choice(["OUT", "RESUB"]))]
                published[name] = schemas[i]
        end = n_mid + 1
        outputs[end] = [(f"O{idx}", rng.choice(["OUT", "OUT", "RESUB"]))]
        published[f"O{idx}"] = schemas[end]
        if rng.random() < 0.15:  # a second output stream on the same state: one witness on each
            outputs[end].append((f"Q{idx}", "OUT"))
            published[f"Q{idx}"] = schemas[end]
        letters = rng.random() < 0.3
        nid = [(f"n{'SABCDEFGH'[i]}" if letters else str(i * 10 + 1)) for i in range(end + 1)]
        nodes = []
        for i in range(end + 1):
            parts = []
            kind = "START" if i == 0 else "INTERMEDIATE_OR_END"
            stream = f' InputStreamName="{inputs[i]}"' if i < end else ""
            parts.append(f'<Node NodeID="{nid[i]}" NodeType="{kind}"{stream}>\n')
            if i > 0:
                parts.append("<Schema>\n" + "".join(f'<AttrName Name="{a}" Type="{t}"/>\n' for a, t in schemas[i])
                             + "</Schema>\n")
            for name, kind in outputs.get(i, ()):
                parts.append(f'<OutputStreamName Name="{name}" Type="{kind}"/>\n')
            if i == end:
                parts.append("</Node>\n")
                nodes.append("".join(parts))
                continue
            ev, node, start = streams[inputs[i]], schemas[i], i == 0
            if not start:
                r = rng.random()
                if r < 0.7:
                    parts.append("<FilterEdge>\n" + self.eval_func(ev, node, False) + "</FilterEdge>\n")
                # else: no FilterEdge at all, the filter predicate is TRUE
                if rng.random() < 0.4:
                    typ = ' Type="DEL"' if rng.random() < 0.2 else ""
                    parts.append(f"<RebindEdge{typ}>\n" + self.eval_func(ev, node, False, true_often=True)
                                 + self.schema_map(ev, node, node) + "</RebindEdge>\n")
            dests = [i + 1] + [j for j in range(i + 1, end + 1) if rng.random() < 0.2]  # may repeat i + 1
            for j in dests:
                typ = ' Type="DEL"' if rng.random() < 0.15 else ""
                parts.append(f'<ForwardEdge Destination="{nid[j]}"{typ}>\n'
                             + self.eval_func(ev, node, start, true_often=True)
                             + self.schema_map(ev, () if start else node, schemas[j]) + "</ForwardEdge>\n")
            parts.append("</Node>\n")
            nodes.append("".join(parts))
        if rng.random() < 0.3:
            rng.shuffle(nodes)  # document order is not automaton order
        return "<NFA>\n" + "".join(nodes) + "</NFA>\n", published


def stream(rng: random.Random, streams: dict, n: int, max_gap: int = 2, max_dur: int = 4,
           wide: bool = False) -> list[Event]:
    """``n`` events of the base streams: a gap of 0 (simultaneous) is common,
    and some events are intervals; ``wide``: values from the whole domain too."""
    t, out = 0, []
    for _ in range(n):
        t += rng.choice([0, 0, 0] + list(range(1, max_gap + 1)))
        name = rng.choice(list(BASE))
        values = tuple(_value(rng, typ, wide, event=True) for _, typ in streams[name])
        dur = rng.choice([0, 0, rng.randint(0, max_dur)])
        out.append(Event(name, values, t - dur, t))
    return out


def case(seed: int, max_automata: int = 3, max_events: int = 18, errors: bool = False) -> Case:
    """One random case; with ``errors``, some divisors are attributes that may
    be 0 and values come from the whole domain, so some expressions fail on
    some events."""
    rng = random.Random(seed)
    g = _Gen(rng, errors)
    streams = dict(BASE)
    texts = []
    for idx in range(rng.randint(1, max_automata)):
        text, published = g.automaton(idx, streams)
        texts.append(text)
        streams.update(published)
        if rng.random() < 0.3:
            # the same automaton again for another owner, publishing under other names: the engine
            # merges its states with the first one's (docs/design/air-format.md), which must change nobody's witnesses
            copy_idx = f"{idx}c"
            copy = re.sub(r'<OutputStreamName Name="([A-Z])[0-9]+', rf'<OutputStreamName Name="\g<1>{copy_idx}', text)
            texts.append(copy)
            streams.update({re.sub(r"^([A-Z])[0-9]+", rf"\g<1>{copy_idx}", k): v for k, v in published.items()})
    events = stream(rng, streams, rng.randint(3, max_events), wide=errors)
    schedule = _schedule(rng, texts, events)
    restart_at = rng.randrange(len(events)) if rng.random() < 0.4 else None
    return Case(seed, texts, streams, events, schedule, restart_at)


def _schedule(rng: random.Random, texts: list[str], events: list[Event]) -> list:
    """When each automaton is added and removed while the events flow (None:
    before the first, never). An automaton is added no earlier than those
    before it (it may read their outputs), and only one whose outputs nobody
    reads is removed."""
    times = sorted({e.t1 for e in events})[1:]
    out, last = [], None
    for i, text in enumerate(texts):
        add = last
        if times and rng.random() < 0.25:
            add = max(last or times[0], rng.choice(times))
        last = add
        outs = re.findall(r'<OutputStreamName Name="([^"]+)"', text)
        read = any(f'InputStreamName="{o}"' in t for o in outs for t in texts[i + 1:])
        later = [t for t in times if add is None or t > add]
        remove = rng.choice(later) if later and not read and rng.random() < 0.2 else None
        out.append((add, remove))
    return out
