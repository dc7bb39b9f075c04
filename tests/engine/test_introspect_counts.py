"""Instance counts (air/engine/introspect.py): what :func:`instances` lists,
counted in C-level passes, per owner even where owners share nodes."""

from __future__ import annotations

import sys

from air.engine import Engine
from clients.testing import STOCK, random_walk, rise_query


def _engine() -> Engine:
    eng = Engine()
    eng.declare(STOCK)
    return eng


def test_counts_are_the_instances_listed_per_owner_on_shared_nodes():
    eng = _engine()
    eng.add(rise_query(), owner="early")
    ticks = random_walk(50, 3000, seed=7)
    for ev in ticks[:1500]:
        eng.feed(ev)
    eng.add(rise_query(), owner="late")  # merged with early's: the older instances are not late's
    for ev in ticks[1500:]:
        eng.feed(ev)
    counts = {o: eng.instance_count(o) for o in ("early", "late")}
    listed = {o: sum(map(len, eng.instances(o, pending=True).values())) for o in ("early", "late")}
    assert counts == listed and 0 < counts["late"] < counts["early"]
    assert eng.instance_count() == counts["early"]  # one network: late's instances are early's too


def test_counting_runs_no_python_frame_per_instance():
    eng = _engine()
    eng.add(rise_query(), owner="q")
    for ev in random_walk(200, 5000, seed=3):
        eng.feed(ev)
    frames = []
    sys.setprofile(lambda frame, event, arg: frames.append(frame.f_code.co_name) if event == "call" else None)
    try:
        n = eng.instance_count("q")
    finally:
        sys.setprofile(None)
    assert n > 200 and len(frames) < 20, (n, len(frames), frames[:10])
