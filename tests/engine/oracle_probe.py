"""Run in a child process by tests/oracle/test_differential.py: the engine
build this process runs (``CAYUGA_ENGINE=python`` selects the pure-Python one)
on cases read as JSON from standard input, under every engine switch
combination (index, merge, ...: tests/engine/test_indexes_support.CONFIGS);
prints the build and, per case and switch combination, the witnesses (or the
load or run error) as JSON.

    python -m tests.engine.oracle_probe < cases.json

A case: ``{"automata": [AIR text, ...], "streams": {name: [[attr, type], ...]},
"base": [names of the streams to declare], "events": [[stream, [values], t0, t1], ...],
"schedule": [[add at t1 or null, remove at t1 or null], ...], "close": bool,
"restart_at": event index or null}``;
automaton ``i`` is loaded as owner ``a<i>``, in order (publishers first), before
the events or, per the schedule, just before the first event of epoch ``t1``
(after closing the epoch before explicitly when ``close``); before event
``restart_at`` (even inside an epoch) the engine's state is exported, pickled
and imported into a fresh engine, as a snapshot and a restart do.
"""

from __future__ import annotations

import json
import pickle
import sys

from air.airxml import load_air_many
from air.engine import BUILD, Engine, Event
from air.model import parse_stream_decl
from tests.engine.test_indexes_support import CONFIGS


def fresh(case: dict, opts: dict | None) -> Engine:
    eng = Engine(**(opts or {}))
    for name in case["base"]:
        attrs = case["streams"][name]
        eng.declare(parse_stream_decl(f"{name}({', '.join(f'{a} {t}' for a, t in attrs)})"))
    return eng


def restart(eng: Engine, case: dict, opts: dict | None, autos: list, order: list[int]) -> Engine:
    """What a snapshot and a restart do: the state exported, pickled, and
    imported into an engine built afresh with the same owners in their order."""
    state = pickle.loads(pickle.dumps(eng.export_state()))
    new = fresh(case, opts)
    for i in order:
        new.add(autos[i], owner=f"a{i}")
    new.import_state(state)
    new.on_emit = eng.on_emit
    return new


def run_case(case: dict, opts: dict | None = None) -> dict:
    autos = []
    try:
        for text in case["automata"]:
            autos.append(load_air_many(text))
    except Exception as exc:  # a load error is a finding of its own: report it
        return {"error": f"load: {type(exc).__name__}: {exc}"}
    eng = fresh(case, opts)
    schedule = case.get("schedule") or [(None, None)] * len(autos)
    ems = []
    eng.on_emit = ems.append
    try:
        order = []  # owners in the order they were added
        for i, a in enumerate(autos):
            if schedule[i][0] is None:
                eng.add(a, owner=f"a{i}")
                order.append(i)
        for k, (s, v, t0, t1) in enumerate(case["events"]):
            for i, (add, remove) in enumerate(schedule):  # changes while events flow, before epoch t1
                if remove == t1 and eng.has_owner(f"a{i}"):
                    if case.get("close"):
                        eng.close_epoch()
                    eng.remove(f"a{i}")
                    order.remove(i)
                if add == t1 and not eng.has_owner(f"a{i}") and (remove is None or remove > t1):
                    if case.get("close"):
                        eng.close_epoch()
                    eng.add(autos[i], owner=f"a{i}")
                    order.append(i)
            if k == case.get("restart_at"):
                eng = restart(eng, case, opts, autos, order)
            eng.feed(Event(s, tuple(v), t0, t1))
        eng.flush()
    except Exception as exc:
        return {"error": f"run: {type(exc).__name__}: {exc}"}
    return {"witnesses": [[em.owner, em.stream, em.kind, list(em.event.values), em.event.t0, em.event.t1]
                          for em in ems],
            "eval_errors": eng.stats.eval_errors, "last_eval_error": eng.stats.last_eval_error}


def main() -> None:
    cases = json.load(sys.stdin)
    json.dump({"build": BUILD, "results": [{name: run_case(c, opts) for name, opts in CONFIGS.items()}
                                           for c in cases]}, sys.stdout)


if __name__ == "__main__":
    main()
