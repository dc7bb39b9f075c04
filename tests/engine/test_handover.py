"""One owner's state moved from an engine that ran it alone into a running engine
(air/engine/handover.py, a backfill's hand-over): it goes on exactly as if it had
run there all along, and the owners already there see none of it."""

from __future__ import annotations

import random

import pytest

from air.cel import compile_cel
from air.engine import Engine, EngineError, Event
from air.engine.handover import import_owner, unmerged
from clients.testing.market import RISING, STOCK

OTHER = ("SELECT Name, Price_1 AS Before, Price AS After FROM Stock "
         "NEXT{$1.Name = $2.Name AND $2.Price >= 1.05 * $1.Price} Stock PUBLISH Other")


def autos(text: str, prefix: str):
    return compile_cel(text, {"Stock": STOCK}, time_unit_ms=1, name_prefix=prefix).automata


def quotes(n: int, seed: int) -> list[Event]:
    rnd, t, out = random.Random(seed), 0, []
    for _ in range(n):
        t += rnd.choice((0, 0, 1))  # many quotes share a time: the cut falls inside an epoch
        out.append(Event("Stock", (rnd.choice("ABC"), round(rnd.uniform(80, 100), 1), 1), t, t))
    return out


def run(owners: dict[str, tuple], events: list[Event], eng: Engine | None = None) -> tuple[Engine, list]:
    out: list = []
    if eng is None:
        eng = Engine(on_emit=out.append)
        eng.declare(STOCK)
        for owner, a in owners.items():
            eng.add(a, owner)
    else:
        eng.on_emit = out.append
    for ev in events:
        eng.feed(ev)
    return eng, out


def rows(ems, owner: str) -> list:
    return [(e.stream, e.event.values, e.event.t0, e.event.t1) for e in ems if e.owner == owner and e.kind == "OUT"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_owner_goes_on_as_if_it_had_run_in_the_live_engine_and_the_others_see_none_of_it(seed):
    events = quotes(600, seed)
    # inside an epoch: pending instances and affected marks cross over
    cut = next(i for i in range(400 + seed * 7, 600) if events[i].t1 == events[i - 1].t1)
    start = next(i for i in range(100, 200) if events[i].t1 > events[i - 1].t1)  # history from a time on
    history = [e for e in events[:cut] if e.t1 >= events[start].t1]
    # the reference: the subscription in the live engine from `start` on, beside the identical older query
    ref, ref_out = run({"old": autos(OTHER, "old")}, events[:start])
    ref.add(autos(RISING, "new"), "new")
    ref, more = run({}, events[start:], ref)
    want_new, want_old = rows(more, "new"), rows(ref_out + more, "old")
    # the backfill: alone on its own engine, then moved into the live engine at the cut
    solo, solo_out = run({"new": autos(RISING, "new")}, history)
    live, live_out = run({"old": autos(OTHER, "old")}, events[:cut])
    with unmerged(live):
        live.add(autos(RISING, "new"), "new")
    state = solo.export_state()
    assert any(node["pending"] for node in state["nodes"])  # the epoch in progress has made some
    got = import_owner(live, state, "new")
    assert got["instances"] > 0
    live, after = run({}, events[cut:], live)
    assert rows(solo_out, "new") + rows(after, "new") == want_new
    assert rows(live_out + after, "old") == want_old


def test_an_engine_behind_the_state_s_epoch_moves_on_to_it():
    """An engine worker fed only its own streams may stand at an earlier epoch than the cut."""
    events = quotes(300, 5)
    solo, _ = run({"new": autos(RISING, "new")}, events)
    live = Engine()
    live.declare(STOCK)
    live.feed(Event("Stock", ("Z", 1.0, 1), 0, 0))
    with unmerged(live):
        live.add(autos(RISING, "new"), "new")
    import_owner(live, solo.export_state(), "new")
    assert live.epoch == solo.epoch
    ahead = Engine()
    ahead.declare(STOCK)
    ahead.feed(Event("Stock", ("Z", 1.0, 1), events[-1].t1 + 5, events[-1].t1 + 5))
    with unmerged(ahead):
        ahead.add(autos(RISING, "new"), "new")
    with pytest.raises(EngineError, match="took events the state did not"):
        import_owner(ahead, solo.export_state(), "new")
