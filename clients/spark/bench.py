"""Scale measurement of the distributed run (``cayuga spark bench``).

Workload (docs/design/workloads.md#increasing-prices): a Stock stream over ``symbols`` ticker symbols, each a
symmetric random walk; the query finds ten (or more)
consecutive increasing prices of one symbol — a FOLD whose filter
``$2.Name = $.Name`` makes ``Name`` the partition key. ``skew`` sends that
share of all events to one symbol, the partition-skew case.

For each Spark master (``local[1]``, ``local[2]``, ...) a separate process
(a master cannot change inside one JVM) runs :func:`run_distributed` on the
Parquet input and counts the witnesses; next to it the single engine runs in
this process over the same events. Times exclude JVM start-up and a warm-up run
on a 100K-event prefix (reported
apart); the Spark times include reading and decoding Parquet, the shuffle,
the sort and the engines. Results go to ``WORKDIR/results.json``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from air.model import parse_stream_decl

STOCK_DECL = "Stock(Name string, Price float, Volume int)"
RISE10 = """SELECT * FROM FILTER{cnt >= 10}(
  (SELECT *, 1 AS cnt FROM Stock)
  FOLD{$2.Name = $.Name, $2.Price > $.Price, $.cnt + 1 AS cnt} Stock)
PUBLISH Rise10
"""


def generate(path: Path, n_events: int, symbols: int, skew: float, seed: int) -> None:
    """Write the Stock workload as Parquet (columns stream, t0, t1, Name, Price, Volume)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    names = [f"S{i:05d}" for i in range(symbols)]
    price = [100.0] * symbols
    schema = pa.schema([("stream", pa.string()), ("t0", pa.int64()), ("t1", pa.int64()), ("Name", pa.string()),
                        ("Price", pa.float64()), ("Volume", pa.int64())])
    chunk = 250_000
    with pq.ParquetWriter(str(path), schema) as w:
        t = 0
        for start in range(0, n_events, chunk):
            m = min(chunk, n_events - start)
            ts, ns, ps, vs = [], [], [], []
            for _ in range(m):
                t += rng.choice((0, 1, 1, 2))
                i = 0 if (skew and rng.random() < skew) else rng.randrange(symbols)
                price[i] = round(max(1.0, price[i] + rng.choice((-1.0, -0.5, 0.5, 1.0))), 2)
                ts.append(t)
                ns.append(names[i])
                ps.append(price[i])
                vs.append(rng.choice((100, 500, 7000, 12000)))
            w.write_table(pa.table({"stream": ["Stock"] * m, "t0": ts, "t1": ts, "Name": ns, "Price": ps,
                                    "Volume": vs}, schema=schema), row_group_size=chunk)


def single_engine(input_path: Path, query: Path) -> dict:
    """The single engine in this process: read Parquet, build events, sort, run."""
    import pyarrow.parquet as pq

    from air.engine import Engine, Event
    from clients.offline import load_query

    stock = parse_stream_decl(STOCK_DECL)
    t_start = time.perf_counter()
    table = pq.read_table(str(input_path), columns=["t0", "t1", "Name", "Price", "Volume"])
    cols = [table.column(c).to_pylist() for c in ("t0", "t1", "Name", "Price", "Volume")]
    events = [Event("Stock", (n, p, v), t0, t1) for t0, t1, n, p, v in zip(*cols)]
    del cols, table
    events.sort(key=lambda e: e.t1)
    t_engine = time.perf_counter()
    eng = Engine()
    eng.declare(stock)
    eng.add(load_query(query, eng.streams, eng.functions), owner=query.stem)
    count = [0]
    eng.on_emit = lambda em: count.__setitem__(0, count[0] + (em.kind == "OUT"))
    for ev in events:
        eng.feed(ev)
    eng.flush()
    t_end = time.perf_counter()
    return {"config": "single engine", "events": len(events), "witnesses": count[0],
            "seconds": t_end - t_start, "engine_seconds": t_end - t_engine}


def spark_worker(master: str, input_path: str, query: str, partitions: int | None,
                 warmup_path: str | None = None) -> dict:
    """One distributed run (in its own process); returns its measurements.

    A first run over ``warmup_path`` (a small prefix of the input) warms the
    JVM's JIT up; its time is reported apart as ``warmup_seconds``."""
    from clients.spark.run import run_distributed
    from clients.spark.session import get_session

    t0 = time.perf_counter()
    spark = get_session(master, "cayuga-spark-bench", extra={"spark.driver.memory": "4g"})
    t_ready = time.perf_counter()
    try:
        warm = 0.0
        if warmup_path:
            w = run_distributed(spark, [parse_stream_decl(STOCK_DECL)], [query], warmup_path, "parquet",
                                partitions=partitions, say=lambda m: None)
            warm = w.seconds
            w.release()
        res = run_distributed(spark, [parse_stream_decl(STOCK_DECL)], [query], input_path, "parquet",
                              partitions=partitions, say=lambda m: print(m, file=sys.stderr))
        stage1 = [p for p in res.partitions if p.stage == 1]
        out = {"config": master, "events": res.events, "witnesses": res.witnesses, "seconds": res.seconds,
               "startup_seconds": t_ready - t0, "warmup_seconds": warm, "partitions": len(stage1), "skew": res.skew(),
               "partition_events": [p.events for p in stage1],
               "partition_engine_seconds": [round(p.seconds, 2) for p in stage1],
               "plan": res.plan.describe()}
        res.release()
        return out
    finally:
        spark.stop()


def run_bench(*, n_events: int, symbols: int, skew: float, masters: Sequence[str], query: str | None,
              workdir: str, seed: int = 1, partitions: int | None = None,
              echo: Callable[[str], None] = print) -> list[dict]:
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    qpath = Path(query) if query else wd / "rise10.cel"
    if not query:
        qpath.write_text(RISE10)
    inp = wd / f"stock_{n_events}_{symbols}_{skew}_{seed}.parquet"
    if not inp.exists():
        echo(f"generating {n_events:,} events over {symbols} symbols (skew {skew}) -> {inp}")
        generate(inp, n_events, symbols, skew, seed)
    warm = wd / f"warmup_{symbols}_{skew}_{seed}.parquet"
    if not warm.exists():
        generate(warm, min(100_000, n_events), symbols, skew, seed + 1)
    results = []
    r = single_engine(inp, qpath)
    results.append(r)
    echo(_line(r))
    for m in masters:
        cmd = [sys.executable, "-m", "clients.spark.bench", "--worker", m, str(inp), str(qpath),
               str(partitions or 0), str(warm)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        if proc.returncode != 0:
            raise RuntimeError(f"{m} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        echo(_line(r))
    ws = {r["witnesses"] for r in results}
    echo("witness counts agree" if len(ws) == 1 else f"WITNESS COUNTS DIFFER: {ws}")
    record = {"events": n_events, "symbols": symbols, "skew": skew, "seed": seed, "cpus": os.cpu_count(),
              "results": results}
    out = wd / "results.json"
    prev = json.loads(out.read_text()) if out.exists() else []
    prev.append(record)
    out.write_text(json.dumps(prev, indent=2))
    return results


def _line(r: dict) -> str:
    eps = r["events"] / r["seconds"] if r["seconds"] else 0
    extra = ""
    if "skew" in r:
        extra = (f", {r['partitions']} partitions, skew {r['skew']:.2f} (max/mean events), "
                 f"JVM start {r['startup_seconds']:.1f} s, warm-up run {r['warmup_seconds']:.1f} s")
    else:
        extra = f", engine alone {r['events'] / r['engine_seconds']:,.0f} events/s"
    return (f"{r['config']:>14}: {r['events']:,} events, {r['witnesses']:,} witnesses, {r['seconds']:.1f} s, "
            f"{eps:,.0f} events/s{extra}")


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "--worker":
        parts = int(sys.argv[5]) or None
        print(json.dumps(spark_worker(sys.argv[2], sys.argv[3], sys.argv[4], parts, sys.argv[6])))
    else:
        sys.exit("usage: python -m clients.spark.bench --worker MASTER INPUT QUERY PARTITIONS WARMUP "
                 "(use `cayuga spark bench`)")
