"""``cayuga bench ...``: each command prints one JSON object (see BENCHMARKS.md)."""

from __future__ import annotations

import json

import click

from clients.bench.runner import engine_options, run_workload, sweep_summary
from clients.bench import workloads as wl
from clients.testing.market import STOCK, random_walk, rise_query, runup_query


def _switches(f):
    f = click.option("--no-index", is_flag=True, help="Turn every index off.")(f)
    f = click.option("--no-merge", is_flag=True, help="Do not merge equivalent states.")(f)
    f = click.option("--no-fr-index", is_flag=True, help="Turn the FR index (forward/start edges) off.")(f)
    f = click.option("--no-instance-index", is_flag=True, help="Turn the AN and AI indexes off.")(f)
    f = click.option("--no-sorted-index", is_flag=True,
                     help="Turn the sorted index (inequality filter atoms within AI buckets) off.")(f)
    f = click.option("--seed", type=int, default=1, show_default=True, help="Random seed of the generator.")(f)
    f = click.option("--profile", type=click.Path(dir_okay=False), default=None,
                     help="Write a cProfile of the event loop to this file.")(f)
    f = click.option("--pause", type=float, default=0.0, show_default=True,
                     help="After loading, print the process id to stderr and wait this many seconds before "
                          "the timed loop (to attach a sampling profiler: perf record -p PID).")(f)
    return f


def _emit(result: dict, **extra) -> None:
    result.update(extra)
    click.echo(json.dumps(result))


#: Issue 22's engine-loop targets on a 2-core machine (compiled build): one query over 1M
#: ticks, and 10,000 per-symbol queries over 200K ticks of 10,000 symbols.
TARGET_ONE_QUERY = 1_200_000
TARGET_PER_SYMBOL = 100_000


def _target(result: dict, events_per_second: int) -> dict:
    """The row's target and whether this run met it (``target``, ``meets_target``)."""
    return {"target": f"events_per_second >= {events_per_second:,}",
            "meets_target": (result["events_per_second"] or 0) >= events_per_second}


@click.group()
def bench() -> None:
    """Engine benchmarks from the papers; each prints one JSON summary."""


@bench.command()
@click.option("--template", type=click.Choice(wl.TEMPLATES), default="LinearStat", show_default=True,
              help="The EDBT'22 workload template the subscriptions are drawn from.")
@click.option("--subscriptions", type=int, default=20000, show_default=True, help="Subscriptions to register.")
@click.option("--events", type=int, default=10000, show_default=True, help="Events to generate.")
@click.option("--zipf", type=float, nargs=3, default=(1.0, 1.0, 0.8), show_default=True,
              help="zipf1 zipf2 zipf3 of Table 3.")
@_switches
def edbt(template, subscriptions, events, zipf, no_index, no_merge, no_fr_index, no_instance_index, no_sorted_index,
         seed, profile, pause):
    """The EDBT 2006 technical benchmark (its Table 3) for one template
    (docs/design/workloads.md#technical-benchmark)."""
    w = wl.edbt(template, subscriptions, events, seed=seed, zipf=tuple(zipf))
    opts = engine_options(no_index, no_merge, no_fr_index, no_instance_index, no_sorted_index)
    _emit(run_workload(w, opts, profile=profile, pause=pause), template=template)


@bench.command()
@click.option("--queries", type=int, default=1000, show_default=True, help="One static query per symbol.")
@click.option("--events", type=int, default=200000, show_default=True, help="Events to generate.")
@click.option("--symbols", "n_symbols", type=int, default=None,
              help="Symbols in the stream (default: as many as queries).")
@click.option("--length", type=int, default=10, show_default=True, help="Consecutive increasing prices.")
@_switches
def increasing(queries, events, n_symbols, length, no_index, no_merge, no_fr_index, no_instance_index,
               no_sorted_index, seed,
               profile, pause):
    """K static "ten consecutive increasing prices" queries
    (docs/design/workloads.md#increasing-prices)."""
    w = wl.increasing(queries, events, length=length, seed=seed, stream_symbols=n_symbols)
    opts = engine_options(no_index, no_merge, no_fr_index, no_instance_index, no_sorted_index)
    r = run_workload(w, opts, profile=profile, pause=pause)
    _emit(r, queries=queries, symbols=n_symbols or queries, **_target(r, TARGET_PER_SYMBOL))


@bench.command()
@click.option("--events", type=int, default=1000000, show_default=True, help="Events to generate.")
@click.option("--symbols", "n_symbols", type=int, default=1000, show_default=True, help="Distinct stock names.")
@_switches
def rise(events, n_symbols, no_index, no_merge, no_fr_index, no_instance_index, no_sorted_index, seed, profile, pause):
    """One query: the next quote of the same symbol at least 5% higher."""
    w = wl.Workload("rise", (STOCK,), [rise_query()], random_walk(n_symbols, events, seed))
    opts = engine_options(no_index, no_merge, no_fr_index, no_instance_index, no_sorted_index)
    r = run_workload(w, opts, profile=profile, pause=pause)
    _emit(r, symbols=n_symbols, **_target(r, TARGET_ONE_QUERY))


@bench.command()
@click.option("--events", type=int, default=1000000, show_default=True, help="Events to generate.")
@click.option("--symbols", "n_symbols", type=int, default=1000, show_default=True, help="Distinct stock names.")
@click.option("--min-length", type=int, default=5, show_default=True,
              help="Fewest consecutive rising prices a match needs.")
@_switches
def runup(events, n_symbols, min_length, no_index, no_merge, no_fr_index, no_instance_index, no_sorted_index, seed,
          profile, pause):
    """One query: a Kleene run-up (FOLD) of at least --min-length rising quotes."""
    w = wl.Workload("runup", (STOCK,), [runup_query(min_length)], random_walk(n_symbols, events, seed))
    opts = engine_options(no_index, no_merge, no_fr_index, no_instance_index, no_sorted_index)
    _emit(run_workload(w, opts, profile=profile, pause=pause), symbols=n_symbols)


@bench.command("sase")
@click.option("--events", type=int, default=200_000, show_default=True, help="Events to generate.")
@click.option("--length", type=click.IntRange(1, 10), default=3, show_default=True,
              help="Positive components of the sequence (the paper: 2-6).")
@click.option("--window", type=click.IntRange(1), default=1000, show_default=True,
              help="WITHIN, in events (one event per time unit; the paper: 10K-100K).")
@click.option("--negations", type=click.IntRange(0, 5), default=0, show_default=True,
              help="Negated components, one per gap from the second (the paper: 0-2).")
@click.option("--negated-end", is_flag=True, help="Put the last negation after the sequence (under WITHIN).")
@click.option("--domain", type=click.IntRange(1), default=100, show_default=True,
              help="Values of a1, the equivalence attribute [a1] (the paper's V1: 10-10,000).")
@click.option("--types", type=click.IntRange(2), default=20, show_default=True,
              help="Event types, one stream each (the paper: 20).")
@click.option("--simple", is_flag=True, help="Add a simple predicate, x1.a2 < 500 (the paper's SP).")
@click.option("--param", is_flag=True, help="Add a parameterized predicate, x1.a3 < xL.a3 (the paper's IP).")
@_switches
def sase(events, length, window, negations, negated_end, domain, types, simple, param, no_index, no_merge,
         no_fr_index, no_instance_index, no_sorted_index, seed, profile, pause):
    """The SASE paper's workload shape through the SASE front end: SEQ of
    --length types WHERE [a1] WITHIN --window, with --negations; events/s,
    matches per second and per event (its selectivity) (clients/bench/sase.py)."""
    from clients.bench.sase import run as run_sase

    opts = engine_options(no_index, no_merge, no_fr_index, no_instance_index, no_sorted_index)
    try:
        result = run_sase(events, length, window, negations, negated_end, domain, types, simple, param, seed, opts)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    _emit(result)


@bench.command("increasing-sweep")
@click.option("--ks", default="10,100,1000,10000", show_default=True, help="Comma-separated numbers of queries.")
@click.option("--events", type=int, default=200000, show_default=True, help="Events to generate.")
@click.option("--length", type=int, default=10, show_default=True, help="Consecutive increasing prices.")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed of the generator.")
def increasing_sweep(ks, events, length, seed):
    """The K-sweep of `increasing` (docs/design/workloads.md#increasing-prices): one run
    for each K (one static query per symbol); ``events_per_second`` is the largest K's, ``flatness`` the
    smallest K's throughput over the largest K's (target: at most 2)."""
    runs = []
    for k in (int(x) for x in ks.split(",")):
        w = wl.increasing(k, events, length=length, seed=seed)
        r = run_workload(w, engine_options())
        runs.append({key: r[key] for key in ("subscriptions", "events_per_second", "matches", "wall_s", "load_s",
                                             "peak_rss_mb")})
        del w
    _emit(sweep_summary("increasing-sweep", events, runs, peak_rss_mb=max(r["peak_rss_mb"] for r in runs),
                        eval_errors=0))


@bench.command()
@click.option("--ks", default="10,100,1000,10000", show_default=True, help="Comma-separated numbers of symbols.")
@click.option("--events", type=int, default=200000, show_default=True, help="Events to generate.")
@click.option("--length", type=int, default=10, show_default=True, help="Consecutive increasing prices.")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed of the generator.")
def floor(ks, events, length, seed):
    """The events of `increasing-sweep` through a minimal hand-written loop
    (a dict per state, no engine): what CPython itself costs as K grows."""
    from clients.bench.floor import floor_sweep
    _emit(floor_sweep([int(x) for x in ks.split(",")], events, length, seed))


@bench.command("rise-floor")
@click.option("--symbols", default="10,1000", show_default=True, help="Comma-separated numbers of symbols.")
@click.option("--events", type=int, default=1000000, show_default=True, help="Events to generate.")
@click.option("--rounds", type=int, default=3, show_default=True, help="Runs of each, in turn (best of).")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed of the generator.")
def rise_floor(symbols, events, rounds, seed):
    """`rise` against a minimal hand-written loop of the same query (per-symbol
    sorted lists, no engine), in turn in this process, for each number of
    symbols: what CPython itself costs, and what cold memory adds."""
    from clients.bench.floor import rise_floor as run

    _emit(run([int(x) for x in symbols.split(",")], events, seed, rounds))


@bench.command()
@click.option("--subscriptions", type=int, default=20000, show_default=True, help="One CEL query per symbol.")
@click.option("--events", type=int, default=200000, show_default=True, help="Events to generate.")
@click.option("--every", type=int, default=100, show_default=True,
              help="Replace one subscription every this many events.")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed of the generator.")
def churn(subscriptions, events, every, seed):
    """Subscriptions registered as the server does, then replaced while events flow."""
    from clients.bench.churn import churn as run_churn
    _emit(run_churn(subscriptions, events, every, seed))


@bench.command()
@click.option("--events", type=int, default=1_000_000, show_default=True, help="Ticks to generate.")
@click.option("--symbols", "n_symbols", type=int, default=1000, show_default=True, help="Distinct stock names.")
@click.option("--queries", default="rising", show_default=True,
              help="Comma-separated queries of clients/bench/queries/ (rising, runup, mshape, all).")
@click.option("--watchers", type=int, default=None, help="cayuga watch processes (default: one per query).")
@click.option("--file", "file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Send this JSON-lines file instead of generated ticks.")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed of the generator.")
@click.option("--tls", type=click.Choice(["off", "on", "both"]), default="off", show_default=True,
              help="TLS on both of the server's ports (certificates made for the run; needs trustme), or both "
                   "runs on the same ticks, one after the other, with what TLS cost.")
def server(events, n_symbols, queries, watchers, file, seed, tls):
    """End to end through a real server: cayuga send -> cayuga serve -> cayuga
    watch, against cayuga run on the same file in the same run."""
    from clients.bench.server_e2e import throughput_tls
    _emit(throughput_tls(events, n_symbols, tuple(queries.split(",")), watchers, file, seed, tls))


@bench.command()
@click.option("--workers", default="1,2", show_default=True, help="Comma-separated engine_workers values to compare.")
@click.option("--queries", type=int, default=10_000, show_default=True, help="Per-symbol increasing queries.")
@click.option("--events", type=int, default=200_000, show_default=True, help="Ticks sent.")
@click.option("--symbols", "n_symbols", type=int, default=1000, show_default=True, help="Distinct stock names.")
@click.option("--length", type=int, default=10, show_default=True, help="Rising quotes per query.")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed of the generator.")
@click.option("--query", type=click.Choice(["increasing", "rising"]), default="increasing", show_default=True,
              help="increasing: per-symbol queries (placed whole); rising: --queries README Rising-kind "
                   "subscriptions over all symbols (row-scaled).")
@click.option("--row-scaling", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
              help="The servers' row_scaling setting.")
@click.option("--watchers", type=int, default=0, show_default=True,
              help="WebSocket clients watching one subscription each while the events go through.")
def workers(workers, queries, events, n_symbols, length, seed, query, row_scaling, watchers):
    """Many per-symbol queries through a real server at several engine_workers
    values, one server each: events/s from the first line sent until every event
    went through the engine, and each over the first count's (a count may
    repeat: 1,2,1,2 pairs the runs on a shared machine)."""
    from clients.bench.workers import run
    _emit(run([int(w) for w in workers.split(",")], queries, events, n_symbols, length, seed, query, row_scaling,
              watchers))


@bench.command("worker-path")
@click.option("--queries", type=int, default=10_000, show_default=True, help="Per-symbol increasing queries.")
@click.option("--events", type=int, default=100_000, show_default=True, help="Ticks fed.")
@click.option("--batch", type=int, default=1024, show_default=True, help="Events a batch (batch_size).")
@click.option("--workload", type=click.Choice(["increasing", "rising"]), default="increasing", show_default=True,
              help="increasing: --queries per-symbol queries; rising: the README's Rising once over bench "
                   "server's random walk, beside cayuga run's loop over the same events.")
def worker_path(queries, events, batch, workload):
    """The increasing workload of `workers` (or Rising) on one engine worker run in this
    process, its batches' CPU (and by part), then the main process's CPU for their
    results (decoded, numbered, logged), each half apart."""
    from clients.bench.workerpath import run
    _emit(run(queries, events, batch=batch, workload=workload))


@bench.command("ingest-path")
@click.option("--events", type=int, default=500_000, show_default=True, help="Ticks received.")
@click.option("--symbols", "n_symbols", type=int, default=1000, show_default=True, help="Distinct stock names.")
@click.option("--crossed", is_flag=True, help="Each block's events cross as columns first, as from a reader "
              "process (docs/design/receivers.md, stage 1): the main process's part then.")
def ingest_path(events, n_symbols, crossed):
    """The main process's half of each event on its way to a worker, in this process at
    the shipped settings: blocks of ticks decoded, limited, queued and journaled, taken
    in batches and encoded for the worker; each step's CPU per event, and the events
    a second one core doing only this would let through."""
    from clients.bench.ingestpath import run
    _emit(run(events, n_symbols, crossed=crossed))


@bench.command()
@click.option("--rates", default="10000,50000,100000", show_default=True, help="Comma-separated events/s.")
@click.option("--seconds", type=float, default=5.0, show_default=True, help="Per rate.")
@click.option("--delay", type=float, default=0.0, show_default=True, help="The server's T in ms.")
@click.option("--registering", type=int, default=0, show_default=True,
              help="Per-symbol queries registered in one request while the probes flow "
                   "(`during_registration`: the probes' latency meanwhile).")
def latency(rates, seconds, delay, registering):
    """TCP in -> WebSocket out latency at fixed rates, through a server process."""
    from clients.bench.server_e2e import latency as run_latency
    runs = [run_latency(float(r), seconds, delay, registering) for r in rates.split(",")]
    _emit({"benchmark": "latency_tcp_to_websocket", "runs": runs})


@bench.command()
@click.option("--events", type=int, default=1_000_000, show_default=True, help="Ticks the server retains.")
@click.option("--symbols", "n_symbols", type=int, default=1000, show_default=True, help="Distinct stock names.")
@click.option("--rate", type=float, default=10_000, show_default=True,
              help="Events/s of the live probes whose latency is measured with and without a backfill.")
@click.option("--seconds", type=float, default=3.0, show_default=True, help="How long each latency run sends.")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed of the generator.")
def backfill(events, n_symbols, rate, seconds, seed):
    """Rising registered from: "retained" over retained ticks against cayuga run
    of the same file (target >= 0.8x its speed), the live path's p99 while the
    backfill runs against without (target <= 2x) and the journal's bytes per
    retained event (issue 36)."""
    from clients.bench.backfill import backfill as run_backfill
    _emit(run_backfill(events, n_symbols, seed, rate, seconds))


@bench.command()
@click.option("--seconds", type=float, default=60.0, show_default=True, help="How long the sender pushes.")
def overload(seconds):
    """One unthrottled TCP sender against 20 slow subscriptions: queue, memory,
    /health and /metrics answer times, nothing lost (RELIABILITY.md)."""
    from clients.bench.overload import overload as run_overload
    _emit(run_overload(seconds))


@bench.command()
@click.option("--small", type=int, default=200, show_default=True, help="Subscriptions in the small network.")
@click.option("--large", type=int, default=8000, show_default=True, help="Subscriptions in the large network.")
@click.option("--rounds", type=int, default=3, show_default=True, help="Report the best of this many.")
def scaling(small, large, rounds):
    """Remove + add of one subscription: the cost in a large network against a
    small one (a ratio near 1: it does not grow with the network)."""
    from clients.bench.scaling import scaling as run_scaling
    _emit(run_scaling(small, large, rounds))


@bench.command("offline")
@click.option("--events", type=int, default=1_000_000, show_default=True, help="Ticks to generate.")
@click.option("--symbols", "n_symbols", type=int, default=1000, show_default=True, help="Distinct stock names.")
@click.option("--runs", type=int, default=3, show_default=True, help="Whole-process cayuga run timings (median).")
@click.option("--rounds", type=int, default=3, show_default=True, help="Decode timings (best of).")
@click.option("--file", "file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Use this JSON-lines file of Stock ticks instead of generated ones.")
@click.option("--seed", type=int, default=1, show_default=True, help="Random seed of the generator.")
def offline_(events, n_symbols, runs, rounds, file, seed):
    """cayuga run of the rise query, whole process, against the 2 s target, and
    our decode µs a line against msgspec's bare decode_lines of the same bytes."""
    from clients.bench.offline import offline
    _emit(offline(events, n_symbols, seed, runs, rounds, file))
