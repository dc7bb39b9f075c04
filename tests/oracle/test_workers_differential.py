"""The differential tests through a server with engine workers (issue 32, item 4).

Random CEL (tests/oracle/cel_gen.py) and the conformance corpus
(tests/conformance/cel) are registered on a real server with ``engine_workers:
2`` (random CEL also at 4) and the shipped ``row_scaling: auto``: a query with
a partition key that keeps instances is split over all the workers by its
key's value (each event goes
to its value's worker, the workers' witnesses merged before they are
numbered), every other one is dealt whole to one worker. The events are posted
in ``t1`` order; each subscription's witnesses, read back from its witness log,
must be numbered 1 to n without a gap and be exactly what the oracle's CEL
(tests/oracle/celeval.py, which no part of the product takes part in) gives
over the same events, for every stream the query publishes: as multisets of
typed values with their ``t0`` and ``t1``.

Profiles as tests/oracle/test_differential.py: quick by default (a fresh seed
each run, printed), long with ``CAYUGA_FUZZ_PROFILE=long``; replay with
``CAYUGA_FUZZ_SEED=<seed>``.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

from air.cel import CelError, compile_cel
from clients.client import CayugaClient
from clients.testing import wait_until
from clients.testing.witnesses import logged_witnesses
from server.serve import RunningServer
from tests.cel.corpus import STREAMS as CORPUS_STREAMS
from tests.cel.corpus import cel_text
from tests.cel.test_equivalence import events as corpus_events
from tests.oracle import Event, cel_gen
from tests.oracle.cel import OracleCelError
from tests.oracle.celeval import Cel, OracleCelTooLarge
from tests.oracle.test_cel_differential import CORPUS_DECL, corpus, expected, schemas, typed
from tests.oracle.test_differential import LONG, SEED
from tests.server.conftest import assert_no_cayuga_threads, make_settings

RANDOM_QUERIES = 200 if LONG else 40
RANDOM_EVENTS = 400 if LONG else 120
CORPUS_SEEDS = 8 if LONG else 4  # (seed % 4 picks the kind of stream: random, rising, falling, an M shape)


def replay() -> str:
    return f"seed={SEED} (replay: CAYUGA_FUZZ_SEED={SEED} python -m pytest tests/oracle/test_workers_differential.py)"


def _line(decl: dict, e) -> dict:
    return {"stream": e[0], "t0": e[2], "t1": e[3], **dict(zip((a for a, _ in decl.get(e[0], ())), e[1]))}


def _witness(line: dict) -> tuple:
    """A witness line as the oracle gives one: its attributes in the output's order, typed."""
    return typed(v for k, v in line.items() if k not in ("stream", "t0", "t1")), line["t0"], line["t1"]


def _through_workers(tmp_path, decl: dict, queries: list[tuple[str, dict]], events: list, workers: int = 2) -> dict:
    """``queries``: (CEL, the oracle's witnesses by published stream, None for the query's output),
    registered on a server with ``workers`` engine workers and fed ``events``. Asserts every subscription's
    witnesses; returns how the subscriptions were placed (``runs_on`` -> how many)."""
    s = make_settings(tmp_path, time="event", engine_workers=workers)
    placed: Counter = Counter()
    with RunningServer(s) as srv, CayugaClient(srv.base_url) as c:
        for name, attrs in decl.items():
            if name != "DUAL":
                c.declare_stream(name, dict(attrs))
        subs = [c.subscribe(cel=text) for text, _ in queries]
        c.post_events([_line(decl, e) for e in events])
        wait_until(lambda: srv.daemon.events_taken == len(events), 120, what="every event through both workers")
        assert srv.daemon.engine_error is None, srv.daemon.engine_error
        for sub, (text, want) in zip(subs, queries):
            got = c.subscription(sub["id"])
            placed["row-scaled" if "row-scaled" in got["runs_on"] else got["runs_on"]] += 1
            n = got["last_seq"]
            logged = logged_witnesses(srv.base_url, sub["id"], n) if n else []
            assert [seq for seq, _ in logged][:n] == list(range(1, n + 1)), f"{text!r}: numbered with a gap"
            by_stream: dict = {}
            for _, body in logged[:n]:
                line = json.loads(body)
                by_stream.setdefault(line["stream"], Counter())[_witness(line)] += 1
            for name in sub["outputs"]:  # (the oracle's None: the query's output, named or not)
                expected, found = want.get(name, want[None]), by_stream.pop(name, Counter())
                assert found == expected, (
                    f"{text!r} ({got['runs_on']}), stream {name}: only the server: {sorted((found - expected).items())[:4]}; "
                    f"only the oracle: {sorted((expected - found).items())[:4]}; {replay()}")
            assert not by_stream, f"{text!r}: witnesses of streams the oracle does not publish: {list(by_stream)}"
    assert_no_cayuga_threads()
    return placed


def keyed_query(rng: random.Random, i: int) -> str:
    """A random NEXT with a partition key (equal ``Name``, or ``Sym``, at its step), which row
    scaling splits over the workers; the rest of its condition from the generator."""
    base, key = rng.choice([("Stock", "Name"), ("Trade", "Sym")])
    schema = cel_gen.STREAMS[base]
    scope = [("$1", n, t) for n, t in schema] + [("$2", n, t) for n, t in schema]
    pred = cel_gen._Gen(rng).pred(scope, ("DUR", "$2.DUR"))
    return f"{base} NEXT{{$1.{key} = $2.{key} AND ({pred})}} {base} PUBLISH Keyed_{i}"


@pytest.mark.parametrize("workers", [2, 4])
def test_random_cel_through_workers_gives_the_oracles_witnesses(tmp_path, workers):
    print(replay())
    rng = random.Random(SEED ^ 0x32)
    decl, product = cel_gen.STREAMS, schemas(cel_gen.STREAMS)
    events = cel_gen.stream(rng, RANDOM_EVENTS)
    queries, skipped = [], Counter()
    while len(queries) < RANDOM_QUERIES:
        if len(queries) % 4 == 3:
            text = keyed_query(rng, len(queries))
        else:
            text = cel_gen.query(rng, errors=len(queries) % 3 == 2)  # every third with expressions that may fail
        # each query's published streams its own (a name is one schema on a server)
        text = re.sub(r"PUBLISH (Inner\d+|Out)\b", lambda m: f"PUBLISH {m[1]}_{len(queries)}", text)
        try:
            compile_cel(text, product)
            want = expected(Cel(text, decl), events)
        except (CelError, OracleCelError):  # (that both refuse the same: tests/oracle/test_cel_differential.py)
            skipped["refused"] += 1
            continue
        except OracleCelTooLarge:
            skipped["too large"] += 1
            continue
        queries.append((text, want))
    placed = _through_workers(tmp_path, decl, queries, events, workers)
    witnesses = sum(sum(c.values()) for _, want in queries for c in want.values())
    print(f"{len(queries)} queries ({dict(placed)}), {dict(skipped)} skipped, {witnesses} witnesses")
    assert placed["row-scaled"] and all(placed[f"worker {w}"] for w in range(workers)), placed  # every placement
    assert witnesses > len(queries) and skipped["too large"] < len(queries) // 4  # not vacuous


def test_the_corpus_through_two_workers_gives_the_oracles_witnesses(tmp_path):
    """Every corpus query (over declared streams) on one server per seed's stream; one
    that publishes a declared stream (test201: IBMStock), which would feed the others
    reading it, on a server of its own."""
    placed: Counter = Counter()
    texts = [cel_text(name) for name in corpus()]
    feeds = [t for t in texts if set(compile_cel(t, CORPUS_STREAMS).outputs) & set(CORPUS_DECL)]
    groups = [[t for t in texts if t not in feeds]] + [[t] for t in feeds]
    witnesses = 0
    for seed in range(CORPUS_SEEDS):
        events = [Event(e.stream, tuple(e.values), e.t0, e.t1) for e in corpus_events(seed)]
        for i, group in enumerate(groups):
            queries = [(text, expected(Cel(text, CORPUS_DECL), events)) for text in group]
            placed += _through_workers(tmp_path / f"seed{seed}-{i}", CORPUS_DECL, queries, events)
            witnesses += sum(sum(c.values()) for _, want in queries for c in want.values())
    print(f"{len(texts)} corpus queries over {CORPUS_SEEDS} streams ({dict(placed)}), {witnesses} witnesses")
    assert len(texts) >= 45 and len(feeds) == 1 and placed["row-scaled"] and witnesses > 1000
