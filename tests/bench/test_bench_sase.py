"""``cayuga bench sase`` prints one JSON summary with the agreed keys, and its
matches are the oracle's (tests/oracle/sase.py) on the same events: the figures
in BENCHMARKS.md count real matches. Numbers are measured there, never asserted here."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clients.bench.sase import events
from clients.cli import main
from tests.oracle.sase import Sase

KEYS = {"events_per_second", "events", "subscriptions", "matches", "matches_per_second", "selectivity",
        "peak_rss_mb", "wall_s", "query"}


@pytest.mark.parametrize("extra", [[], ["--negations", "1"], ["--negations", "2", "--length", "3"],
                                   ["--negations", "1", "--negated-end"], ["--simple", "--param"]])
def test_bench_sase_prints_one_summary_whose_matches_the_oracle_gives(extra):
    args = ["--events", "600", "--window", "40", "--domain", "3", "--types", "6", "--length", "3", *extra]
    result = CliRunner().invoke(main, ["bench", "sase", *args])
    assert result.exit_code == 0, result.output
    (line,) = result.output.strip().splitlines()
    summary = json.loads(line)
    assert KEYS <= set(summary) and summary["eval_errors"] == 0 and summary["events"] == 600
    streams = {f"E{i}": tuple((a, "int") for a in ("a1", "a2", "a3", "a4", "a5")) for i in range(6)}
    evs = [(e.stream, e.values, e.t0, e.t1) for e in events(600, 6, 3, 1)]
    want = Sase(summary["query"], streams).run(evs)
    assert summary["matches"] == len(want) > 0


def test_bench_sase_refuses_more_negations_than_gaps():
    result = CliRunner().invoke(main, ["bench", "sase", "--events", "10", "--length", "2", "--negations", "2"])
    assert result.exit_code == 2 and "2 negations need 2 gaps" in result.output
