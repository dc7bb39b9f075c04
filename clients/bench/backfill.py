"""``cayuga bench backfill`` (issue 36): a subscription registered ``from:
"retained"`` over ticks the server keeps, against ``cayuga run`` of the same
file, and what the backfill costs the live path.

1. Writes ``events`` random-walk ticks (clients/testing/market.py) and times
   ``cayuga run`` of the README's Rising query over them, whole process.
2. Starts a server (a child process, free loopback ports, a temporary data
   directory) whose retention keeps every tick (``retain_duration`` and
   ``retain_bytes`` far above them), sends it the file with ``cayuga send``
   and waits until the engine has taken every event; reads the journal's
   retained bytes (``/health``'s ``retained``) per event.
3. Registers Rising ``from: "retained"`` and times the registration until its
   ``backfill.state`` is ``"live"``: ``backfill_over_offline`` is ``cayuga
   run``'s time over the backfill's (the backfill's speed as a share of
   ``cayuga run``'s: target >= 0.8). Its witnesses, read back with ``cayuga
   watch --from-start``, must equal ``cayuga run``'s (without their
   ``"replay"`` mark).
4. The live path's latency (TCP in -> WebSocket out, ``cayuga bench
   latency``'s sender and receiver, clients/bench/server_e2e.py) at
   ``rate`` events/s for ``seconds``: once with no backfill, once while
   another Rising ``from: "retained"`` runs (``backfill_ran_throughout`` says
   whether it was still running when the probes ended): target p99 with
   <= 2x p99 without.

    cayuga bench backfill --events 1000000
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import subprocess
import tempfile
import time
from array import array
from pathlib import Path

from clients.bench.runner import metric
from clients.bench.server_e2e import QUERIES, _spread, probe_round, server_process
from clients.testing import cayuga_command, cayuga_env, write_ticks

#: Issue 36's targets: the backfill at >= 0.8x the speed of `cayuga run` over the same file ...
TARGET_SPEED = 0.8
#: ... and the live path's p99 while a backfill runs at most this many times its p99 without one.
TARGET_P99_RATIO = 2.0
#: Retention far above any run of this benchmark: every tick stays.
RETAIN = {"retain_duration": "100000d", "retain_bytes": "1TiB"}
#: The probes' subscription: every Stock event, live only.
PROBE_QUERY = "SELECT * FROM FILTER{Volume >= 0}(Stock) PUBLISH All"


def _strip_replay(lines) -> list[str]:
    out = []
    for x in lines:
        if x.strip():
            w = json.loads(x)
            w.pop("replay", None)
            out.append(json.dumps(w, sort_keys=True))
    return sorted(out)


def _wait(what: str, check, timeout: float, poll: float = 0.02) -> float:
    """Seconds until ``check()`` holds; RuntimeError after ``timeout``."""
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout:
            raise RuntimeError(f"{what} did not happen within {timeout:g} s")
        time.sleep(poll)
    return time.perf_counter() - start


def _latency(client, rate: float, seconds: float, sub_id: str) -> dict:
    """p50/p90/p99 of probes sent over TCP and read back on ``sub_id``'s WebSocket
    (server_e2e.latency's machinery, on this server)."""
    n = int(rate * seconds)
    ctx = multiprocessing.get_context("spawn")
    index, to_server, total, lag = probe_round(client, sub_id, rate, n, 1.0, ctx,
                                               clients_before=metric(client, "cayuga_clients"))
    index, to_server, total = array("q", index).tolist(), array("d", to_server).tolist(), array("d", total).tolist()
    slow = sorted(range(len(total)), key=total.__getitem__)[-max(len(total) // 100, 1):]  # the worst 1%
    return {"events": n, "received": len(set(index)), **_spread(total), "sender_late": _spread(lag),
            "to_server": _spread(to_server), "in_server_and_out": _spread([a - b for a, b in zip(total, to_server)]),
            # when the worst 1% were sent (seconds into the round): one stall, or spread over the round
            "worst_percent_sent_s": [round(index[i] / rate, 2) for i in (min(slow, key=index.__getitem__),
                                                                         max(slow, key=index.__getitem__))]
            if total else None}


def backfill(events: int = 1_000_000, symbols: int = 1000, seed: int = 1, rate: float = 10_000,
             seconds: float = 3.0) -> dict:
    perf = time.perf_counter
    query = QUERIES / "rising.cel"
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cayuga-bench-") as tmp:
        tmp = Path(tmp)
        ticks = tmp / "ticks.jsonl"
        write_ticks(ticks, events, symbols, seed)

        start = perf()
        offline = subprocess.run(cayuga_command("run", "--query", str(query), "--events", str(ticks),
                                                "--output", str(tmp / "offline.jsonl")),
                                 env=cayuga_env(), capture_output=True, text=True)
        offline_s = perf() - start
        if offline.returncode != 0:
            raise RuntimeError(offline.stderr[-2000:])
        expected = (tmp / "offline.jsonl").read_text(encoding="utf-8").splitlines()

        with server_process(tmp / "data", time_unit_ms=1.0, **RETAIN) as client:
            sent = subprocess.run(cayuga_command("send", str(ticks), "--url", client.base_url), env=cayuga_env(),
                                  capture_output=True, text=True)
            if sent.returncode != 0:
                raise RuntimeError(sent.stderr[-2000:])
            _wait("the engine to take every tick",
                  lambda: metric(client, "cayuga_events_processed_total") >= events, 600, 0.1)
            retained = client.health().get("retained") or {}

            # the backfill alone: registration until live
            start = perf()
            sub = client.subscribe(cel=query.read_text(), from_="retained")

            def live() -> bool:
                b = client.subscription(sub["id"])["backfill"]
                if b["state"] == "failed":
                    raise RuntimeError(f"the backfill failed: {b['error']}")
                return b["state"] == "live"

            _wait("the backfill to go live", live, 1800)
            backfill_s = perf() - start
            b = client.subscription(sub["id"])["backfill"]
            watched = subprocess.run(cayuga_command("watch", sub["id"], "--from-start", "--count",
                                                    str(len(expected)), "--url", client.base_url, "--retry-for", "30"),
                                     env=cayuga_env(), capture_output=True, text=True, timeout=600) \
                if expected else None
            got = watched.stdout.splitlines() if watched else []
            equal = _strip_replay(got) == _strip_replay(expected)
            replayed = sum(1 for x in got if json.loads(x).get("replay") is True)
            client.unsubscribe(sub["id"])

            # the live path: probes without a backfill, then while one runs
            probe = client.subscribe(cel=PROBE_QUERY)["id"]
            without = _latency(client, rate, seconds, probe)
            second = client.subscribe(cel=query.read_text(), from_="retained")["id"]
            during = _latency(client, rate, seconds, probe)
            state = client.subscription(second)["backfill"]["state"]
            health = client.health()

    speed = offline_s / backfill_s
    p99_ratio = (during["p99_ms"] / without["p99_ms"]) if without.get("p99_ms") else None
    return {
        "benchmark": "backfill",
        "events": events,
        "symbols": symbols,
        "load_average": [round(x, 2) for x in load],
        "cpus": os.cpu_count(),
        "offline_run_s": round(offline_s, 3),
        "backfill_s": round(backfill_s, 3),
        "backfill_events_per_second": round(events / backfill_s),
        "offline_events_per_second": round(events / offline_s),
        "backfill_over_offline": round(speed, 3),
        "backfill": b,
        "witnesses_offline": len(expected),
        "witnesses_replayed": replayed,
        "witnesses_equal_offline": equal,
        "retained": retained,
        "retained_bytes_per_event": round(retained["bytes"] / events, 1) if retained.get("bytes") else None,
        "latency_rate_events_per_s": rate,
        "latency_without_backfill": without,
        "latency_during_backfill": during,
        "backfill_ran_throughout": state in ("running", "handing_over"),
        "p99_during_over_without": round(p99_ratio, 2) if p99_ratio is not None else None,
        "target": f"backfill_over_offline >= {TARGET_SPEED} and p99_during_over_without <= {TARGET_P99_RATIO:g}",
        "meets_target": speed >= TARGET_SPEED and p99_ratio is not None and p99_ratio <= TARGET_P99_RATIO
        and equal,
        "engine_build": health.get("engine_build"),
        "python": platform.python_version(),
    }
