"""The README's SASE section says what the commands print: the SASE query and
its CEL counterpart find the same two rises on the paper's six events, and
``examples/rises.sase`` (shown in the README, run as shown) finds the one it shows."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.conftest import ROOT


def section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("## SASE: every match, and what did not happen", 1)[1].split("\n## ", 1)[0]


def run(tmp_path, name: str, query: str) -> list[dict]:
    q = tmp_path / name
    q.write_text(query)
    r = subprocess.run([sys.executable, "-m", "clients.cli", "run", "--query", str(q), "--events",
                        "examples/example9.jsonl"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()]


def test_the_side_by_side_queries_find_the_same_rises(tmp_path):
    block = re.search(r"```text\n(EVENT SEQ\(Stock a, Stock b\).*?)```", section(), re.S).group(1)
    sase = "\n".join(line[:53].rstrip() for line in block.splitlines())
    cel = "\n".join(line[53:] for line in block.splitlines())
    rises = {(w["Before"], w["After"]) for w in run(tmp_path, "a.sase", sase)}
    assert rises == {(w["Before"], w["After"]) for w in run(tmp_path, "b.cel", cel)} == {(85.0, 91.0), (81.0, 91.0)}


def test_rises_sase_prints_what_the_readme_shows(tmp_path):
    shown = re.search(r"cayuga run --query examples/rises.sase .*\n# (\{.*\})", section()).group(1)
    query = (ROOT / "examples" / "rises.sase").read_text()
    assert "\n".join(query.splitlines()[2:]) in section()  # the README shows the file's query
    assert run(tmp_path, "rises.sase", query) == [json.loads(shown)]
