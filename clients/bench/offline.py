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

- **phases**: the calls ``cayuga run`` makes (:func:`clients.offline.run_offline`),
  made one by one in this process and each timed (CPU seconds): reading the
  file in blocks, decoding them, sorting, the engine's feed (with the event
  and emission it makes per witness), witness records, their encoding and
  writing; ``phases_total_cpu_s`` is their sum, to hold against
  ``run_cpu_s`` (the rest is imports, loading the query and exit).

The events our decoder made must equal msgspec's records field by field, and
every ``cayuga run`` must write the same witnesses (their count and a digest
of the output), which the phases' witnesses must equal: ``outputs_agree``.

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
#: ... of this many ticks (a smaller run's ``run_over_target`` means little).
TARGET_EVENTS = 1_000_000
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
            start = time.process_time()  # CPU time: a busy machine's waits are not decoding
            out = fn()
            best[name] = min(best[name], time.process_time() - start)
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


def phase_figures(path: Path, out_path: Path) -> dict:
    """CPU seconds of each step of ``cayuga run`` of the rise query over ``path``,
    made as :func:`clients.offline.run_offline` makes them."""
    from air.engine.memory import paused_gc
    from air.formats import encode_witnesses, make_decoder
    from air.engine.convert import emissions_to_records, sort_by_t1
    from air.formats import _witness_type, witness_dict
    from clients.offline import WITNESS_BLOCK, _blocks as blocks, fewer_collections, load_engine
    from clients.testing import STOCK

    clock = time.process_time
    spent = dict.fromkeys(("read", "decode", "sort", "feed", "witness_records", "encode", "write"), 0.0)
    start = clock()
    engine, _ = load_engine([STOCK], [QUERIES / "rising.cel"])
    load = clock() - start
    decoder = make_decoder("jsonl", engine.schema, streams=["Stock"])
    events: list = []
    with paused_gc(True), open(path, "rb") as fh:
        it = blocks(fh)
        while True:
            t = clock()
            data = next(it, None)
            spent["read"] += clock() - t
            if data is None:
                break
            t = clock()
            batch = decoder.decode_batch(data)
            events.extend(batch.events)
            spent["decode"] += clock() - t
    t = clock()
    sort_by_t1(events)
    spent["sort"] += clock() - t
    pending: list = []
    engine.on_emit = pending.append
    makers: dict = {}

    def maker(stream):
        schema = engine.schema(stream)
        return _witness_type(schema), lambda s, ev: witness_dict(s, ev, schema), schema

    digest = hashlib.sha256()
    witnesses = 0
    with open(out_path, "wb") as out:
        def flush() -> None:
            nonlocal witnesses
            t0 = clock()
            records = emissions_to_records(pending, makers, maker, False)
            t1 = clock()
            data = encode_witnesses(records)
            t2 = clock()
            out.write(data)
            t3 = clock()
            spent["witness_records"] += t1 - t0
            spent["encode"] += t2 - t1
            spent["write"] += t3 - t2
            digest.update(data)
            witnesses += len(records)
            pending.clear()

        feed = engine.feed
        with fewer_collections():
            t = clock()
            for ev in events:
                feed(ev)
                if len(pending) >= WITNESS_BLOCK:
                    spent["feed"] += clock() - t
                    flush()
                    t = clock()
            engine.flush()
            spent["feed"] += clock() - t
            flush()
    out_path.unlink()
    return {"phases_cpu_s": {k: round(v, 3) for k, v in spent.items()}, "phases_load_query_cpu_s": round(load, 3),
            "phases_witnesses": witnesses, "phases_digest": digest.hexdigest()}


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
        sha = hashlib.sha256(body).hexdigest()
        counts.add(body.count(b"\n"))
        out.unlink()
    wall = statistics.median(walls)
    return {"run_wall_s": round(wall, 3), "run_wall_s_runs": [round(w, 3) for w in walls],
            "run_cpu_s": round(statistics.median(cpus), 3), "run_cpu_s_runs": [round(c, 3) for c in cpus],
            "run_target_s": TARGET_S, "run_target_events": TARGET_EVENTS, "run_over_target": round(wall / TARGET_S, 2),
            "witnesses": counts.pop() if len(counts) == 1 else sorted(counts), "runs_agree": len(digests) == 1,
            "run_digest": sha}


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
        out.update(phase_figures(path, tmp_path / "phases.jsonl"))
    out["phases_total_cpu_s"] = round(sum(out["phases_cpu_s"].values()), 3)
    out["outputs_agree"] = (out["decode_events_equal_msgspec_records"] and out["runs_agree"]
                            and out.pop("phases_digest") == out.pop("run_digest")
                            and out["phases_witnesses"] == out["witnesses"])
    out["load_average_after"] = list(os.getloadavg())
    return out
