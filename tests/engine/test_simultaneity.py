"""Simultaneity: the witness multiset does not depend on the order in which
events that share a detection time are processed (docs/design/semantics.md#simultaneity)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from hypothesis import given, settings, strategies as st

from air.engine import Engine, Event
from tests.conftest import AIR_DIR, PUBLISHERS, STOCK, air, examples

NAMES = ["IBM", "MSFT", "Dell", "IBM Corporation International", "IBM Corporation Internationals"]

ALL_AIR = sorted(p.name for p in AIR_DIR.glob("*.xml"))


def build(files):
    eng = Engine()
    eng.declare(STOCK)
    for f in files:
        for dep in PUBLISHERS.get(f, []) + [f]:  # a publisher is loaded once, before its readers
            if Path(dep).stem not in eng.owners:
                eng.add(air(dep), owner=Path(dep).stem)
    return eng


def multiset(ems):
    return Counter((e.stream, e.kind, e.event.values, e.event.t0, e.event.t1) for e in ems)


event_st = st.tuples(
    st.sampled_from(NAMES),
    st.sampled_from([60.0, 83.0, 83.5, 90.0, 100.0, 100.5, 150.0, 201.0]),
    st.sampled_from([100, 400, 500, 12000]),
    st.integers(0, 3),  # gap to the previous event: 0 makes it simultaneous
    st.integers(0, 150),  # duration
)


@settings(examples(0.6))
@given(
    files=st.lists(st.sampled_from(ALL_AIR), min_size=1, max_size=4, unique=True),
    raw=st.lists(event_st, min_size=1, max_size=25),
    seed=st.integers(0, 2**32 - 1),
)
def test_permuting_simultaneous_events_gives_the_same_witness_multiset(files, raw, seed):
    t = 0
    events = []
    for name, price, vol, gap, dur in raw:
        t += gap
        events.append(Event("Stock", (name, price, vol), t - dur, t))
    base = multiset(build(files).run(events))
    rng = random.Random(seed)
    shuffled = []
    i = 0
    while i < len(events):
        j = i
        while j < len(events) and events[j].t1 == events[i].t1:
            j += 1
        group = events[i:j]
        rng.shuffle(group)
        shuffled.extend(group)
        i = j
    assert multiset(build(files).run(shuffled)) == base


def test_ibmstock_chain_is_order_independent_too():
    """IBM_MSFT_PAIR reads IBMStock, itself a query output (resubscription)."""
    events = [Event("Stock", (n, p, 1), 1, 1) for n, p in [("IBM", 90.0), ("MSFT", 10.0), ("IBM", 95.0)]]
    events += [Event("Stock", ("MSFT", 11.0, 1), 2, 2)]
    a = multiset(build(["IBM_MSFT_PAIR.xml"]).run(events))
    b = multiset(build(["IBM_MSFT_PAIR.xml"]).run(events[2::-1] + events[3:]))
    assert a == b
    # IBM at 90 and 95 (t=1) pair with the next MSFT strictly after t=1
    assert sorted((k[2], k[3], k[4]) for k in a.elements() if k[0] == "IBM_MSFT_PAIR") == [
        ((90.0, 11.0), 1, 2), ((95.0, 11.0), 1, 2)]
