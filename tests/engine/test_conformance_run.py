"""Every conformance AIR file loads and runs over a generated stream; a
representative subset is compared with golden witness files.

Regenerate the golden files (after checking a change is intended) with
``CAYUGA_REGEN_GOLDEN=1 python -m pytest tests/engine/test_conformance_run.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from server.engine import Engine
from server.formats import witness_dict
from tests.conftest import AIR_DIR, GOLDEN, IBMSTOCK, PUBLISHERS, STOCK, air, stock_stream

ALL = sorted(p.name for p in AIR_DIR.glob("*.xml"))
# (the resubscription pair 94 -> LONG_MONOTONIC_INC is hand-checked in test_resubscription.py)
GOLDEN_SUBSET = ["T1.xml", "T4.xml", "T5.xml", "T11.xml", "T12.xml", "T14.xml", "T16.xml", "T22.xml",
                 "T25.xml", "T26.xml", "T29.xml", "T34.xml", "T7.xml", "IBM_PAIR.xml", "IBM_MSFT_PAIR.xml"]
# Short enough that T9 (FOLD{} with every predicate TRUE: instances double with
# each simultaneous event) stays small, long enough to exercise every file.
STREAM = stock_stream(seed=2000, n=30, long_names=True, max_dur=150)


def run_file(name: str) -> list[dict]:
    eng = Engine()
    eng.declare(STOCK)
    for dep in PUBLISHERS.get(name, []):
        eng.add(air(dep), owner=Path(dep).stem)
    eng.add(air(name), owner=Path(name).stem)
    ems = [e for e in eng.run(STREAM) if e.owner == Path(name).stem and e.kind == "OUT"]
    assert eng.stats.eval_errors == 0, eng.stats.last_eval_error
    return [witness_dict(e.stream, e.event, eng.schema(e.stream)) for e in ems]


@pytest.mark.parametrize("name", ALL)
def test_every_conformance_file_runs(name):
    eng = Engine()
    eng.declare(STOCK)
    if name == "T15.xml":  # reads DUAL, the built-in empty stream
        from server.engine import Event

        assert [e.event.values for e in (eng.add(air(name), owner="q") and eng.run([Event("DUAL", (), 1, 1)]))] \
            == [("", 0.0, 0)]
        return
    witnesses = run_file(name)
    out_schema = air(name).outputs[0][0].schema_names()
    assert all(list(w)[3:] == list(out_schema) for w in witnesses)
    assert all(w["t0"] <= w["t1"] for w in witnesses)


@pytest.mark.parametrize("name", GOLDEN_SUBSET)
def test_golden_witnesses(name):
    got = run_file(name)
    path = GOLDEN / "witnesses" / (Path(name).stem + ".jsonl")
    if os.environ.get("CAYUGA_REGEN_GOLDEN"):
        path.write_text("".join(json.dumps(w) + "\n" for w in got))
    want = [json.loads(line) for line in path.read_text().splitlines()]
    assert got == want


def test_golden_stream_is_what_the_goldens_were_made_from():
    path = GOLDEN / "witnesses" / "_stream.jsonl"
    rows = [witness_dict("Stock", e, STOCK) for e in STREAM]
    if os.environ.get("CAYUGA_REGEN_GOLDEN"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
    assert IBMSTOCK.names == ("IBMPrice",)
