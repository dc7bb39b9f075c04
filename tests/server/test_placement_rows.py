"""Row scaling's planning, without a server (server/workers/placement.py,
air/partitioning.py): which subscriptions are split, the stable key groups,
and that N copies restricted to their key groups make one engine's witnesses."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from air.cel import compile_cel
from air.engine import Engine, EngineError, FunctionRegistry
from air.partitioning import KEY_GROUP_FUNCTION, key_group, restrict_to_group
from clients.testing import RISING
from clients.testing.market import STOCK, random_walk
from server.workers.placement import AFFINITY_SLACK, ALL, Placement, route_event

FILTER = "SELECT * FROM FILTER{Price > 1}(Stock) PUBLISH Up"
IBM = ("SELECT First, Price AS Last FROM (SELECT Price AS First, Price AS Last FROM FILTER{Name = 'IBM'}(Stock)) "
       "NEXT{$2.Name = 'IBM' AND $2.Price > $1.Last} Stock PUBLISH IbmUp")  # a constant route
NO_KEY = "SELECT * FROM Stock NEXT{$2.Price > 2 * $1.Price} Stock PUBLISH Doubled"
TWICE = "SELECT * FROM Rising NEXT{$1.Name = $2.Name} Rising PUBLISH Twice"
ANY_RISE = "SELECT * FROM Rising NEXT{$2.After > $1.After} Rising PUBLISH AnyRise"


def _place(p: Placement, sid: str, cel: str, schemas) -> int:
    autos = compile_cel(cel, schemas).automata
    reads = {s.input_stream for a in autos for s in a.states if s.input_stream}
    pubs = {o.name for a in autos for _s, o in a.outputs}
    return p.place(sid, reads, pubs, sum(len(a.states) for a in autos), automata=autos)


def _schemas(extra=()):
    rising = compile_cel(RISING, [STOCK])
    out = {"Stock": STOCK}
    for a in rising.automata:
        for st, o in a.outputs:
            from air.model import StreamSchema
            out[o.name] = StreamSchema(o.name, st.schema)
    return out


@pytest.mark.parametrize("mode, expected", [
    ("auto", {"rising": ALL, "filter": "whole", "ibm": "whole", "no_key": "whole"}),
    ("on", {"rising": ALL, "filter": ALL, "ibm": "whole", "no_key": "whole"}),  # ibm: a constant, no key
    ("off", {"rising": "whole", "filter": "whole", "ibm": "whole", "no_key": "whole"}),
])
def test_which_subscriptions_are_split(mode, expected):
    schemas = _schemas()
    p = Placement(2, schema=schemas.get, rows=mode)
    got = {}
    for sid, cel in (("rising", RISING), ("filter", FILTER), ("ibm", IBM), ("no_key", NO_KEY)):
        w = _place(p, sid, cel, [STOCK])
        got[sid] = ALL if w == ALL else "whole"
    assert got == expected
    assert (p.describe_key("rising") == "Stock.Name") == (mode != "off")
    assert Placement(1, schema=schemas.get, rows="on").row_mode == "off"  # one worker: nothing to split


def test_a_reader_of_a_row_scaled_output_joins_it_with_the_key_or_is_refused():
    schemas = _schemas()
    p = Placement(2, schema=schemas.get)
    assert _place(p, "rising", RISING, [STOCK]) == ALL
    assert _place(p, "twice", TWICE, schemas) == ALL
    assert p.route("Stock") == ((), (0,), ())  # by Name (index 0), to the worker of its group
    assert p.route("Rising") == ((), (), ())  # made inside each worker: never sent
    with pytest.raises(EngineError, match="no partition key with them"):
        _place(p, "any", ANY_RISE, schemas)
    p.remove("twice")
    p.remove("rising")
    assert p.rows == {} and p.cost == [0, 0]


def test_the_subscriptions_on_each_worker_follow_every_change():
    """``count_on`` (each worker's line of /health) counts a row-scaled subscription on every
    worker and one placed whole on its own, after each placement and removal."""
    schemas = _schemas()
    p = Placement(3, schema=schemas.get)
    assert [p.count_on(w) for w in range(3)] == [0, 0, 0]
    assert _place(p, "rising", RISING, [STOCK]) == ALL
    whole = {sid: _place(p, sid, cel, [STOCK]) for sid, cel in (("filter", FILTER), ("no_key", NO_KEY))}
    expected = [1 + sum(w == k for w in whole.values()) for k in range(3)]
    assert [p.count_on(w) for w in range(3)] == expected and sum(expected) == 5
    p.remove("filter")
    expected[whole["filter"]] -= 1
    assert [p.count_on(w) for w in range(3)] == expected
    p.remove("rising")
    assert [p.count_on(w) for w in range(3)] == [int(w == whole["no_key"]) for w in range(3)]


def test_a_subscription_with_a_constant_route_is_sent_only_its_values_events():
    schemas = _schemas()
    p = Placement(2, schema=schemas.get)
    w = _place(p, "ibm", IBM, [STOCK])
    other = _place(p, "filter", FILTER, [STOCK])
    assert w != other and p.consts == {"ibm": ({"Stock": "Name"}, "IBM")}
    assert p.route("Stock") == ((other,), (), ((0, {"IBM": (w,)}),))
    assert p.readers("Stock") == (0, 1)
    off = Placement(2, schema=schemas.get, rows="off")
    _place(off, "ibm", IBM, [STOCK])
    assert off.consts == {} and off.route("Stock") == ((0,), (), ())


def _symbol_query(symbol: str) -> str:
    return IBM.replace("IBM", symbol)


def test_subscriptions_of_one_value_run_together_while_the_workers_stay_balanced():
    """Per-symbol queries registered symbol after symbol, round after round, 100 symbols
    over 3 workers (placed by load alone, in turn, each symbol's would be on each worker):
    each symbol's run on one worker, whose events go there alone, and the workers' loads
    stay within the slack; a removal and a new one of the value go back to its worker.
    Many of one value are spread once its worker runs ahead of the others by more than the
    slack (evenly: the next goes to the least loaded that has some), and its events then go
    to each worker."""
    schemas = _schemas()
    p = Placement(3, schema=schemas.get)
    symbols = [f"S{i}" for i in range(100)]
    for r in range(5):
        for sym in symbols:
            _place(p, f"{sym}-{r}", _symbol_query(sym), [STOCK])
    by_symbol = {sym: {p.worker_of[f"{sym}-{r}"] for r in range(5)} for sym in symbols}
    assert all(len(ws) == 1 for ws in by_symbol.values())
    assert Counter(w for (w,) in by_symbol.values()) == {0: 34, 1: 33, 2: 33}
    assert max(p.cost) - min(p.cost) <= sum(p.cost) / 3 * AFFINITY_SLACK
    assert route_event(["S3", 1.0, 1], *p.route("Stock"), 3) == sorted(by_symbol["S3"])
    p.remove("S3-0")
    assert _place(p, "S3-again", _symbol_query("S3"), [STOCK]) == next(iter(by_symbol["S3"]))

    one = Placement(4, schema=schemas.get)
    ws = [_place(one, f"ibm{i}", IBM, [STOCK]) for i in range(64)]
    assert set(Counter(ws).values()) == {16}  # spread evenly, not all on the first worker
    assert route_event(["IBM", 1.0, 1], *one.route("Stock"), 4) == [0, 1, 2, 3]


def test_key_groups_are_the_same_in_every_process():
    code = "from air.partitioning import key_group; print([key_group(v, 4) for v in ('IBM', 'MSFT', 7, 2.5)])"
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert outs == {str([key_group(v, 4) for v in ("IBM", "MSFT", 7, 2.5)]) + "\n"}


@pytest.mark.parametrize("groups", [2, 3])
def test_copies_restricted_to_their_groups_make_one_engines_witnesses(groups):
    """Every copy is fed every event (as a worker that runs other subscriptions
    on the stream is): each makes only its group's witnesses, and together they
    make one engine's, each once."""
    events = random_walk(20, 1500, seed=3)
    autos = compile_cel(RISING, [STOCK]).automata

    def witnesses(automata, functions=None) -> Counter:
        eng = Engine(functions=functions)
        eng.declare(STOCK)
        eng.add(automata, "q")
        return Counter((em.stream, tuple(em.event.values), em.event.t0, em.event.t1) for em in eng.run(events)
                       if em.kind == "OUT")

    whole = witnesses(autos)
    assert sum(whole.values()) > 50
    fns = FunctionRegistry.default()
    fns.register(KEY_GROUP_FUNCTION, key_group, "int", arity=2)
    parts = [witnesses(restrict_to_group(autos, {"Stock": "Name"}, groups, g), fns) for g in range(groups)]
    assert sum(parts, Counter()) == whole
    for g, part in enumerate(parts):
        assert part and all(key_group(values[0], groups) == g for (_s, values, _t0, _t1) in part)


def _dealt_one_by_one(batch: list, p: Placement) -> tuple[dict[int, list], dict[int, list[int]]]:
    """What rows.split should give: each event by placement.route_event, one after the other."""
    from server.workers.placement import route_event

    parts: dict[int, list] = {}
    places: dict[int, list[int]] = {}
    for i, ev in enumerate(batch):
        for w in route_event(ev.values, *p.route(ev.stream), p.workers):
            parts.setdefault(w, []).append(ev)
            places.setdefault(w, []).append(i)
    return parts, places if p.rows else None  # (places only where a row-scaled subscription's are merged)


def _split_both_ways(batch: list, p: Placement):
    """rows.split of ``batch`` told its one stream (the engine thread's batches of one stream,
    by C-level passes) and not told (event by event), which must agree."""
    from server.workers import rows

    got = rows.split(batch, p)
    if batch and len({ev.stream for ev in batch}) == 1:
        assert rows.split(batch, p, batch[0].stream) == got
    return got


def test_a_batch_is_dealt_to_the_workers_of_each_events_route_in_its_order():
    """rows.split (its short cuts per route) against a plain loop over the events by
    placement.route_event: mixed streams and one stream alone, over routes that go whole, by a
    key, by a constant, or by several of them."""
    import random

    from air.model import StreamSchema
    from server.workers import rows

    rng = random.Random(7)
    schemas = {"Stock": STOCK, "Quote": StreamSchema("Quote", STOCK.attributes)}
    p = Placement(3, schema=schemas.get)
    _place(p, "rising", RISING, [STOCK])  # keyed by Name: each Stock event to its key group's worker
    _place(p, "ibm", IBM, [STOCK])  # a constant: IBM's events to one more worker
    _place(p, "q_ibm", IBM.replace("Stock", "Quote").replace("IbmUp", "QIbm"), [schemas["Quote"]])
    _place(p, "q_msft", IBM.replace("Stock", "Quote").replace("IBM", "MSFT").replace("IbmUp", "QMsft"),
           [schemas["Quote"]])
    from air.engine import Event

    def events(streams):
        return [Event(rng.choice(streams), (rng.choice(["IBM", "MSFT", "ORCL", "SAP", "X"]), 1.0, 1), t, t)
                for t in range(rng.randint(1, 300))]

    for streams in (["Stock"], ["Quote"], ["Stock", "Quote"], ["Other"]):
        for _ in range(20):
            batch = events(streams)
            assert _split_both_ways(batch, p) == _dealt_one_by_one(batch, p)
    assert rows.split([], p) == ({}, {})


def test_per_value_queries_deal_a_batch_by_constants_alone_without_places():
    """The 10,000 queries' layout: subscriptions placed whole by their constant values, no
    row-scaled one, so no places are kept. A value of no route goes nowhere, one spread over
    several workers goes to each, and then a subscription that reads every event joins the
    route (the general path). Told the stream and not, against route_event."""
    import random

    from air.engine import Event
    from server.workers import rows

    rng = random.Random(5)
    p = Placement(3, schema={"Stock": STOCK}.get)
    symbols = [f"S{i}" for i in range(9)]
    for sym in symbols:
        _place(p, sym, _symbol_query(sym), [STOCK])
    for i in range(12):  # many of IBM's: spread over every worker once its own runs ahead
        _place(p, f"ibm{i}", IBM, [STOCK])
    assert not p.rows and route_event(["IBM", 1.0, 1], *p.route("Stock"), 3) == [0, 1, 2]
    names = symbols + ["IBM", "nobody", 7]

    def check():
        for _ in range(30):
            batch = [Event("Stock", (rng.choice(names), 1.0, 1), t, t) for t in range(rng.randint(1, 200))]
            parts, places = _split_both_ways(batch, p)
            assert (parts, places) == _dealt_one_by_one(batch, p) and places is None
        one = [Event("Stock", ("S0", 1.0, 1), t, t) for t in range(50)]  # every event to one worker
        assert rows.split(one, p, "Stock") == _dealt_one_by_one(one, p)

    check()
    assert rows.split([Event("Stock", ("S0", 1.0, 1), 1, 1)], p, "Stock")[0].keys() == {p.worker_of["S0"]}
    _place(p, "all", FILTER, [STOCK])  # every Stock event to its worker too: a route of both kinds
    check()
    assert rows.split([Event("Stock", ("nobody", 1.0, 1), 1, 1)], p, "Stock") == ({p.worker_of["all"]: [
        Event("Stock", ("nobody", 1.0, 1), 1, 1)]}, None)


def test_a_route_by_one_key_alone_remembers_string_keys_and_follows_placement_changes(monkeypatch):
    """The short cut of a route by one key (the README's Rising row-scaled alone): a string
    key's group is remembered (up to KEY_MEMO values, then forgotten and learnt again), any
    other value is hashed each time (``1``, ``1.0`` and ``True`` are one dict key but three
    groups); and a subscription placed later makes the routes again. Against route_event."""
    import random

    from air.engine import Event
    from server.workers import rows

    monkeypatch.setattr(rows, "KEY_MEMO", 4)
    rng = random.Random(11)
    p = Placement(3, schema={"Stock": STOCK}.get)
    _place(p, "rising", RISING, [STOCK])
    keys = ["IBM", "MSFT", "ORCL", "SAP", "X", "Y", 1, 1.0, True, 7]
    assert len({key_group(k, 3) for k in (1, 1.0, True)}) > 1  # (else the case below proves nothing)

    def check():
        for _ in range(30):
            batch = [Event("Stock", (rng.choice(keys), 1.0, 1), t, t) for t in range(rng.randint(1, 200))]
            assert _split_both_ways(batch, p) == _dealt_one_by_one(batch, p)

    check()
    assert p.routers()["Stock"].of_batch.__code__ is rows._by_key(0, 3).of_batch.__code__  # the short cut was the one taken
    _place(p, "ibm", IBM, [STOCK])  # now IBM's events also go to the worker IBM is placed on
    check()
