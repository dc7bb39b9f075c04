"""What differs between the plain-Python and the compiled engine (results never
do: test_compiled_build.py runs the suites against both). This file runs in
both builds."""

from __future__ import annotations

import gc

from air.engine import BUILD, Engine, Event
from air.engine import network
from clients.testing import STOCK, rise_query


def test_the_modules_know_which_build_they_are():
    assert network.COMPILED is (BUILD == "compiled")


def test_installed_instances_leave_the_cyclic_gc_only_in_the_compiled_build():
    eng = Engine()
    eng.declare(STOCK)
    eng.add(rise_query(), owner="rise")
    for t, (name, price) in enumerate([("A", 10.0), ("B", 20.0), ("A", 9.0), ("C", 5.0)], start=1):
        eng.feed(Event("Stock", (name, price, 100), t, t))
    eng.flush()
    insts = [i for _a, _s, node in eng._loaded["rise"].states for i in node.all_instances()]
    assert len(insts) == 4  # every quote waits for a 5% higher one of its symbol
    if BUILD == "compiled":
        assert not any(gc.is_tracked(i) or gc.is_tracked(i[0]) for i in insts)
    else:  # (a value tuple may have been untracked by a collection: CPython does that to atomic tuples)
        assert all(gc.is_tracked(i) for i in insts)
