"""Figures for ``cayuga spark stream`` (SPARK.md, *Streaming: measured*).

    python -m clients.spark.stream_bench --events 1000000 --master 'local[2]' --workdir /tmp/stream-bench

Workload: the increasing-prices query of ``cayuga spark bench`` (a FOLD keyed by
``Name``) over a Parquet file of ``--events`` Stock events on ``--symbols``
symbols (:func:`clients.spark.bench.generate`). In one driver process:

1. **throughput**: ``spark stream --available-now --flush-at-end`` over the
   file, on a fresh checkpoint, after a warm-up run on another checkpoint (JVM
   start and warm-up excluded); next to it ``spark run`` (same session,
   warmed up) and the single engine (``cayuga run``'s engine, this process);
2. **state**: the live instances the single engine holds at the end of the
   input and the size of its exported state (what the groups' state values
   hold, summed over the groups), so: bytes per live instance; beside it the
   stateful operator's metrics (rows, RocksDB SST bytes, which also hold
   versions not compacted yet);
3. **latency**: a continuous query (``--trigger`` as fast as possible) fed one
   file of ``--rate`` events every second for ``--seconds`` seconds; the
   micro-batch durations (``triggerExecution`` of each batch with input), p50/p99.

Results are printed and written to ``WORKDIR/stream-results.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path


def _percentile(xs, q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[k]


def _progress(query) -> list[dict]:
    return [json.loads(p.json) for p in query.recentProgress]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--symbols", type=int, default=1000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--workdir", default="/tmp/cayuga-stream-bench")
    ap.add_argument("--rate", type=int, default=5000, help="events per second in the latency run")
    ap.add_argument("--seconds", type=int, default=40, help="length of the latency run")
    ap.add_argument("--key-groups", type=int, default=32)
    args = ap.parse_args(argv)

    import pyarrow.parquet as pq

    from air.model import parse_stream_decl
    from clients.spark.bench import RISE10, STOCK_DECL, generate, single_engine
    from clients.spark.io import ColumnMapping
    from clients.spark.run import run_distributed
    from clients.spark.session import get_session
    from clients.spark.stream import file_source, start_stream

    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    (work / "in").mkdir(parents=True)
    (work / "warm").mkdir()
    query = work / "rise10.cel"
    query.write_text(RISE10)
    stock = parse_stream_decl(STOCK_DECL)
    data = work / "events.parquet"
    generate(data, args.events, args.symbols, 0.0, 7)
    table = pq.read_table(str(data))
    pq.write_table(table.slice(0, min(100_000, args.events)), str(work / "warm" / "part-0.parquet"))
    shutil.copy(data, work / "in" / "part-0.parquet")
    res: dict = {"events": args.events, "symbols": args.symbols, "master": args.master}

    single = single_engine(data, query)
    res["cayuga_run"] = single
    print("single engine:", single, flush=True)

    par = int(args.master[6:-1]) if args.master.startswith("local[") and args.master[6:-1].isdigit() else 2
    spark = get_session(args.master, "cayuga-stream-bench", shuffle_partitions=2 * par)
    mapping = ColumnMapping()

    def run_stream(inp: Path, name: str) -> dict:
        df, lines = file_source(spark, str(inp), "parquet")
        t = time.perf_counter()
        job = start_stream(df, [stock], [str(query)], output=str(work / f"out-{name}"),
                           checkpoint=str(work / f"ck-{name}"), lines_format=lines, mapping=mapping,
                           lateness=1.0, available_now=True, flush_at_end=True, key_groups=args.key_groups,
                           say=lambda m: None)
        job.query.awaitTermination()
        secs = time.perf_counter() - t
        ops = [p["stateOperators"] for p in _progress(job.query) if p.get("stateOperators")]
        return {"seconds": secs, "progress_state": ops[-1] if ops else None}

    run_stream(work / "warm", "warm")
    s = run_stream(work / "in", "main")
    witnesses = spark.read.text(str(work / "out-main")).where("kind = 'witness'").count()
    res["spark_stream"] = {"seconds": s["seconds"], "events_per_s": args.events / s["seconds"],
                           "witnesses": witnesses, "state": s["progress_state"]}
    print("spark stream:", {k: v for k, v in res["spark_stream"].items() if k != "state"}, flush=True)

    run_distributed(spark, [stock], [str(query)], str(work / "warm" / "part-0.parquet"), "parquet").release()
    t = time.perf_counter()
    r = run_distributed(spark, [stock], [str(query)], str(data), "parquet")
    res["spark_run"] = {"seconds": time.perf_counter() - t, "witnesses": r.witnesses}
    res["spark_run"]["events_per_s"] = args.events / res["spark_run"]["seconds"]
    r.release()
    print("spark run:", res["spark_run"], flush=True)

    # state per live instance: the engine's live instances at the end of the input
    from air.engine import Engine, Event
    from clients.offline import load_query

    eng = Engine()
    eng.declare(stock)
    eng.add(load_query(query, eng.stream_view, eng.functions), owner="rise10")
    cols = [table.column(c).to_pylist() for c in ("t0", "t1", "Name", "Price", "Volume")]
    for t0, t1, n, p, v in zip(*cols):
        eng.feed(Event("Stock", (n, p, v), t0, t1))
    eng.flush()
    live = eng.instance_count()
    import pickle

    state_bytes = len(pickle.dumps(eng.export_state(), protocol=pickle.HIGHEST_PROTOCOL))
    del cols
    st = (s["progress_state"] or [{}])[0]
    sst = (st.get("customMetrics") or {}).get("rocksdbSstFileSize")
    res["state"] = {"live_instances": live, "engine_state_bytes": state_bytes,
                    "engine_state_bytes_per_1M_instances": state_bytes / live * 1e6 if live else None,
                    "state_rows": st.get("numRowsTotal"), "sst_bytes": sst,
                    "memory_used_bytes": st.get("memoryUsedBytes"),
                    "sst_bytes_per_1M_instances": (sst / live * 1e6) if sst and live else None}
    print("state:", res["state"], flush=True)

    # latency at a steady rate
    lat_in = work / "lat-in"
    lat_in.mkdir()
    pq.write_table(table.slice(0, 1), str(lat_in / "seed.parquet"))  # the source learns the columns from it
    df, lines = file_source(spark, str(lat_in), "parquet")
    job = start_stream(df, [stock], [str(query)], output=str(work / "out-lat"), checkpoint=str(work / "ck-lat"),
                       lines_format=lines, mapping=mapping, lateness=1.0, key_groups=args.key_groups,
                       say=lambda m: None)
    offset = 1
    started = time.monotonic()
    for i in range(args.seconds):
        chunk = table.slice(offset, args.rate)
        offset += args.rate
        tmp = work / f"lat-{i:05d}.parquet"
        pq.write_table(chunk, str(tmp))
        tmp.rename(lat_in / tmp.name)
        time.sleep(max(0.0, started + i + 1 - time.monotonic()))
    job.query.stop()
    durs = [p["durationMs"]["triggerExecution"] for p in _progress(job.query) if p.get("numInputRows")]
    durs = durs[2:]  # the first batches warm the new query up
    res["latency"] = {"rate_events_per_s": args.rate, "batches": len(durs),
                      "p50_ms": _percentile(durs, 50), "p99_ms": _percentile(durs, 99),
                      "mean_ms": statistics.fmean(durs) if durs else None}
    print("latency:", res["latency"], flush=True)
    spark.stop()
    (work / "stream-results.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
