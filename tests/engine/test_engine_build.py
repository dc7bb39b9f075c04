"""What differs between the plain-Python and the compiled engine (results never
do: test_compiled_build.py runs the suites against both). This file runs in
both builds."""

from __future__ import annotations

import gc

from air.engine import BUILD, Engine, Event
from air.engine import instance, network
from air.engine.instance import VALUES
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
    insts = [i for _a, _s, node in eng.holding("rise").states for i in node.all_instances()]
    assert len(insts) == 4  # every quote waits for a 5% higher one of its symbol
    if BUILD == "compiled":
        assert not any(gc.is_tracked(i) or gc.is_tracked(i[VALUES]) for i in insts)
    else:  # (a value tuple may have been untracked by a collection: CPython does that to atomic tuples)
        assert all(gc.is_tracked(i) for i in insts)


def test_the_slot_constants_of_the_compiled_build_are_those_of_instance_py():
    """instance.pxd repeats instance.py's slot names as a C enum (the compiled
    modules index with those): the two must agree, name by name."""
    import re
    from pathlib import Path

    pxd = Path(instance.__file__).with_suffix(".pxd").read_text()
    declared = {m[1]: int(m[2]) for m in re.finditer(r"^\s+([A-Z_0-9]+) = (\d+)$", pxd, re.M)}
    assert declared == {name: getattr(instance, name) for name in instance.__all__}
