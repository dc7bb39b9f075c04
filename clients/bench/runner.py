"""Run a workload through the engine and measure it (engine only, events in memory)."""

from __future__ import annotations

import gc
import os
import resource
import sys
import time

from air.engine import BUILD as ENGINE_BUILD, Engine
from clients.bench.workloads import Workload


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kb / (1024 * 1024) if sys.platform == "darwin" else kb / 1024, 1)


def percentile(sorted_values: list[float], p: float) -> float:
    """The ``p``-th percentile of already sorted values (nearest rank)."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def sweep_summary(workload: str, events: int, runs: list[dict], **extra) -> dict:
    """One JSON summary for runs over growing K: the largest K's numbers, the
    total wall time, and ``flatness`` (smallest K's throughput over the largest's)."""
    first, last = runs[0], runs[-1]
    out = {"workload": workload, "events": events, "subscriptions": last["subscriptions"],
           "matches": last["matches"], "events_per_second": last["events_per_second"],
           "wall_s": round(sum(r["wall_s"] for r in runs), 3),
           "flatness": round(first["events_per_second"] / last["events_per_second"], 2),
           "engine_build": ENGINE_BUILD}
    out.update(extra)
    out["sweep"] = runs
    return out


def engine_options(no_index: bool = False, no_merge: bool = False, no_fr_index: bool = False,
                   no_instance_index: bool = False, no_sorted_index: bool = False) -> dict:
    opts: dict = {"merge": not no_merge, "index": not no_index}
    if no_sorted_index:
        opts["sorted_index"] = False
    if no_fr_index:
        opts["fr_index"] = False
    if no_instance_index:
        opts["instance_index"] = False
    return opts


def run_workload(w: Workload, options: dict, *, one_owner: bool = False, profile: str | None = None,
                 pause: float = 0.0) -> dict:
    """Load every automaton (one owner each, unless ``one_owner``), feed every
    event, flush; return the JSON summary. With ``profile`` a cProfile of the
    event loop is written to that path; with ``pause`` the process id goes to
    stderr and the loop starts that many seconds later (attach ``perf record
    -p PID -e cpu-clock`` then: a profile of the whole process is mostly
    loading)."""
    eng = Engine(**options)
    for s in w.streams:
        eng.declare(s)
    gc.collect()
    t_load = time.perf_counter()
    if one_owner:
        eng.add(w.automata, owner="q")
    else:
        for i, auto in enumerate(w.automata):
            eng.add(auto, owner=f"q{i}")
    load_s = time.perf_counter() - t_load
    plan = eng.plan_stats()
    feed = eng.feed
    gc.freeze()  # the loaded network is long-lived: keep the cyclic GC from rescanning it
    if pause > 0:
        print(f"loaded; the event loop starts in {pause:g} s: pid {os.getpid()}", file=sys.stderr, flush=True)
        time.sleep(pause)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    for ev in w.events:
        feed(ev)
    eng.flush()
    wall = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    gc.unfreeze()
    n = len(w.events)
    return {
        "workload": w.name,
        "events": n,
        "subscriptions": len(w.automata),
        "matches": eng.stats.witnesses,
        "events_per_second": round(n / wall, 1) if wall > 0 else None,
        "wall_s": round(wall, 3),
        "load_s": round(load_s, 3),
        "peak_rss_mb": peak_rss_mb(),
        "options": {k: getattr(eng.options, k)
                    for k in ("merge", "an_index", "instance_index", "fr_index", "sorted_index")},
        "network": plan,
        "instances_at_end": eng.instance_count(),
        "eval_errors": eng.stats.eval_errors,
        "python": sys.version.split()[0],
        "engine_build": ENGINE_BUILD,
    }


def metric_by(client, name: str, label: str) -> dict[str, float]:
    """A server's Prometheus figure ``name`` per value of its label ``label``, summed over the others."""
    out: dict[str, float] = {}
    key = f'{label}="'
    for line in client.http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and key in line:
            value = line.split(key, 1)[1].split('"', 1)[0]
            out[value] = out.get(value, 0.0) + float(line.split()[-1])
    return out


def worker_cpu_parts(client, settle: float = 3.0) -> dict[str, float]:
    """The engine workers' CPU seconds on batches by part (``cayuga_engine_worker_batch_cpu_seconds``),
    once the next instance count after the call has told them (the figure is a count's: about one a
    second), or after ``settle`` seconds; {} with no workers."""
    first = metric_by(client, "cayuga_engine_worker_batch_cpu_seconds_total", "part")
    deadline = time.monotonic() + settle
    while first and time.monotonic() < deadline:
        time.sleep(0.1)
        now = metric_by(client, "cayuga_engine_worker_batch_cpu_seconds_total", "part")
        if now != first:
            return now
    return first


def metric(client, name: str) -> float:
    """A server's Prometheus figure ``name`` from ``/metrics``, summed over its labels."""
    total = 0.0
    for line in client.http.get("/metrics").text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"):
            total += float(line.split()[-1])
    return total
