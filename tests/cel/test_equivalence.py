"""Behaviour on events: compiled automata run by the engine give exactly the
witnesses of (a) the original compiler's AIR for the conformance corpus and
(b) the oracle's CEL (tests/cel/reference.py: an independent front end that
evaluates the algebra, tests/oracle/celeval.py) for the corpus and queries it
has no AIR for; and the paper's Figures 3-4 run."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from air.airxml import load_air
from air.cel import compile_cel
from air.engine import Engine, Event
from tests.cel.corpus import IBMSTOCK, STOCK, STREAMS, UNKNOWN_SCHEMA, cel_files, cel_text, pairs
from tests.cel import reference

NAMES = ["IBM", "MSFT", "IBM", "DELL", "IBM International Business Machines",
         "IBM International Business Machines Corp"]
PRICES = [5.0, 50.0, 60.5, 84.0, 90.0, 101.0, 150.0, 210.0]


M_SHAPE = [100.0, 90.0, 95.0, 110.0, 100.0, 95.0, 100.0, 95.0, 88.0, 89.0]


def events(seed: int, n: int = 50) -> list[Event]:
    """Stock, IBMStock and DUAL events; some simultaneous, some with a
    duration. By ``seed % 4``: random quotes, rising runs, falling runs (for
    FOLD), or IBM tracing an M shape (test1000) among other quotes."""
    rnd = random.Random(seed)
    t, price, out = 0, 50.0, []
    mode = seed % 4
    m_shape = list(M_SHAPE)
    for _ in range(n):
        t += rnd.choice([0, 1, 1, 2, 3, 50, 200]) if rnd.random() > 0.1 else 0
        t0 = t - rnd.choice([0, 0, 0, 150, 1200])
        if mode == 3:
            t += 1
            quote = ("IBM", m_shape.pop(0), 100) if m_shape and rnd.random() < 0.7 else \
                ("MSFT", rnd.choice(PRICES), 100)
            out.append(Event("Stock", quote, t, t))
        elif rnd.random() < 0.1:
            out.append(Event("IBMStock", (rnd.choice([80.0, 84.0, 90.0, 120.0]),), t0, t))
        elif rnd.random() < 0.04:
            out.append(Event("DUAL", (), t0, t))
        elif mode:
            price += rnd.choice([1.0, 1.0, 2.0, 1.0, -1.0]) * (1 if mode == 1 else -1)
            out.append(Event("Stock", (rnd.choice(["IBM", "IBM", "IBM", "MSFT"]), price,
                                       rnd.choice([100, 400, 15000])), t0, t))
        else:
            out.append(Event("Stock", (rnd.choice(NAMES), rnd.choice(PRICES), rnd.choice([100, 400, 500, 15000])),
                             t0, t))
    return out


def witnesses(automata, evs, stream: str) -> Counter:
    eng = Engine()
    eng.declare(STOCK)
    eng.declare(IBMSTOCK)
    eng.add(automata, owner="q")
    schema = eng.schema(stream)
    return Counter((tuple(sorted(zip(schema.names, em.event.values))), em.event.t0, em.event.t1)
                   for em in eng.run(evs) if em.stream == stream)


def oracle(text: str, evs) -> Counter:
    return reference.witnesses(text, evs, STREAMS)


SEEDS = range(12)


@pytest.mark.parametrize("name,paths", pairs(), ids=lambda x: str(x))
def test_same_witnesses_as_the_original_air(name, paths):
    q = compile_cel(cel_text(name), STREAMS)
    orig = [load_air(p.read_text()) for p in paths]
    out = q.outputs[-1]
    total = 0
    for seed in SEEDS:
        evs = events(seed)
        mine = witnesses(q.automata, evs, out)
        assert mine == witnesses(orig, evs, out), f"seed {seed}"
        total += sum(mine.values())
    assert total > 0  # the comparison is not vacuous


EXTRA = [
    # the system paper's CEL examples (docs/design/semantics.md#cel; decorators as the paper intends them)
    "SELECT IBMPrice, Price AS MSFTPrice FROM IBMStock NEXT{Name='MSFT'} (Stock)",
    "SELECT Name FROM (SELECT Price FROM Stock) NEXT{$1.Price = $2.Price} (Stock)",
    "SELECT Price_1 AS IBMPrice1, Price AS IBMPrice2 FROM (FILTER{Name='IBM' AND Price > 83}(Stock)) "
    "NEXT{$2.Price > $1.Price} (FILTER{Name='IBM'}(Stock))",
    "SELECT * FROM FILTER{cnt > 3}((SELECT *, 1 AS cnt FROM FILTER{Volume > 300}(Stock)) "
    "FOLD{$2.Name = $.Name, $2.Price > $.Price, $.cnt+1 AS cnt} Stock)",
    # FILTERs on composite outputs, DUR of composites and events
    "FILTER{Price_1 < Price AND DUR > 2}(Stock NEXT{$1.Name = $2.Name} Stock)",
    "Stock NEXT{DUR < 100 OR $2.DUR > 100} FILTER{Price > 60}(Stock)",
    "FILTER{DUR >= 3}(Stock FOLD{$2.Name = $.Name, $2.Price < $.Price,} Stock) NEXT{$2.Name = $1.Name} Stock",
    # aggregates, renaming, SELECT between operators
    "(SELECT *, 1 AS cnt, Price AS total FROM Stock) FOLD{$1.Name = $2.Name, $2.Price >= $.Price, "
    "$.cnt + 1 AS cnt, $.total + $2.Price AS total} Stock",
    "Stock FOLD{$1.Name = $2.Name, $1.Volume < $2.Volume OR $.Price < $2.Price, $.Price + $2.Price AS Price} Stock",
    "SELECT N, Price_1_1 - Price AS drop FROM (SELECT Name, Price FROM Stock) NEXT{$1.Name = $2.Name} "
    "(SELECT Name, Price FROM Stock) NEXT{$2.N = $1.Name AND $2.Price > $1.Price} (SELECT Name AS N, Price FROM Stock)",
    "SELECT Name, Volume / 3 AS v, Volume % 7 AS m, CONTAINS(Name, 'BM') AS c FROM FILTER{Price * 2 > 100}(Stock)",
    # non-left-associated: right operands compiled apart and resubscribed
    "IBMStock NEXT{$1.IBMPrice < $2.P} (SELECT Name, Price AS P FROM Stock NEXT{$1.Name = $2.Name} Stock)",
    "(SELECT Name, Price FROM Stock) FOLD{$1.Name = $2.Name,,} FILTER{Price > 40}"
    "(SELECT Name, Price FROM Stock NEXT{$1.Price < $2.Price} Stock)",
    "(SELECT IBMPrice FROM IBMStock PUBLISH Ibm) NEXT{$2.Price > $1.IBMPrice} FILTER{Name = 'IBM'}(Stock)",
    # the paper's M-shape query, the corpus' longest
    cel_text("test1000"),
]
CORPUS = [cel_text(p.stem) for p in cel_files() if p.stem not in UNKNOWN_SCHEMA]


@pytest.mark.parametrize("text", EXTRA + CORPUS, ids=lambda t: t[:60])
def test_same_witnesses_as_the_reference_interpreter(text):
    q = compile_cel(text, STREAMS)
    total = 0
    for seed in SEEDS:
        evs = events(seed)
        mine = witnesses(q.automata, evs, q.outputs[-1])
        assert mine == oracle(text, evs), f"seed {seed}"
        total += sum(mine.values())
    assert total > 0  # the comparison is not vacuous


def test_nested_publish_emits_both_streams():
    q = compile_cel("(SELECT IBMPrice FROM IBMStock PUBLISH Ibm) NEXT{$2.Price > $1.IBMPrice} Stock PUBLISH Up",
                    STREAMS)
    eng = Engine()
    eng.declare(STOCK)
    eng.declare(IBMSTOCK)
    eng.add(q.automata, owner="q")
    ems = eng.run([Event("IBMStock", (80.0,), 1, 1), Event("Stock", ("X", 70.0, 1), 2, 2),
                   Event("Stock", ("Y", 85.0, 1), 3, 3)])
    assert [(e.stream, e.kind, e.event.values, e.event.t0, e.event.t1) for e in ems] == [
        ("Ibm", "OUT", (80.0,), 1, 1), ("Up", "OUT", (80.0, "Y", 85.0, 1), 1, 3)]


# ---------------------------------------------------- the paper's example: docs/design/semantics.md#the-running-example


# As printed in the system paper (docs/design/semantics.md#the-running-example), with its typos
# fixed: its decorators ($.Name = $.Name) and
# the renaming the NEXT applies to its left input (Name is shared, so MaxPrice -> MaxPrice_1).
EXAMPLE_9 = """
SELECT Name, MaxPrice_1 AS MaxPrice, MinPrice_1 AS MinPrice, Price AS FinalPrice
FROM FILTER{DUR >= 10 MIN}(
       SELECT Name, Price_1 AS MaxPrice, Price AS MinPrice
       FROM FILTER{Volume > 10000}(Stock)
            FOLD{$2.Name = $.Name, $2.Price < $.Price, }
            Stock)
     NEXT{$2.Name = $1.Name AND $2.Price > 1.05 * $1.MinPrice}
     Stock
PUBLISH Rebound
"""


def at(hh: int, mm: int) -> int:
    return (hh * 60 + mm) * 60_000


def test_example_9_reproduces_figures_3_and_4():
    q = compile_cel(EXAMPLE_9, STREAMS)
    (auto,) = q.automata
    assert [len(s.forwards) for s in auto.states] == [1, 1, 1, 0]  # start, A, B, end
    a, b = auto.states[1].id, auto.states[2].id
    eng = Engine()
    eng.declare(STOCK)
    eng.add(q.automata, owner="ex9")
    figure3 = [("IBM", 90.0, 15000, at(9, 10)), ("IBM", 85.0, 7000, at(9, 15)), ("Dell", 40.0, 11000, at(9, 17)),
               ("IBM", 81.0, 8000, at(9, 21)), ("MSFT", 25.0, 6000, at(9, 23)), ("IBM", 91.0, 9000, at(9, 24))]
    i1 = lambda price, t1: (("IBM", 90.0, 15000, "IBM", price, 15000 if t1 == at(9, 10) else  # noqa: E731
                             {at(9, 15): 7000, at(9, 21): 8000}[t1]), at(9, 10), t1)
    i2 = (("Dell", 40.0, 11000, "Dell", 40.0, 11000), at(9, 17), at(9, 17))
    i3 = (("IBM", 90.0, 81.0), at(9, 10), at(9, 21))
    # Figure 4, row by row (state A stores Name_1, Price_1, Volume_1, Name_n, Price_n, Volume_n)
    figure4 = [([i1(90.0, at(9, 10))], []), ([i1(85.0, at(9, 15))], []),
               ([i1(85.0, at(9, 15)), i2], []), ([i2, i1(81.0, at(9, 21))], [i3]),
               ([i2, i1(81.0, at(9, 21))], [i3]), ([i2], [])]
    emitted = []
    eng.on_emit = emitted.append
    for (name, price, volume, t), (at_a, at_b) in zip(figure3, figure4):
        eng.feed(Event("Stock", (name, price, volume), t, t))
        eng.close_epoch()
        inst = eng.instances("ex9")
        assert sorted(inst[f"0/{a}"], key=repr) == sorted(at_a, key=repr)
        assert inst[f"0/{b}"] == at_b
    assert [(e.stream, e.event.values, e.event.t0, e.event.t1) for e in emitted] == [
        ("Rebound", ("IBM", 90.0, 81.0, 91.0), at(9, 10), at(9, 24))]
