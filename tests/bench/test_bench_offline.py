"""``cayuga bench offline`` prints its figures in one JSON object; the numbers
are measured in BENCHMARKS.md, never judged here: the test checks the fields
and that every output agreed."""

from __future__ import annotations

import json

from click.testing import CliRunner

from clients.cli import main


def test_bench_offline_prints_decode_and_run_figures_next_to_their_floors():
    result = CliRunner().invoke(main, ["bench", "offline", "--events", "3000", "--symbols", "20", "--runs", "2",
                                       "--rounds", "1"])
    assert result.exit_code == 0, result.output
    (line,) = result.output.strip().splitlines()
    out = json.loads(line)
    assert out["events"] == out["lines"] == 3000
    for key in ("decode_us_per_line", "msgspec_decode_lines_us_per_line", "decode_over_floor", "run_wall_s",
                "run_cpu_s"):
        assert out[key] > 0, key
    assert out["run_target_s"] == 2.0 and out["decode_target_us_per_line"] == 0.6
    assert len(out["run_wall_s_runs"]) == len(out["run_cpu_s_runs"]) == 2
    assert out["decode_events_equal_msgspec_records"] is True
    assert out["runs_agree"] is True and out["outputs_agree"] is True
    assert out["witnesses"] > 0
