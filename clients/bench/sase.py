"""``cayuga bench sase``: the SASE paper's workload shape (docs/design/references.md#sase,
its section 5; docs/design/sase.md) through the SASE front end and the engine.

Events: ``types`` event types (one stream each, ``E0 ... E<types-1>``), the type
of each event uniform; five int attributes ``a1 ... a5``, ``a1`` uniform over
``domain`` values (the equivalence attribute), the others over 1000; one event
per time unit, so ``WITHIN window`` spans ``window`` events, as the paper counts
its windows. The query: ``SEQ`` of ``length`` distinct types with ``[a1]``,
``negations`` negated components (a further type each) in the gaps from the
second on (or, with ``--negated-end``, the last one after the sequence), an
optional simple predicate (``x1.a2 < 500``) and parameterized one
(``x1.a3 < xL.a3``), ``WITHIN window``.

Reported: events/s through the engine (each event is also republished once on
the query's union stream: that cost is in the figure), matches, matches per
second and per event (the paper's selectivity), and for a query without
negation or predicates two estimates of that selectivity: the paper's formula
(1), ``C(W, L) / (T^L * V^(L-1) * W)``, and the expected matches ending at an
event, ``C(W-1, L-1) / (T^L * V^(L-1))`` (the last event fixed, the others
among the ``W-1`` before it: the paper's formula is this divided by about
``L``).
"""

from __future__ import annotations

import gc
import math
import random
import sys
import time

from air.engine import BUILD, Engine, Event
from air.model import Attribute, StreamSchema
from air.sase import compile_sase
from clients.bench.runner import peak_rss_mb

ATTRS = ("a1", "a2", "a3", "a4", "a5")


def query_text(length: int, window: int, negations: int, negated_end: bool, simple: bool, param: bool,
               types: int) -> str:
    if length + negations > types:
        raise ValueError(f"{length} positive and {negations} negated components need that many distinct types; "
                         f"there are {types}")
    comps = [f"E{i} x{i + 1}" for i in range(length)]
    negs = [f"!(E{length + j} n{j + 1})" for j in range(negations)]
    if negated_end and negs:
        comps.append(negs.pop())
    gaps = list(range(1, length))
    if len(negs) > len(gaps):
        raise ValueError(f"{negations} negations need {negations} gaps between {length} components (or one at the "
                         "end with --negated-end)")
    for k, n in zip(reversed(gaps[:len(negs)]), reversed(negs)):
        comps.insert(k, n)
    where = ["[a1]"] + (["x1.a2 < 500"] if simple else []) + ([f"x1.a3 < x{length}.a3"] if param else [])
    return f"EVENT SEQ({', '.join(comps)}) WHERE {' AND '.join(where)} WITHIN {window}"


def events(n: int, types: int, domain: int, seed: int) -> list[Event]:
    rng = random.Random(seed)
    out = []
    for t in range(1, n + 1):
        values = (rng.randrange(domain),) + tuple(rng.randrange(1000) for _ in ATTRS[1:])
        out.append(Event(f"E{rng.randrange(types)}", values, t, t))
    return out


def estimate(length: int, window: int, types: int, domain: int) -> float:
    """The paper's formula (1): a query with one equivalence test and no negation."""
    return math.comb(window, length) / (types ** length * domain ** (length - 1) * window)


def expected(length: int, window: int, types: int, domain: int) -> float:
    """Matches ending at an event, in expectation (away from the stream's start)."""
    return math.comb(window - 1, length - 1) / (types ** length * domain ** (length - 1))


def run(n_events: int = 200_000, length: int = 3, window: int = 1000, negations: int = 0,
        negated_end: bool = False, domain: int = 100, types: int = 20, simple: bool = False, param: bool = False,
        seed: int = 1, options: dict | None = None) -> dict:
    text = query_text(length, window, negations, negated_end, simple, param, types)
    streams = [StreamSchema(f"E{i}", tuple(Attribute(a, "int") for a in ATTRS)) for i in range(types)]
    q = compile_sase(text, streams, name_prefix="q")
    eng = Engine(**(options or {}))
    for s in streams:
        eng.declare(s)
    eng.add(list(q.automata), owner="q")
    evs = events(n_events, types, domain, seed)
    matches = 0

    def on_emit(em) -> None:
        nonlocal matches
        if em.kind == "OUT":
            matches += 1

    eng.on_emit = on_emit
    feed = eng.feed
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    for ev in evs:
        feed(ev)
    eng.flush()
    wall = time.perf_counter() - t0
    gc.unfreeze()
    plain = negations == 0 and not simple and not param
    return {
        "workload": "sase", "query": text, "events": n_events, "subscriptions": 1,
        "length": length, "window": window, "negations": negations, "negated_end": negated_end,
        "domain": domain, "types": types,
        "matches": matches,
        "events_per_second": round(n_events / wall, 1) if wall > 0 else None,
        "matches_per_second": round(matches / wall, 1) if wall > 0 else None,
        "selectivity": round(matches / n_events, 6),
        "selectivity_paper_formula": round(estimate(length, window, types, domain), 6) if plain else None,
        "selectivity_expected": round(expected(length, window, types, domain), 6) if plain else None,
        "wall_s": round(wall, 3),
        "instances_at_end": eng.instance_count(),
        "eval_errors": eng.stats.eval_errors,
        "peak_rss_mb": peak_rss_mb(),
        "python": sys.version.split()[0],
        "engine_build": BUILD,
    }


__all__ = ["run", "query_text", "events", "estimate", "expected"]
