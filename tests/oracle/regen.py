"""Write the golden witness files from the oracle, never from the engine:

    python -m tests.oracle.regen            # rewrite tests/golden/witnesses/<AIR>.jsonl
    python -m tests.oracle.regen --check    # exit 1 if any file would change

The input is ``tests/golden/witnesses/_stream.jsonl`` (a fixed Stock stream,
checked by tests/engine/test_conformance_run.py to be the stream that test
feeds the engine), or ``_rising.jsonl`` (a hand-made rising run) for the files
that need one (``STREAM_OF``). Every AIR file of ``tests/conformance/air`` that reads Stock
(directly or through its publishers) gets ``<stem>.jsonl``: the witnesses its
own automaton delivers (``OUT``), one JSON object a line, ``{"stream", "t0",
"t1", <attributes in schema order>}``, epoch by epoch. A file whose only
outputs are internal (``RESUB``, e.g. 94.xml) gets those instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.oracle.air import read_air
from tests.oracle.machine import Event, Oracle

TESTS = Path(__file__).resolve().parents[1]
AIR_DIR = TESTS / "conformance" / "air"
WITNESSES = TESTS / "golden" / "witnesses"
STREAM_FILE = WITNESSES / "_stream.jsonl"
#: AIR files that need a long rising run to match (cnt > 10), which the random
#: stream never has: they run on this hand-made stream instead.
RISING_FILE = WITNESSES / "_rising.jsonl"
STREAM_OF = {"94.xml": RISING_FILE, "LONG_MONOTONIC_INC.xml": RISING_FILE}
STOCK = (("Name", "string"), ("Price", "float"), ("Volume", "int"))
#: AIR files that read another file's output (the same as tests/conftest.py's
#: PUBLISHERS, which a test checks; repeated so the oracle imports no product code).
PUBLISHERS = {"LONG_MONOTONIC_INC.xml": ["94.xml"], "IBM_MSFT_PAIR.xml": ["IBMStock.xml"],
              "IBM_OTHER_PAIR.xml": ["IBMStock.xml"]}
#: AIR files that read no Stock stream: T15 reads DUAL, the built-in empty stream.
NOT_ON_STOCK = {"T15.xml"}


def golden_files() -> list[str]:
    return sorted(p.name for p in AIR_DIR.glob("*.xml") if p.name not in NOT_ON_STOCK)


def read_stream(path: Path = STREAM_FILE) -> list[Event]:
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        out.append(Event(row["stream"], tuple(row[a] for a, _ in STOCK), row["t0"], row["t1"]))
    return out


def oracle_witnesses(name: str, events: list[Event]) -> list[dict]:
    """What the AIR file ``name`` (after its publishers) delivers, as golden rows."""
    o = Oracle()
    o.declare("Stock", STOCK)
    for f in PUBLISHERS.get(name, []) + [name]:
        o.add(read_air((AIR_DIR / f).read_text(), name=Path(f).stem), owner=Path(f).stem)
    rows = []
    stem = Path(name).stem
    kinds = {k for owner, auto in o.automata if owner == stem for s in auto.states for _, k in s.outputs}
    kind = "OUT" if "OUT" in kinds else "RESUB"
    for w in o.run(events):
        if w.owner == stem and w.kind == kind:
            rows.append({"stream": w.stream, "t0": w.t0, "t1": w.t1,
                         **dict(zip((a for a, _ in o.streams[w.stream]), w.values))})
    if o.eval_errors:
        raise RuntimeError(f"{name}: {o.eval_errors} expression errors, last: {o.last_eval_error}")
    return rows


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    changed = []
    for name in golden_files():
        path = WITNESSES / (Path(name).stem + ".jsonl")
        text = render(oracle_witnesses(name, read_stream(STREAM_OF.get(name, STREAM_FILE))))
        if not path.exists() or path.read_text() != text:
            changed.append(path.name)
            if not check:
                path.write_text(text)
    verb = "would change" if check else "rewritten"
    print(f"{len(golden_files())} golden files from the oracle; {verb}: {', '.join(changed) or 'none'}")
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
