"""Workload generators for the benchmarks, built directly as model automata.

* :func:`edbt` — the technical benchmark
  (docs/design/workloads.md#technical-benchmark, the paper's Table 3): a
  stream of 8 attributes (``D0..D3`` discrete, domain 100; ``C0..C3``
  continuous in [0, 100)), subscriptions from the templates LinearStat,
  LinearDyn, Filter, NonDeterministic and NonDeterministicAgg with
  Zipf-skewed constants.
* :func:`increasing` — docs/design/workloads.md#increasing-prices: one static
  "ten consecutive increasing prices" query per stock symbol over a stream
  whose prices only rise.

The Stock stream, its event generators and its ready-made queries
(``increasing_query``, ``rise_query``, ``runup_query``) are in
:mod:`clients.testing.market`, public for users' tests.

All randomness comes from ``random.Random(seed)``: the same arguments give the
same automata and events.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

from air.engine import Event
from air.expr import Binary, Compare, Literal, Ref
from air.model import (
    Attribute, Automaton, Clause, ComplexAtom, Computed, DurationAtom, Edge, OutputStream, Predicate, Rename, State,
    StaticAtom, StreamSchema,
)
from clients.testing.market import STOCK, increasing_query, increasing_stream, symbols

TEMPLATES = ("LinearStat", "LinearDyn", "Filter", "NonDeterministic", "NonDeterministicAgg")

EDBT_STREAM = StreamSchema("S", tuple([Attribute(f"D{i}", "int") for i in range(4)]
                                      + [Attribute(f"C{i}", "float") for i in range(4)]))
DOMAIN = 100  # values of a discrete attribute
RANGES = 25  # distinct ranges an inequality predicate can select
SELECTIVITY = 0.7  # of one range predicate over C uniform in [0, 100)
DURATION = 20  # the duration constant t of Filter and NonDeterministic*


class Zipf:
    """Ranks 0..n-1 with P(k) proportional to 1/(k+1)^s."""

    def __init__(self, n: int, s: float, rng: random.Random) -> None:
        total, self.cum = 0.0, []
        for k in range(n):
            total += 1.0 / (k + 1) ** s
            self.cum.append(total)
        self.rng = rng

    def __call__(self) -> int:
        return bisect.bisect_left(self.cum, self.rng.random() * self.cum[-1])


@dataclass
class Workload:
    name: str
    streams: tuple[StreamSchema, ...]
    automata: list[Automaton] | EdbtSubscriptions
    events: list[Event]


def _clause(*atoms) -> Predicate:
    return Predicate((Clause(tuple(atoms)),))


def _copy(prefix: str, names, source: str = "EV") -> tuple:
    return tuple(Rename(source, n, f"{prefix}{n}") for n in names)


def _keep(names) -> tuple:
    return tuple(Rename("NODE", n, n) for n in names)


CONT = ("C0", "C1", "C2", "C3")


def _edbt_step(zipf_attr: Zipf, zipf_val: Zipf, zipf_range: Zipf, att: int, v: int) -> list:
    """θ_i: the primary predicate, one more discrete equality, two range predicates."""
    others = [d for d in range(4) if d != att]
    other = others[zipf_attr() % 3]
    atoms = [StaticAtom(f"D{att}", "=", str(v)), StaticAtom(f"D{other}", "=", str(zipf_val()))]
    c1 = zipf_attr()
    c2 = (c1 + 1 + zipf_attr() % 3) % 4
    span = SELECTIVITY * 100
    for c in sorted((c1, c2)):
        lo = zipf_range() * (100 - span) / (RANGES - 1)
        atoms += [StaticAtom(f"C{c}", ">=", repr(lo)), StaticAtom(f"C{c}", "<", repr(lo + span))]
    return atoms


def edbt_subscription(template: str, zipfs) -> Automaton:
    """One subscription of ``template`` (docs/design/workloads.md#technical-benchmark)."""
    z_attr, z_val1, z_val2, z_val3, z_r1, z_r2, z_r3 = zipfs
    att = z_attr() % 4
    v = z_val1()
    th = [_edbt_step(z_attr, zv, zr, att, v) for zv, zr in ((z_val1, z_r1), (z_val2, z_r2), (z_val3, z_r3))]
    a_attrs = tuple(Attribute(f"a{c}", "float") for c in CONT)
    b_attrs = a_attrs + tuple(Attribute(f"b{c}", "float") for c in CONT)
    end_attrs = b_attrs + tuple(Attribute(f"c{c}", "float") for c in CONT)
    map_a = _copy("a", CONT)
    map_b = _keep(f"a{c}" for c in CONT) + _copy("b", CONT)
    map_end = _keep(a.name for a in b_attrs) + _copy("c", CONT)
    primary = StaticAtom(f"D{att}", "=", str(v))
    dur_ok = DurationAtom("COMPOSITE", "<=", float(DURATION))
    out = (OutputStream("M", "OUT"),)
    if template in ("LinearStat", "LinearDyn"):
        t2, t3 = list(th[1]), list(th[2])
        if template == "LinearDyn":  # a parameterised atom: 1% above the first event's value
            c = CONT[z_attr() % 4]
            t2.append(ComplexAtom(Compare(">", Ref(c, "EV"), Binary("*", Ref(f"a{c}", "NODE"), Literal(1.01)))))
            t3.append(ComplexAtom(Compare(">", Ref(c, "EV"), Binary("*", Ref(f"b{c}", "NODE"), Literal(1.01)))))
        states = (
            State("0", True, "S", forwards=(Edge("A", _clause(*th[0]), map_a),)),
            State("A", False, "S", a_attrs, filter=Predicate(), forwards=(Edge("B", _clause(*t2), map_b),)),
            State("B", False, "S", b_attrs, filter=Predicate(), forwards=(Edge("E", _clause(*t3), map_end),)),
            State("E", False, None, end_attrs, outputs=out),
        )
        return Automaton(states, template)
    # Filter / NonDeterministic(Agg): events of other values within t are skipped;
    # an instance is affected by an event of its primary value, or once DUR > t.
    affected = Predicate((Clause((primary,)), Clause((DurationAtom("COMPOSITE", ">", float(DURATION)),))))
    if template == "Filter":
        states = (
            State("0", True, "S", forwards=(Edge("A", _clause(*th[0]), map_a),)),
            State("A", False, "S", a_attrs, filter=affected, forwards=(Edge("B", _clause(*th[1], dur_ok), map_b),)),
            State("B", False, "S", b_attrs, filter=affected, forwards=(Edge("E", _clause(*th[2], dur_ok), map_end),)),
            State("E", False, None, end_attrs, outputs=out),
        )
        return Automaton(states, template)
    if template == "NonDeterministic":
        rb_a = Edge("A", _clause(dur_ok), _keep(a.name for a in a_attrs))
        rb_b = Edge("B", _clause(dur_ok), _keep(a.name for a in b_attrs))
        states = (
            State("0", True, "S", forwards=(Edge("A", _clause(*th[0]), map_a),)),
            State("A", False, "S", a_attrs, filter=affected, rebind=rb_a,
                  forwards=(Edge("B", _clause(*th[1], dur_ok), map_b),)),
            State("B", False, "S", b_attrs, filter=affected, rebind=rb_b,
                  forwards=(Edge("E", _clause(*th[2], dur_ok), map_end),)),
            State("E", False, None, end_attrs, outputs=out),
        )
        return Automaton(states, template)
    if template == "NonDeterministicAgg":  # sums of the continuous attributes of the matched events
        s_attrs = tuple(Attribute(f"s{c}", "float") for c in CONT)

        def summed() -> tuple:
            return tuple(Computed(Binary("+", Ref(f"s{c}", "NODE"), Ref(c, "EV")), f"s{c}") for c in CONT)

        states = (
            State("0", True, "S", forwards=(Edge("A", _clause(*th[0]), _copy("s", CONT)),)),
            State("A", False, "S", s_attrs, filter=affected, rebind=Edge("A", _clause(dur_ok), summed()),
                  forwards=(Edge("B", _clause(*th[1], dur_ok), summed()),)),
            State("B", False, "S", s_attrs, filter=affected, rebind=Edge("B", _clause(dur_ok), summed()),
                  forwards=(Edge("E", _clause(*th[2], dur_ok), summed()),)),
            State("E", False, None, s_attrs, outputs=(OutputStream("MA", "OUT"),)),
        )
        return Automaton(states, template)
    raise ValueError(f"unknown template {template!r}; use one of {', '.join(TEMPLATES)}")


class EdbtSubscriptions:
    """The subscriptions of :func:`edbt`, made afresh on each iteration (the
    same ones every time), so that a benchmark with 400K subscriptions does not
    hold 400K model automata besides what the engine keeps."""

    def __init__(self, template: str, n: int, seed: int, zipf: tuple[float, float, float], domain: int) -> None:
        self.template, self.n, self.seed, self.zipf, self.domain = template, n, seed, zipf, domain

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        rng = random.Random(self.seed)
        z1, z2, z3 = self.zipf
        d = self.domain
        zipfs = (Zipf(4, z1, rng), Zipf(d, z1, rng), Zipf(d, z2, rng), Zipf(d, z3, rng),
                 Zipf(RANGES, z1, rng), Zipf(RANGES, z2, rng), Zipf(RANGES, z3, rng))
        for _ in range(self.n):
            yield edbt_subscription(self.template, zipfs)


def edbt(template: str, subscriptions: int, events: int, seed: int = 1,
         zipf: tuple[float, float, float] = (1.0, 1.0, 0.8), domain: int = DOMAIN) -> Workload:
    """Table 3 defaults: zipf1 = 1 (attributes and the first step's values),
    zipf2 = 1, zipf3 = 0.8; events uniform over every attribute. A smaller
    ``domain`` (tests) makes matches frequent."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; use one of {', '.join(TEMPLATES)}")
    autos = EdbtSubscriptions(template, subscriptions, seed, zipf, domain)
    erng = random.Random(seed + 1)
    evs = []
    for t in range(1, events + 1):
        vals = tuple(erng.randrange(domain) for _ in range(4)) + tuple(erng.random() * 100 for _ in range(4))
        evs.append(Event("S", vals, t, t))
    return Workload(f"edbt-{template}", (EDBT_STREAM,), autos, evs)


# --------------------------------------------------------------------------- stock workloads

def increasing(queries: int, events: int, length: int = 10, seed: int = 1, stream_symbols: int | None = None
               ) -> Workload:
    autos = [increasing_query(s, length) for s in symbols(queries)]
    evs = increasing_stream(stream_symbols or queries, events, seed)
    return Workload("increasing", (STOCK,), autos, evs)
