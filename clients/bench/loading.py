"""Loading many per-symbol CEL queries: offline, over REST in batches, and on a restart.

The query is the "ten consecutive increasing prices" of one symbol
(docs/design/workloads.md#increasing-prices), written in CEL with
``--length - 1`` NEXT levels; it compiles to exactly the automaton of
``cayuga bench increasing`` (clients/testing/market.py:increasing_query)::

    SELECT First, Price AS Last FROM (... (SELECT Price AS First, Price AS Last
      FROM FILTER{Name = 'SYM'}(Stock)) NEXT{$2.Name = 'SYM' AND $2.Price > $1.Last} Stock ...)
    PUBLISH Up_SYM

Commands (each prints one JSON object; per-query costs are the median over
the first and the last ``max(1, K // 100)`` queries, or the first and last
request):

    python -m clients.bench.loading write --queries 10000 --dir /tmp/q10k   # one .cel file per query
    cayuga run --query /tmp/q10k --events EVENTS --stream "Stock(Name string, Price float, Volume int)"
    python -m clients.bench.loading offline --queries 10000                  # load_engine, timed per query
    python -m clients.bench.loading engine-add --queries 10000               # Engine.add alone, CPU time
    python -m clients.bench.loading server --queries 10000 --batch 5000      # REST batches, then a restart
    python -m clients.bench.loading restart --data-dir DIR                    # a restart of a kept store
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time

from clients.bench.runner import metric, peak_rss_mb
from clients.testing.market import STOCK, increasing_cel, symbols, write_queries


def _ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 4)


def _ends(per_query: list[float]) -> dict:
    n = max(1, len(per_query) // 100)
    return {"first_ms": _ms(per_query[:n]), "last_ms": _ms(per_query[-n:])}


def offline(queries: int, length: int = 10) -> dict:
    """``load_engine`` over a directory of ``queries`` files, as ``cayuga run`` does."""
    from clients.offline import load_engine

    with tempfile.TemporaryDirectory() as tmp:
        write_queries(tmp, queries, length)
        perf = time.perf_counter
        stamps = [perf()]
        engine, loaded = load_engine([STOCK], [tmp], progress=lambda n: stamps.append(perf()))
        per_query = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"benchmark": "loading-offline", "queries": queries, "length": length,
            "load_s": round(stamps[-1] - stamps[0], 3), "per_query": _ends(per_query),
            "network": engine.plan_stats(), "peak_rss_mb": peak_rss_mb(), "python": platform.python_version()}


def engine_add(queries: int, length: int = 10) -> dict:
    """CPU time of ``Engine.add`` alone per automaton: the queries are compiled
    (through a shape cache) before the clock starts, the cyclic GC waits."""
    import gc

    from air.cel import ShapeCache
    from air.engine.network import COMPILED
    from air.engine import Engine

    engine = Engine()
    engine.declare(STOCK)
    shapes = ShapeCache()
    autos = [(s, shapes.compile(increasing_cel(s, length), engine.stream_view, name_prefix=s).automata)
             for s in symbols(queries)]
    collecting = gc.isenabled()
    gc.disable()
    try:
        start = time.process_time()
        for owner, a in autos:
            engine.add(a, owner=owner)
        cpu = time.process_time() - start
    finally:
        if collecting:
            gc.enable()
    return {"benchmark": "loading-engine-add", "queries": queries, "length": length,
            "add_cpu_ms_per_query": round(cpu / queries * 1000, 4), "engine_build": "compiled" if COMPILED else "python",
            "network": engine.plan_stats(), "python": platform.python_version()}


def _first_event(c, symbol: str, timeout: float) -> float:
    """Seconds until an event sent now has been processed by the engine. While
    the server restores, it asks /health (cheap), not /metrics (a gauge per
    subscription: scraping it often would slow the restore it measures)."""
    start = time.perf_counter()
    c.post_events([{"stream": "Stock", "Name": symbol, "Price": 1.0, "Volume": 1}])
    while c.health()["status"] == "starting" and time.perf_counter() - start < timeout:
        time.sleep(0.02)
    while metric(c, "cayuga_events_processed_total") < 1 and time.perf_counter() - start < timeout:
        time.sleep(0.01)
    return time.perf_counter() - start


def _settings(data_dir: str):
    from server.config import load_settings

    return load_settings(None, data_dir=data_dir, http_port=0, tcp_port=0, log_level="warning")


def restart(data_dir: str, timeout: float = 900.0) -> dict:
    """Start a server on ``data_dir`` and time until it answers HTTP, and until
    an event sent at once has been processed (after every stored subscription
    is back)."""
    from clients.client import CayugaClient
    from server.serve import RunningServer

    perf = time.perf_counter
    out: dict = {}
    t = perf()
    srv = RunningServer(_settings(data_dir)).start(timeout=timeout, wait_ready=False)
    try:
        with CayugaClient(srv.base_url, timeout=timeout) as c:
            out["restart_http_s"] = round(perf() - t, 3)
            out["restart_first_event_s"] = round(perf() - t + _first_event(c, symbols(1)[0], timeout), 3)
            out["restored"] = c.health()["subscriptions"]
    finally:
        srv.stop()
    return out


def server(queries: int, batch: int, length: int = 10, data_dir: str | None = None, timeout: float = 900.0) -> dict:
    """Register ``queries`` over REST, ``batch`` per request, on a real server
    (storing under ``data_dir``, a temporary directory by default); stop it and
    time a restart (:func:`restart`)."""
    from clients.client import CayugaClient
    from server.serve import RunningServer

    texts = [increasing_cel(s, length) for s in symbols(queries)]
    out: dict = {"benchmark": "loading-server", "queries": queries, "batch": batch, "length": length}
    perf = time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = data_dir or tmp
        srv = RunningServer(_settings(data_dir)).start(timeout=timeout)
        try:
            with CayugaClient(srv.base_url, timeout=timeout) as c:
                per_request = []
                for k in range(0, queries, batch):
                    t = perf()
                    c.subscribe_many(texts[k:k + batch])
                    per_request.append((perf() - t, len(texts[k:k + batch])))
                total = sum(s for s, _ in per_request)
                out["register_s"] = round(total, 3)
                out["subscriptions_per_s"] = round(queries / total, 1)
                out["per_query"] = {"first_ms": round(per_request[0][0] / per_request[0][1] * 1000, 4),
                                    "last_ms": round(per_request[-1][0] / per_request[-1][1] * 1000, 4)}
                out["shapes"] = srv.daemon.shapes.stats()
        finally:
            srv.stop()
        out.update(restart(data_dir, timeout))
    out["peak_rss_mb"] = peak_rss_mb()
    out["python"] = platform.python_version()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("write", "offline", "engine-add", "server", "restart"):
        p = sub.add_parser(name)
        if name == "restart":
            p.add_argument("--data-dir", required=True, help="A data directory a server stored subscriptions in.")
            continue
        p.add_argument("--queries", type=int, default=10000)
        p.add_argument("--length", type=int, default=10, help="Consecutive increasing prices.")
        if name == "write":
            p.add_argument("--dir", required=True)
        if name == "server":
            p.add_argument("--batch", type=int, default=5000, help="Subscriptions per request.")
            p.add_argument("--data-dir", default=None, help="Keep the store here (default: a temporary directory).")
    args = ap.parse_args()
    if args.command == "write":
        files = write_queries(args.dir, args.queries, args.length)
        print(json.dumps({"written": len(files), "dir": args.dir}))
    elif args.command == "offline":
        print(json.dumps(offline(args.queries, args.length)))
    elif args.command == "engine-add":
        print(json.dumps(engine_add(args.queries, args.length)))
    elif args.command == "restart":
        print(json.dumps({"benchmark": "loading-restart", **restart(args.data_dir), "peak_rss_mb": peak_rss_mb()}))
    else:
        print(json.dumps(server(args.queries, args.batch, args.length, args.data_dir)))


if __name__ == "__main__":
    main()
