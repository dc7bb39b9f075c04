"""The sorted instance index (an inequality filter atom such as
``e.Price >= 1.05 * I.P`` within an AI bucket) only prunes: indexed and
unindexed runs give identical witnesses, errors and instances."""

from __future__ import annotations

import math
import sys

from hypothesis import example, given, settings
from hypothesis import strategies as st

from air.engine import Engine, Event
from air.expr import Binary, Compare, Literal, Ref
from air.model import Automaton, ComplexAtom, DynamicAtom, Edge, OutputStream, Predicate, State, StaticAtom
from clients.testing import STOCK, random_walk, rise_query
from tests.conftest import examples
from tests.engine.test_indexes_support import KEEP, NAMES, NPV, STEP, TAKE, _p, run_config, witnesses

EV_PRICE, EV_VOL, I_P, I_V = Ref("Price", "EV"), Ref("Volume", "EV"), Ref("P", "NODE"), Ref("V", "NODE")

#: Inequality atoms the sorted index can hold (event side vs instance side, either order).
INEQUALITIES = (
    DynamicAtom("Price", ">=", "P"),
    DynamicAtom("Price", ">", "P"),
    DynamicAtom("Price", "<=", "P"),
    DynamicAtom("Price", "<", "P"),
    ComplexAtom(Compare(">=", EV_PRICE, Binary("*", Literal(1.05), I_P))),
    ComplexAtom(Compare("<", Binary("+", I_P, Literal(1)), EV_PRICE)),  # instance side first
    ComplexAtom(Compare(">=", Binary("-", EV_PRICE, Literal(2)), I_P)),
    ComplexAtom(Compare(">", EV_VOL, I_P)),  # int event side, float keys
    ComplexAtom(Compare(">=", EV_PRICE, Binary("/", Literal(6), I_V))),  # raises when V = 0
    ComplexAtom(Compare("<=", Binary("/", Literal(6), EV_VOL), I_P)),  # event side raises when Volume = 0
    ComplexAtom(Compare("<", EV_VOL, I_V)),  # int keys
    DynamicAtom("Name", ">=", "N"),  # strings: no number on either side, every instance is checked
)
#: Atoms it cannot hold; they stay in the filter.
OTHERS = (
    None,
    StaticAtom("Volume", "=", "1"),
    ComplexAtom(Compare(">", EV_PRICE, Binary("+", I_P, EV_VOL))),  # both sides mixed
)


def sorted_automaton(ineq: int, other: int, rebind: int, first: bool) -> Automaton:
    atoms = [DynamicAtom("Name", "=", "N"), INEQUALITIES[ineq]]
    if OTHERS[other] is not None:
        atoms.insert(1 if first else 2, OTHERS[other])
    rb = (None, Edge("A", _p([DynamicAtom("Price", ">", "P")]), STEP), Edge("A", Predicate(), KEEP))[rebind]
    states = (
        State("0", True, "Stock", forwards=(Edge("A", Predicate(), TAKE),)),
        State("A", False, "Stock", NPV, filter=_p(atoms), rebind=rb,
              forwards=(Edge("E", Predicate(), STEP),)),
        State("E", False, None, NPV, outputs=(OutputStream("Out", "OUT"),)),
    )
    return Automaton(states, "sorted")


#: Values of the data model (docs/design/semantics.md#values): the largest floats make the atoms'
#: arithmetic overflow, which fails (docs/design/semantics.md#arithmetic-and-comparison). No decoder
#: passes NaN or infinity and no operation makes one; the example below still feeds a NaN directly.
PRICES = st.one_of(st.integers(0, 12).map(float), st.sampled_from([sys.float_info.max, -1e308]), st.just(-0.0))
EVENTS = st.lists(st.tuples(st.integers(0, 2), PRICES, st.sampled_from([0, 1, 2, 7]), st.sampled_from([0, 0, 1, 2]),
                            st.sampled_from([0, 0, 0, 1, 3])), min_size=1, max_size=40)
CONFIGS = {"all": {}, "no-sorted": {"sorted_index": False}, "no-mqo": {"index": False, "merge": False}}


def _stream(values) -> list[Event]:
    t, out = 0, []
    for n, p, v, gap, dur in values:
        t += gap
        out.append(Event("Stock", (NAMES[n], p, v), t - dur, t))
    return out


def _has_sorted_index(eng: Engine) -> bool:
    return any(n.iq is not None for h in eng.holdings().values() for _a, _s, n in h.states)


@settings(examples(3))
@example(specs=[(9, 0, 0, False), (8, 0, 1, True), (11, 0, 0, True)],
         values=[(0, 5.0, 0, 1, 0), (0, 4.0, 2, 0, 0), (0, 6.0, 0, 1, 0), (0, math.nan, 1, 1, 0), (0, 9.0, 0, 1, 1)])
@given(specs=st.lists(st.tuples(st.integers(0, len(INEQUALITIES) - 1), st.integers(0, len(OTHERS) - 1),
                                st.integers(0, 2), st.booleans()), min_size=1, max_size=4),
       values=EVENTS)
def test_sorted_index_gives_the_same_results_as_none(specs, values):
    loads = [(f"o{i}", sorted_automaton(*s)) for i, s in enumerate(specs)]
    events = _stream(values)
    results = {}
    for label, opts in CONFIGS.items():
        eng, ems = run_config(opts, loads, events)
        assert _has_sorted_index(eng) == (label == "all")
        results[label] = (witnesses(ems), eng.stats.eval_errors,
                          {o: sorted(map(repr, sum(eng.instances(o).values(), []))) for o, _ in loads},
                          {o: eng.instance_count(o) for o, _ in loads}, {o: eng.instances(o) for o, _ in loads})
    for label, got in results.items():
        assert got[0] == results["all"][0] and got[2:4] == results["all"][2:4], f"{label} differs"
    # the same buckets in the same order, and the same evaluation errors (without
    # any index the static atom Volume = 1 no longer prunes before a raising atom)
    assert repr(results["no-sorted"][4]) == repr(results["all"][4])
    assert results["no-sorted"][1] == results["all"][1]


@settings(examples())
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "remove", "feed", "feed"]), st.integers(0, 3),
                              st.sampled_from([0, 3, 11])), max_size=40),
       values=EVENTS)
@example(ops=[("add", 0, 0), ("feed", 0, 0), ("feed", 0, 0), ("add", 1, 0), ("feed", 0, 0), ("remove", 0, 0),
              ("feed", 0, 0), ("add", 0, 0), ("feed", 0, 0), ("remove", 1, 0)],
         values=[(0, 5.0, 1, 1, 0), (0, 4.0, 1, 1, 0), (0, 6.0, 1, 1, 0), (0, 9.0, 1, 0, 0), (0, 1.0, 1, 0, 0),
                 (0, 12.0, 1, 0, 0), (0, 12.0, 1, 1, 0)])
def test_sorted_index_with_owners_coming_and_going(ops, values):
    """Adding and removing owners mid-stream (purging merged instances) keeps
    the sorted buckets consistent with the unindexed engine."""
    events = _stream(values)
    runs = {}
    for label, opts in CONFIGS.items():
        eng = Engine(**opts)
        eng.declare(STOCK)
        got = []
        eng.on_emit = got.append
        it = iter(events)
        for op, who, ineq in ops:
            owner = f"o{who}"
            if op == "add" and owner not in eng.owners:
                eng.add(sorted_automaton(ineq % len(INEQUALITIES), 0, ineq % 3, True), owner=owner)
            elif op == "remove" and owner in eng.owners:
                eng.remove(owner)
            else:
                ev = next(it, None)
                if ev is not None:
                    eng.feed(ev)
        for ev in it:
            eng.feed(ev)
        eng.flush()
        runs[label] = (witnesses(got), {o: sorted(map(repr, sum(eng.instances(o).values(), [])))
                                        for o in eng.owners}, {o: eng.instance_count(o) for o in eng.owners})
    assert runs["all"] == runs["no-sorted"] == runs["no-mqo"]


def test_rise_query_uses_the_sorted_index_and_matches_the_scan():
    events = random_walk(5, 2000, seed=4, down=0.04, up=0.05)
    base = None
    for label in CONFIGS:
        eng, ems = run_config(CONFIGS[label], [("q", [rise_query()])], events)
        assert _has_sorted_index(eng) == (label == "all")
        got = (witnesses(ems), sorted(map(repr, eng.instances("q")["0/A"])))
        base = base or got
        assert sum(got[0].values()) > 0 and got == base


def test_equal_keys_only_the_affected_instance_leaves():
    """Two waiting instances with the same key (P = 5) that another filter atom
    (Volume < I.V) tells apart: an event affecting only the newer one must take
    exactly that one out of the sorted bucket, or the older one is lost and the
    newer one completes a second time."""
    atoms = [DynamicAtom("Name", "=", "N"), DynamicAtom("Price", ">", "P"), DynamicAtom("Volume", "<", "V")]
    auto = Automaton((
        State("0", True, "Stock", forwards=(Edge("A", Predicate(), TAKE),)),
        State("A", False, "Stock", NPV, filter=_p(atoms), forwards=(Edge("E", Predicate(), STEP),)),
        State("E", False, None, NPV, outputs=(OutputStream("Out", "OUT"),)),
    ))
    events = [Event("Stock", ("IBM", 5.0, 1), 1, 1),   # i1: P = 5, V = 1
              Event("Stock", ("IBM", 5.0, 9), 2, 2),   # i2: P = 5, V = 9 (i1: 5 > 5 fails, waits)
              Event("Stock", ("IBM", 6.0, 5), 3, 3),   # 5 < 9: completes i2 only
              Event("Stock", ("IBM", 7.0, 0), 4, 4)]   # completes i1 (and the instances of t = 2, 3)
    runs = {}
    for label, opts in CONFIGS.items():
        eng, ems = run_config(opts, [("o", auto)], events)
        assert _has_sorted_index(eng) == (label == "all")
        runs[label] = [(em.event.values, em.event.t0, em.event.t1) for em in ems]  # in emission order
    assert runs["all"] == runs["no-sorted"] == runs["no-mqo"]
    assert [w[1:] for w in runs["all"]] == [(2, 3), (1, 4), (3, 4)]
