"""``cayuga spark stream`` as a real process: kill -9 of the driver (its whole
process group: Python, the JVM, the Python workers) at a point of a
micro-batch, then the same command again; the output read through Spark (the
file sink's ``_spark_metadata`` log) holds every witness of ``cayuga run``
exactly once. Then a restart with another ``--master local[N]``.

CI runs one kill point. The longer profile kills at every point below:

    CAYUGA_STREAM_KILL=all python -m pytest -q tests/spark/test_stream_recovery.py
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from air.formats import encode_json, witness_dict
from clients.offline import run_offline
from clients.spark.stream import read_output
from tests.conftest import CEL_DIR, STOCK
from tests.spark.conftest import multiset

CAYUGA = str(Path(sys.executable).parent / "cayuga")
STOCK_DECL = "Stock(Name string, Price float, Volume int)"
#: Where to kill: a predicate over (checkpoint query dir, output dir) that holds at that point.
POINTS = {
    # batch 0 planned (its offsets written), not committed: mid micro-batch
    "mid-batch": lambda q, out: (q / "offsets" / "0").exists() and not (q / "commits" / "0").exists(),
    # the file sink committed batch 0, the checkpoint not yet: mid commit
    "mid-commit": lambda q, out: (out / "_spark_metadata" / "0").exists() and not (q / "commits" / "0").exists(),
    # batch 0 committed, the next not planned yet
    "after-commit": lambda q, out: (q / "commits" / "0").exists() and not (q / "offsets" / "1").exists(),
}
LONG = os.environ.get("CAYUGA_STREAM_KILL") == "all"
#: Every wait here ends: a run of this size takes seconds, these are far above it.
RUN_TIMEOUT = 300


def _lines(events) -> str:
    return "".join(encode_json(witness_dict("Stock", e, STOCK)) + "\n" for e in events)


def _command(tmp: Path, master: str, *extra: str) -> list[str]:
    return [CAYUGA, "spark", "stream", "--master", master, "--query", str(CEL_DIR / "test5.cel"),
            "--stream", STOCK_DECL, "--input", str(tmp / "in"), "--output", str(tmp / "out"),
            "--checkpoint", str(tmp / "ck"), "--lateness", "1000", "--key-groups", "4",
            "--partitions", "2", "--available-now", *extra]


def _env() -> dict:
    env = dict(os.environ)
    # a small driver JVM that starts fast (tests, not throughput)
    env["PYSPARK_SUBMIT_ARGS"] = "--driver-java-options '-XX:+UseSerialGC -XX:TieredStopAtLevel=1' pyspark-shell"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    return env


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=60)


def _wait_group_gone(pgid: int) -> None:
    """Until no process of the group is left (the JVM and workers die with the driver's group)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes of group {pgid} outlived kill -9")


def _run(cmd: list[str], log: Path) -> int:
    p = _start(cmd, log)
    try:
        return p.wait(timeout=RUN_TIMEOUT)
    finally:
        if p.poll() is None:
            _kill_group(p)
        _wait_group_gone(p.pid)


def _run_and_kill(cmd: list[str], log: Path, tmp: Path, point: str) -> bool:
    """Start ``cmd``, kill -9 its process group as soon as ``point`` holds.
    Returns whether the point was hit (False: the run ended first)."""
    pred = POINTS[point]
    p = _start(cmd, log)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline and p.poll() is None:
            if pred(tmp / "ck" / "query", tmp / "out"):
                _kill_group(p)
                return True
            time.sleep(0.005)
        return False
    finally:
        if p.poll() is None:
            _kill_group(p)
        _wait_group_gone(p.pid)


def _offline(events) -> list[dict]:
    return run_offline([STOCK], [str(CEL_DIR / "test5.cel")], io.StringIO(_lines(events)), "jsonl").witnesses


@pytest.mark.parametrize("point", list(POINTS) if LONG else ["mid-batch"])
def test_kill_9_then_the_same_command_then_another_master(spark, events, tmp_path, point):
    inp = tmp_path / "in"
    inp.mkdir()
    parts = [events[:200], events[200:400], events[400:]]
    for i, part in enumerate(parts[:2] + ([parts[2]] if LONG else [])):
        (tmp_path / f"p{i}.jsonl").write_text(_lines(part))
        (tmp_path / f"p{i}.jsonl").rename(inp / f"p{i}.jsonl")
    log = tmp_path / "driver.log"
    cmd = _command(tmp_path, "local[2]")
    hit = _run_and_kill(cmd, log, tmp_path, point)
    assert hit, f"the run ended before reaching {point}; log:\n{log.read_text()[-3000:]}"
    assert _run(cmd, log) == 0, log.read_text()[-3000:]  # the same command again
    if not LONG:
        # a restart on another number of cores, with the last file: the key groups and the
        # operator's partitions are the checkpoint's, so each group's state is found
        (tmp_path / "p2.jsonl").write_text(_lines(parts[2]))
        (tmp_path / "p2.jsonl").rename(inp / "p2.jsonl")
    flush = _command(tmp_path, "local[1]", "--flush-at-end")
    assert _run(flush, log) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "cayuga spark: [test5] row scaling: hash-partitioned by Stock.Name into groups 0-3" in text
    assert "0 late and 0 rejected records so far" in text
    got = [json.loads(x) for x in read_output(spark, str(tmp_path / "out"))]
    expected = _offline(events)
    assert len(got) == len(expected)  # each witness once ...
    assert multiset(got) == multiset(expected)  # ... and all of them
