"""``cayuga bench offline``: the figures of ``cayuga run`` against their floors.

One run writes random-walk ticks (the file of ``cayuga bench server``) into a
temporary directory, then measures, on that same file:

- **decode**: microseconds a line for our JSON-lines decoder, as ``cayuga run``
  drives it (:func:`clients.offline.decode_file`: blocks of whole lines into
  engine events), next to msgspec's own ``decode_lines`` of the same blocks
  into the same typed records and nothing more (the floor: what decoding
  costs before any of our work). Both are timed in this process, alternately,
  best of ``rounds``; ``decode_over_floor`` is their ratio.
- **whole process**: ``cayuga run`` with the rise query
  (``clients/bench/queries/rising.cel``) as a child process, as a user runs it,
  ``runs`` times: wall and CPU seconds each, the median next to the target.

The events our decoder made must equal msgspec's records field by field, and
every ``cayuga run`` must write the same witnesses (their count and a digest
of the output): ``outputs_agree``.

    cayuga bench offline --events 1000000
"""

from __future__ import annotations

import gc
import hashlib
import io
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from clients.bench.server_e2e import QUERIES
from clients.testing import cayuga_command, cayuga_env, write_ticks

#: The issue's target for ``cayuga run`` of the rise query over 1M ticks, whole process.
TARGET_S = 2.0
#: ... and for decoding, microseconds a line.
TARGET_DECODE_US = 0.6


def _blocks(data: bytes) -> list[bytes]:
    """``data`` cut as ``cayuga run`` reads it (:data:`clients.offline.BLOCK`
    bytes, then to the last newline)."""
    from clients.offline import _blocks as blocks

    return list(blocks(io.BytesIO(data)))


def decode_figures(data: bytes, rounds: int = 3) -> dict:
    """Our decoder against msgspec's bare ``decode_lines`` on the blocks of ``data``."""
    from air.formats import _block_decoder, _record_type
    from clients.offline import RunResult, decode_file
    from clients.testing import STOCK

    catalog = {"Stock": STOCK}
    blocks = _blocks(data)
    floor_decoder = _block_decoder((_record_type(STOCK),))
    lines = data.count(b"\n") + (not data.endswith(b"\n"))

    def ours() -> list:
        result = RunResult()
        events = decode_file(io.BytesIO(data), "jsonl", catalog.get, result, names=["Stock"])
        if result.rejected:
            raise RuntimeError(f"the bench file has a rejected line: {result.rejected[0]}")
        return events

    def floor() -> list:
        records = []
        for block in blocks:
            records.extend(floor_decoder.decode_lines(block))
        return records

    best = {"ours": float("inf"), "floor": float("inf")}
    for _ in range(rounds):
        for name, fn in (("ours", ours), ("floor", floor)):
            gc.collect()
            was = gc.isenabled()
            gc.disable()  # as cayuga run decodes; and the floor is not charged for collections either
            start = time.perf_counter()
            out = fn()
            best[name] = min(best[name], time.perf_counter() - start)
            if was:
                gc.enable()
            if name == "ours":
                events = out
            else:
                records = out
            del out
    agree = len(events) == len(records) and all(
        (e.values, e.t0, e.t1) == ((r.f0, r.f1, r.f2), r.ta, r.tb) for e, r in zip(events, records))
    us = best["ours"] / lines * 1e6
    floor_us = best["floor"] / lines * 1e6
    return {"lines": lines, "decode_us_per_line": round(us, 3), "msgspec_decode_lines_us_per_line": round(floor_us, 3),
            "decode_over_floor": round(us / floor_us, 2), "decode_target_us_per_line": TARGET_DECODE_US,
            "decode_events_equal_msgspec_records": agree}


def run_figures(events_path: Path, out_dir: Path, runs: int = 3) -> dict:
    """``cayuga run`` of the rise query over ``events_path``, ``runs`` times, as child processes."""
    walls, cpus, digests, counts = [], [], set(), set()
    for i in range(runs):
        out = out_dir / f"witnesses-{i}.jsonl"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cayuga_command("run", "--query", str(QUERIES / "rising.cel"), "--events",
                                             str(events_path), "--output", str(out)),
                              env=cayuga_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=3600)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise RuntimeError(f"cayuga run failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
        body = out.read_bytes()
        digests.add(hashlib.sha256(body).hexdigest())
        counts.add(body.count(b"\n"))
        out.unlink()
    wall = statistics.median(walls)
    return {"run_wall_s": round(wall, 3), "run_wall_s_runs": [round(w, 3) for w in walls],
            "run_cpu_s": round(statistics.median(cpus), 3), "run_cpu_s_runs": [round(c, 3) for c in cpus],
            "run_target_s": TARGET_S, "run_over_target": round(wall / TARGET_S, 2),
            "witnesses": counts.pop() if len(counts) == 1 else sorted(counts), "runs_agree": len(digests) == 1}


def offline(events: int = 1_000_000, symbols: int = 1000, seed: int = 1, runs: int = 3, rounds: int = 3,
            file: str | None = None) -> dict:
    """Every figure of this module in one dict (see the module docstring)."""
    from air.engine import BUILD

    with tempfile.TemporaryDirectory(prefix="cayuga-bench-offline-") as tmp:
        tmp_path = Path(tmp)
        path = Path(file) if file else tmp_path / "ticks.jsonl"
        if not file:
            write_ticks(path, events, symbols, seed)
        data = path.read_bytes()
        out = {"benchmark": "offline_run", "query": "rising", "events": data.count(b"\n"), "file_mb":
               round(len(data) / 1e6, 1), "engine_build": BUILD, "load_average": list(os.getloadavg())}
        out.update(decode_figures(data, rounds))
        del data
        out.update(run_figures(path, tmp_path, runs))
    out["outputs_agree"] = out["decode_events_equal_msgspec_records"] and out["runs_agree"]
    out["load_average_after"] = list(os.getloadavg())
    return out
