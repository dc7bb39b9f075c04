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
    eng.add(rise_query(), owner="first")  # the nodes' oldest owner: q's share of them is counted
    ticks = random_walk(200, 5000, seed=3)
    for ev in ticks[:100]:
        eng.feed(ev)
    eng.add(rise_query(), owner="q")
    for ev in ticks[100:]:
        eng.feed(ev)
    frames = []
    sys.setprofile(lambda frame, event, arg: frames.append(frame.f_code.co_name) if event == "call" else None)
    try:
        n = eng.instance_count("q")
    finally:
        sys.setprofile(None)
    assert n > 200 and len(frames) < 20, (n, len(frames), frames[:10])


def _listed(eng: Engine, owner: str) -> int:
    return sum(map(len, eng.instances(owner, pending=True).values()))


def test_counts_stay_the_listed_instances_as_owners_come_and_go():
    """The oldest owner of a node owns all of it (counted without a pass); a newer one only
    what began after it came; removing the oldest hands the node to the next and drops
    what only the removed one saw."""
    eng = _engine()
    ticks = random_walk(40, 4000, seed=11)
    owners: list[str] = []
    for step, (lo, hi) in enumerate([(0, 800), (800, 1600), (1600, 2400), (2400, 3200), (3200, 4000)]):
        owners.append(f"q{step}")
        eng.add(rise_query(), owner=owners[-1])
        if step == 3:
            eng.remove(owners.pop(0))  # the oldest goes: q1 is now the nodes' oldest owner
        for i, ev in enumerate(ticks[lo:hi], lo):
            eng.feed(ev)
            if i % 97 == 0:  # now and then, mid-epoch as much as between epochs
                assert {o: eng.instance_count(o) for o in owners} == {o: _listed(eng, o) for o in owners}
    counts = {o: eng.instance_count(o) for o in owners}
    assert counts == {o: _listed(eng, o) for o in owners}
    assert counts[owners[0]] > counts[owners[-1]] > 0


def test_counts_after_a_restore_without_the_nodes_oldest_owner():
    """A snapshot taken while early and late shared nodes, restored where early is gone:
    the instances only early saw are not late's, and are not kept (they could never move)."""
    eng = _engine()
    ticks = random_walk(30, 3000, seed=5)
    eng.add(rise_query(), owner="early")
    for ev in ticks[:1500]:
        eng.feed(ev)
    eng.add(rise_query(), owner="late")
    for ev in ticks[1500:2000]:
        eng.feed(ev)
    state = eng.export_state()
    late_before = _listed(eng, "late")
    assert 0 < late_before < _listed(eng, "early")

    restored = _engine()
    restored.add(rise_query(), owner="late")  # early is gone: late is the nodes' only owner now
    loaded = restored.import_state(state)
    assert loaded["dropped"] > 0 and loaded["instances"] == late_before
    assert restored.instance_count("late") == _listed(restored, "late") == late_before
    assert restored.instance_count() == late_before  # nothing of early's left behind
    for ev in ticks[2000:]:
        restored.feed(ev)
        eng.feed(ev)
    assert restored.instance_count("late") == _listed(restored, "late") == _listed(eng, "late")
