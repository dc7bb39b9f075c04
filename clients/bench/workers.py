"""Engine workers through the whole server (issue 32): ``cayuga bench workers``.

For each worker count asked (``--workers 0,1,2``): a fresh ``cayuga serve``
with ``CAYUGA_ENGINE_WORKERS`` set, ``--queries`` per-symbol queries of the
``increasing`` workload (10 rising quotes of one symbol; each symbol's events
go to one worker, so the work splits by symbol) registered in batches, then
``--events`` ticks sent with ``cayuga send``; the clock runs from the first
line sent until ``/health`` says every event went through the engine
(``events_per_second``), and again from the first time ``/health`` (polled
every 10 ms until then, after as seldom as the end's time allows: ``_poll_pause``)
saw an event taken (``taking_events_per_second``: the server's rate without the
sender's start).
Prints one JSON object: events/s per worker count, and each count's rates over
the first one's.

``--query rising``: instead, ``--queries`` subscriptions of the README's Rising
kind (the first is the README's, the others ask 0.1% more each: no two share
their automata) over a random walk without drift of ``--symbols`` names
(``write_ticks``: a quote waits for its 5% rise a while):
each is keyed by ``Name`` and keeps instances, so with ``row_scaling`` on
(``--row-scaling``, auto by default) each is split over every worker rather
than placed whole on one: this measures row scaling, which a single heavy
subscription needs to use a second worker at all.

``--watchers N``: N WebSocket clients watch one subscription each (spread over
them) while the events go through; ``watched`` says how many witnesses they got
(waited for, up to 30 s after the clock stops, until they have ``watched_made``,
every one their subscriptions made).
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from clients.bench.runner import metric, metric_by, worker_cpu_parts
from clients.bench.server_e2e import server_process
from clients.testing import cayuga_command, cayuga_env, wait_until
from clients.testing.market import RISING, increasing_cel, increasing_stream, symbols, write_ticks


def rising_cel(i: int) -> str:
    """The README's Rising (``i`` = 0), or one that asks ``i`` tenths of a percent more."""
    if i == 0:
        return RISING
    return RISING.replace("1.05 * $1.Price", f"{1.05 + i / 1000:.3f} * $1.Price").replace("PUBLISH Rising",
                                                                                           f"PUBLISH Rising{i}")


def _write_events(path: Path, events: int, n_symbols: int, seed: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for e in increasing_stream(n_symbols, events, seed):
            name, price, volume = e.values
            f.write(f'{{"stream": "Stock", "t0": {e.t0}, "t1": {e.t1}, "Name": "{name}", '
                    f'"Price": {price!r}, "Volume": {volume}}}\n')


def run(workers: list[int], queries: int, events: int, n_symbols: int, length: int, seed: int,
        query: str = "increasing", row_scaling: str = "auto", watchers: int = 0) -> dict:
    names = symbols(n_symbols)
    if query == "rising":
        texts = [rising_cel(i) for i in range(queries)]
    else:
        texts = [increasing_cel(names[i % n_symbols], length) for i in range(queries)]
    out: dict = {"benchmark": "engine_workers", "query": query, "queries": queries, "events": events,
                 "symbols": n_symbols, "row_scaling": row_scaling, "watchers": watchers, "runs": []}
    if query != "rising":
        out["length"] = length
    with tempfile.TemporaryDirectory(prefix="cayuga-bench-workers-") as tmp:
        ticks = Path(tmp) / "ticks.jsonl"
        if query == "rising":
            write_ticks(ticks, events, n_symbols, seed, down=0.01, up=0.01)  # no drift: quotes wait longer
        else:
            _write_events(ticks, events, n_symbols, seed)
        for i, w in enumerate(workers):
            # a fresh data directory per run: a repeated count must not restore the last one's catalogue
            with server_process(Path(tmp) / f"data-{i}-{w}", engine_workers=w, time="event",
                                row_scaling=row_scaling) as client, ExitStack() as watching:
                start = time.perf_counter()
                for k in range(0, len(texts), 5000):
                    client.subscribe_many(texts[k:k + 5000])
                registered = time.perf_counter() - start
                watched, watched_sids = _watch(client, watchers, watching)
                parts_before = metric_by(client, "cayuga_engine_worker_batch_cpu_seconds_total", "part")
                threads_before = metric_by(client, "cayuga_thread_cpu_seconds_total", "thread")
                batches = metric(client, "cayuga_engine_latency_seconds_count")
                h0 = client.health()
                reader0 = _reader_cpu(h0)
                cpu, waits = _cpu(client, h0), _waits(h0)  # (last: the scrapes above not in the main process's figure)
                start = time.perf_counter()
                seconds, steady = _send_and_wait(client, ticks, events, start)
                h = client.health()
                after = _cpu(client, h)
                main_cpu, workers_cpu = after[0] - cpu[0], [b - a for a, b in zip(cpu[1], after[1])]
                reader_cpu = None if reader0 is None or _reader_cpu(h) is None else _reader_cpu(h) - reader0
                workers_wait = [b - a for a, b in zip(waits, _waits(h))]
                threads = {k: v - threads_before.get(k, 0.0)
                           for k, v in metric_by(client, "cayuga_thread_cpu_seconds_total", "thread").items()}
                parts = {k: v - parts_before.get(k, 0.0) for k, v in worker_cpu_parts(client).items()}
                batches = metric(client, "cayuga_engine_latency_seconds_count") - batches
                made = 0
                if watched_sids:  # (after the clock: what the watchers get of their subscriptions' witnesses)
                    made = sum(client.subscription(s)["last_seq"] for s in watched_sids)
                    deadline = time.monotonic() + 30
                    while sum(watched) < made and time.monotonic() < deadline:
                        time.sleep(0.02)
                subs = [client.subscription(x["id"]) for x in client.subscriptions()] if query == "rising" else []
                out["runs"].append({"engine_workers": w, "register_s": round(registered, 2),
                                    "seconds": round(seconds, 2), "events_per_second": round(events / seconds),
                                    # from the first event the server took, not the sender's start: the
                                    # server's own rate (a short run at many workers is otherwise much
                                    # the sender's process start-up and connection)
                                    "taking_s": round(steady[1], 2),
                                    "taking_events_per_second": round(steady[0] / steady[1]),
                                    "status": h["status"],
                                    "per_worker_subscriptions": [x["subscriptions"] for x in h["workers"]],
                                    # cores each process used while the events went through: the main
                                    # process near 1.0 is the ceiling that more workers cannot lift
                                    "main_cores": round(main_cpu / seconds, 2),
                                    # the events a batch the engine thread handed out, on average (what a
                                    # batch costs apart from its events is paid this much less often)
                                    "events_per_batch": round(events / batches, 1) if batches else None,
                                    # what the main process spent an event, and the events/s one core
                                    # of it carries at that cost: its ceiling, at any number of workers
                                    "main_cpu_us_per_event": round(main_cpu / events * 1e6, 2),
                                    "main_events_per_cpu_s": round(events / main_cpu) if main_cpu > 0 else None,
                                    # the main process's CPU by thread, µs an event (the one that carries
                                    # most is its ceiling; MainThread's includes this benchmark's /health polls)
                                    "main_threads_us_per_event": {k: round(v / events * 1e6, 2) for k, v in
                                                                  sorted(threads.items(), key=lambda kv: -kv[1])
                                                                  if v / events * 1e6 >= 0.01},
                                    # the TCP reader process's (receivers: 1; None: reader threads in
                                    # the main process, their CPU in main_cores)
                                    "reader_cores": None if reader_cpu is None else round(reader_cpu / seconds, 2),
                                    "reader_cpu_us_per_event": None if reader_cpu is None else round(
                                        reader_cpu / events * 1e6, 2),
                                    "worker_cores": [round(c / seconds, 2) for c in workers_cpu],
                                    # the share of the run each worker was ready to run and waited for a
                                    # core (Linux's schedstat): beside worker_cores, whether the workers
                                    # were short of cores or of work
                                    "worker_waiting": [round(c / seconds, 2) for c in workers_wait],
                                    # the workers' batches, all of them together, by part: µs an event
                                    # (decode, engine, witnesses; BENCHMARKS.md, round 19)
                                    "workers_us_per_event": {k: round(v / events * 1e6, 2) for k, v in parts.items()},
                                    **({"watched": sum(watched), "watched_made": made} if watchers else {}),
                                    **({"runs_on": subs[0]["runs_on"], "witnesses": sum(x["last_seq"] for x in subs)}
                                       if subs else {})})
    base, steady = out["runs"][0]["events_per_second"], out["runs"][0]["taking_events_per_second"]
    for r in out["runs"]:
        r["over_first"] = round(r["events_per_second"] / base, 2)
        r["taking_over_first"] = round(r["taking_events_per_second"] / steady, 2)
    return out


def _send_and_wait(client, ticks: Path, events: int, start: float) -> tuple[float, tuple[int, float]]:
    """``cayuga send`` of ``ticks``, polling ``/health`` meanwhile, until every event went through
    the engine. Returns the seconds since ``start`` and (events, seconds) from the first poll
    that saw an event taken: the rate once the sender is running."""
    first: tuple[int, float] | None = None
    with tempfile.TemporaryFile("w+") as err:  # (a file, not a pipe: a full pipe would stall the sender)
        send = subprocess.Popen(cayuga_command("send", str(ticks), "--url", client.base_url), env=cayuga_env(),
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            while True:
                taken, now = client.health()["events_taken"], time.perf_counter()
                if first is None and taken > 0:
                    first = (taken, now)
                if taken >= events:
                    break
                if send.poll() not in (None, 0):
                    break
                # often until the first event is seen, then as seldom as the end's time allows: half
                # the time the rate so far says is left, 5-100 ms. Each /health costs the server's main
                # thread 0.4 ms back to back and 1.0-1.8 ms at 25-100 ms apart, its caches cold
                # (BENCHMARKS.md, round 22): at 25 ms, 1.5 of the 6.1 µs an event the main process
                # spent on the 10,000 queries at one worker on 2 cores (4.7 without polling).
                time.sleep(0.01 if first is None else _poll_pause(first, taken, now, events))
            send.wait(timeout=3600)
        finally:
            if send.poll() is None:
                send.kill()
                send.wait()
        if send.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"cayuga send failed: {err.read()[-2000:]}")
    seconds = now - start
    if first is None or now <= first[1]:  # every event taken before the first poll: no steady part to time
        return seconds, (events, seconds)
    return seconds, (events - first[0], now - first[1])


def _poll_pause(first: tuple[int, float], taken: int, now: float, events: int) -> float:
    """Seconds to the next poll: half what is left at the rate since ``first`` (events, when), 5-100 ms."""
    rate = (taken - first[0]) / (now - first[1]) if now > first[1] and taken > first[0] else 0.0
    left = (events - taken) / rate if rate > 0 else 0.1
    return min(0.1, max(0.005, left / 2))


def _watch(client, n: int, stack: ExitStack) -> tuple[list[int], list[str]]:
    """``n`` clients, each watching one subscription (spread over them), each counting its
    witnesses in a thread of its own; they end with ``stack`` (their sockets closed).
    Returns the counts (as they grow) and the subscriptions."""
    if not n:
        return [], []
    subs = client.subscriptions()
    sids = [subs[i * len(subs) // n]["id"] for i in range(n)]
    got = [0] * n
    for i in range(n):
        frames = stack.enter_context(client.frames(sids[i], batch=1000))

        def count(i=i, frames=frames) -> None:
            try:
                for msg in frames:
                    got[i] += msg.count("\n") + 1
            except Exception:  # noqa: BLE001 - the socket closed under it at the end
                pass

        threading.Thread(target=count, daemon=True, name=f"bench-watch-{i}").start()
    wait_until(lambda: client.health()["clients"] >= n, timeout=60, what="the watchers registered")
    return got, sids


def _waits(health: dict) -> list[float]:
    """Seconds each engine worker has waited for a core so far, from ``health`` (0 where not known)."""
    return [w.get("cpu_wait_seconds") or 0.0 for w in health["workers"]]


def _reader_cpu(health: dict) -> float | None:
    """CPU seconds so far of the TCP reader process (None without one: receivers 0)."""
    reader = health.get("tcp_reader")
    return None if reader is None else reader.get("cpu_seconds")


def _cpu(client, health: dict) -> tuple[float, list[float]]:
    """CPU seconds so far of the server's process and, from ``health`` (its /health), of each engine worker."""
    return metric(client, "process_cpu_seconds_total"), [w["cpu_seconds"] or 0.0 for w in health["workers"]]
