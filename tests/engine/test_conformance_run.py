"""Every conformance AIR file loads and runs over a generated stream, and the
engine's witnesses equal the golden files, which the independent oracle
(tests/oracle) wrote — never the engine.

Regenerate the golden files from the oracle (after checking a change to the
oracle or the corpus is intended) with ``python -m tests.oracle.regen``;
``python -m tests.oracle.regen --check`` says whether they are current.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from air.engine import Engine, Event
from air.formats import witness_dict
from tests.conftest import AIR_DIR, GOLDEN, IBMSTOCK, PUBLISHERS, STOCK, air, stock_stream
from tests.oracle import regen

ALL = sorted(p.name for p in AIR_DIR.glob("*.xml"))
GOLDEN_FILES = regen.golden_files()
# Short enough that T9 (FOLD{} with every predicate TRUE: instances double with
# each simultaneous event) stays small, long enough to exercise every file.
STREAM = stock_stream(seed=2000, n=30, long_names=True, max_dur=150)


def events_for(name: str) -> list[Event]:
    path = regen.STREAM_OF.get(name)
    if path is None:
        return STREAM
    return [Event(e.stream, e.values, e.t0, e.t1) for e in regen.read_stream(path)]


def run_file(name: str, kind: str = "OUT") -> list[dict]:
    eng = Engine()
    eng.declare(STOCK)
    for dep in PUBLISHERS.get(name, []):
        eng.add(air(dep), owner=Path(dep).stem)
    eng.add(air(name), owner=Path(name).stem)
    ems = [e for e in eng.run(events_for(name)) if e.owner == Path(name).stem and e.kind == kind]
    assert eng.stats.eval_errors == 0, eng.stats.last_eval_error
    return [witness_dict(e.stream, e.event, eng.schema(e.stream)) for e in ems]


def by_epoch(rows: list[dict]) -> dict[str, list[tuple]]:
    """Per output stream: its epochs in order, each a multiset of witnesses.
    docs/design/semantics.md#witnesses-and-resubscription fixes that witnesses come epoch by epoch
    (detection time); within an epoch the witnesses of a stream are a multiset."""
    out: dict[str, list[tuple]] = {}
    for r in rows:
        epochs = out.setdefault(r["stream"], [])
        if not epochs or epochs[-1][0] != r["t1"]:
            assert not epochs or epochs[-1][0] < r["t1"], f"witness out of epoch order: {r}"
            epochs.append((r["t1"], Counter()))
        epochs[-1][1][tuple(r.items())] += 1
    return out


@pytest.mark.parametrize("name", ALL)
def test_every_conformance_file_runs(name):
    eng = Engine()
    eng.declare(STOCK)
    if name == "T15.xml":  # reads DUAL, the built-in empty stream
        assert [e.event.values for e in (eng.add(air(name), owner="q") and eng.run([Event("DUAL", (), 1, 1)]))] \
            == [("", 0.0, 0)]
        return
    witnesses = run_file(name)
    out_schema = air(name).outputs[0][0].schema_names()
    assert all(list(w)[3:] == list(out_schema) for w in witnesses)
    assert all(w["t0"] <= w["t1"] for w in witnesses)


def test_every_file_on_a_stock_stream_has_a_golden_file():
    assert set(ALL) - set(GOLDEN_FILES) == regen.NOT_ON_STOCK == {"T15.xml"}
    assert regen.PUBLISHERS == PUBLISHERS  # the oracle's copy (it may not import tests.conftest)
    for name in GOLDEN_FILES:
        assert (GOLDEN / "witnesses" / (Path(name).stem + ".jsonl")).exists(), "run python -m tests.oracle.regen"


@pytest.mark.parametrize("name", GOLDEN_FILES)
def test_engine_gives_the_oracles_golden_witnesses(name):
    path = GOLDEN / "witnesses" / (Path(name).stem + ".jsonl")
    want = [json.loads(line) for line in path.read_text().splitlines()]
    got = run_file(name, kind="OUT" if any(o.type == "OUT" for _, o in air(name).outputs) else "RESUB")
    assert by_epoch(got) == by_epoch(want)


def test_golden_files_are_what_the_oracle_writes_now():
    """The files are the oracle's output (not edited by hand, not stale)."""
    for name in GOLDEN_FILES:
        path = GOLDEN / "witnesses" / (Path(name).stem + ".jsonl")
        rows = regen.oracle_witnesses(name, regen.read_stream(regen.STREAM_OF.get(name, regen.STREAM_FILE)))
        assert path.read_text() == regen.render(rows), f"{path.name}: run python -m tests.oracle.regen"


def test_the_golden_corpus_is_not_vacuous():
    counts = {n: len((GOLDEN / "witnesses" / (Path(n).stem + ".jsonl")).read_text().splitlines())
              for n in GOLDEN_FILES}
    assert sum(1 for c in counts.values() if c) == len(GOLDEN_FILES), \
        f"golden files without a witness: {[n for n, c in counts.items() if not c]}"


def test_golden_stream_is_the_stream_the_engine_runs():
    rows = [witness_dict("Stock", e, STOCK) for e in STREAM]
    assert [json.loads(line) for line in regen.STREAM_FILE.read_text().splitlines()] == rows
    assert IBMSTOCK.names == ("IBMPrice",)
