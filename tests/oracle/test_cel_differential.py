"""Differential test of the CEL compiler against the oracle's CEL, a front end
of its own (tests/oracle/cel.py reads the query, tests/oracle/celeval.py
evaluates the Cayuga algebra it means directly over the events; neither
imports the product, nor builds an automaton).

1. Random valid CEL (tests/oracle/cel_gen.py) on random streams: the product
   compiles it (``compile_cel``); both engine builds run the automata (this
   process's build directly, the other in a child process through
   tests/engine/oracle_probe.py under every engine switch combination, on the
   AIR the product writes out); every stream the query publishes (nested
   PUBLISH included) and its output must hold exactly the oracle's witnesses,
   as multisets of typed values with their ``t0`` and ``t1``, and the output
   schema must have the oracle's names in its order. On a difference the
   message also says what the AIR oracle (tests/oracle/machine.py) makes of the
   product's automata: whether the compiler or an engine is at fault.
2. The conformance corpus (tests/conformance/cel, every query over declared
   streams) on the streams of tests/cel/test_equivalence.py: the same, both
   builds.
3. Where the corpus has the original Cayuga compiler's AIR: the oracle's CEL
   and the AIR oracle running the original AIR agree — a check in which no
   part of the product takes part.

Profiles as tests/oracle/test_differential.py: quick by default (a fresh seed
each run, printed), long with ``CAYUGA_FUZZ_PROFILE=long``; replay with
``CAYUGA_FUZZ_SEED=<seed>``.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from air.airxml import dump_air
from air.cel import CelError, ShapeCache, compile_cel
from air.cel.shapes import same_compiled
from air.engine import BUILD, Engine
from air.engine import Event as ProductEvent
from air.model import Attribute, StreamSchema
from tests.cel.corpus import STREAMS as CORPUS_STREAMS
from tests.cel.corpus import UNKNOWN_SCHEMA, cel_files, cel_text, pairs
from tests.cel.test_equivalence import events as corpus_events
from tests.oracle import Event, Oracle, cel_gen, read_air
from tests.oracle.cel import OracleCelError
from tests.oracle.celeval import Cel, OracleCelTooLarge
from tests.oracle.test_differential import LONG, SEED, has_compiled_build, probe

CASES = 1000 if LONG else 100
STREAMS_PER_CASE = 6 if LONG else 3
EVENTS = 40
CORPUS_SEEDS = 24 if LONG else 8


def replay() -> str:
    here = "tests/oracle/test_cel_differential.py"
    return f"seed={SEED} (replay: CAYUGA_FUZZ_SEED={SEED} python -m pytest {here})"


def schemas(decl: dict) -> dict:
    return {n: StreamSchema(n, tuple(Attribute(a, t) for a, t in attrs)) for n, attrs in decl.items()}


def typed(values) -> tuple:
    """Values with their types: an int where the oracle has a float is a difference."""
    return tuple((type(v).__name__, v) for v in values)


def expected(cel: Cel, events) -> dict:
    """The oracle's witnesses by stream name (the query's output under ``None``)."""
    return {k: Counter({(typed(v), t0, t1): n for (v, t0, t1), n in c.items()})
            for k, c in cel.run(events).items()}


def by_name(want: dict, q) -> dict:
    """The oracle's witnesses under the product's stream names."""
    return {(q.outputs[-1] if k is None else k): c for k, c in want.items()}


def engine_witnesses(q, decl: dict, events) -> tuple[dict, Engine]:
    eng = Engine()
    for s in schemas(decl).values():
        eng.declare(s)
    eng.add(q.automata, owner="q")
    got: dict = {}
    for em in eng.run([ProductEvent(*e) for e in events]):
        got.setdefault(em.stream, Counter())[(typed(em.event.values), em.event.t0, em.event.t1)] += 1
    return got, eng


def probe_case(q, decl: dict, events) -> dict:
    return {"automata": [dump_air(a) for a in q.automata], "streams": {n: [list(a) for a in v] for n, v in decl.items()},
            "base": [n for n in decl if n != "DUAL"], "events": [[e[0], list(e[1]), e[2], e[3]] for e in events]}


def air_oracle(q, decl: dict, events) -> dict:
    """What the AIR oracle makes of the product's automata (for a failure's message)."""
    o = Oracle(max_instances=50_000)
    for n, attrs in decl.items():
        o.declare(n, attrs)
    for a in q.automata:
        o.add(read_air(dump_air(a)), owner="q")
    out: dict = {}
    for w in o.run(events):
        out.setdefault(w.stream, Counter())[(typed(w.values), w.t0, w.t1)] += 1
    return out


def differs(want: dict, got: dict, names) -> list[str]:
    return [n for n in names if want.get(n, Counter()) != got.get(n, Counter())]


def explain(text: str, q, decl: dict, events, want: dict, got: dict, bad: list[str], where: str) -> str:
    lines = [f"{where}: {text!r} differs from the oracle's CEL on {bad}; {replay()}",
             f"events: {[tuple(e) for e in events]}"]
    try:
        air = air_oracle(q, decl, events)
        verdict = ["the product's AIR, run by the AIR oracle, " + (
            "gives the engine's witnesses: the compiler (or the oracle's CEL) is wrong"
            if not differs(got, air, bad) else "gives the oracle's CEL witnesses: the engine is wrong"
            if not differs(want, air, bad) else "agrees with neither")]
    except Exception as exc:  # noqa: BLE001 - only a hint for the message
        verdict = [f"(the AIR oracle could not run the product's AIR: {exc})"]
    for n in bad:
        w, g = want.get(n, Counter()), got.get(n, Counter())
        lines.append(f"{n}: only the product: {sorted((g - w).items())[:4]}; only the oracle: "
                     f"{sorted((w - g).items())[:4]}")
    return "\n".join(lines + verdict)


def other_build() -> str | None:
    """The build this process does not run (None when this tree has only one)."""
    if not has_compiled_build():
        return None
    return "python" if BUILD == "compiled" else "compiled"


def check_other_build(cases: list) -> int:
    """``cases``: (text, q, decl, events, wanted by name, may fail); each run by the other build
    under every switch combination. Returns how many comparisons were made."""
    build = other_build()
    if build is None or not cases:
        return 0
    done = 0
    for (text, q, decl, events, want, errors), per_config in zip(
            cases, probe([probe_case(*c[1:4]) for c in cases], build)):
        for config, result in per_config.items():
            assert "error" not in result, f"{build} build, switches {config!r}: {text!r}: {result['error']}"
            got: dict = {}
            for _owner, stream, _kind, values, t0, t1 in result["witnesses"]:
                got.setdefault(stream, Counter())[(typed(values), t0, t1)] += 1
            bad = differs(want, got, want)
            assert not bad, explain(text, q, decl, events, want, got, bad, f"{build} build, switches {config!r}")
            assert errors or result["eval_errors"] == 0, result["last_eval_error"]
            done += 1
    return done


# --------------------------------------------------------------------------- 1. random CEL

def test_random_cel_both_engine_builds_agree_with_the_oracles_cel():
    print(replay())
    rng = random.Random(SEED ^ 0xCE1CE1)
    decl, product = cel_gen.STREAMS, schemas(cel_gen.STREAMS)
    compiled = refused = large = total = nested = failing = 0
    other = []
    for case in range(CASES):
        errors = case % 3 == 2  # every third query has expressions that may fail
        text = cel_gen.query(rng, errors)
        try:
            q, why = compile_cel(text, product), None
        except CelError as exc:
            q, why = None, exc
        try:
            cel, mine = Cel(text, decl), None
        except OracleCelError as exc:
            cel, mine = None, exc
        assert (q is None) == (cel is None), (
            f"{text!r}: the product {'refuses it: ' + str(why) if why else 'compiles it'}, the oracle's CEL "
            f"{'refuses it: ' + str(mine) if mine else 'reads it'}; {replay()}")
        if q is None:
            refused += 1
            continue
        compiled += 1
        nested += len(q.automata) > 1
        cache = ShapeCache()  # as a server compiles it: bound from its shape's compiled form
        cache.compile(text, product, name_prefix="s1")
        assert same_compiled(cache.compile(text, product, name_prefix="s2"),
                             compile_cel(text, product, name_prefix="s2")), f"{text!r}: bound from its shape"
        assert list(q.schemas[q.outputs[-1]].names) == [n for n, _ in cel.schema], f"{text!r}: output schema"
        for k in range(STREAMS_PER_CASE):
            events = cel_gen.stream(rng, EVENTS)
            try:
                want = by_name(expected(cel, events), q)
            except OracleCelTooLarge:
                large += 1
                continue
            if not errors:
                assert cel.errors == 0, f"{text!r}: the generator made a failing expression: {cel.last_error}"
            got, eng = engine_witnesses(q, decl, events)
            bad = differs(want, got, want)
            assert not bad, explain(text, q, decl, events, want, got, bad, f"{BUILD} build")
            # (with failures, the counts depend on which edges evaluate an expression; witnesses do not)
            assert errors or eng.stats.eval_errors == 0, eng.stats.last_eval_error
            failing += cel.errors > 0
            total += sum(want[q.outputs[-1]].values())
            if k == 0:
                other.append((text, q, decl, events, want, errors))
    checked = check_other_build(other)
    print(f"{compiled} of {CASES} random queries compiled ({nested} into several automata), {refused} refused "
          f"by both, {large} cases too large, {failing} with failing expressions; {total} witnesses; "
          f"{checked} runs of the other build")
    assert failing > 0
    assert refused <= CASES // 10, f"the generator made {refused} invalid queries of {CASES}"
    assert large < compiled * STREAMS_PER_CASE // 5
    assert total > compiled  # the comparison is not vacuous


# --------------------------------------------------------------------------- 2. the corpus

def corpus() -> list[str]:
    return [p.stem for p in cel_files() if p.stem not in UNKNOWN_SCHEMA]


CORPUS_DECL = {n: tuple((a.name, a.type) for a in s.attributes) for n, s in CORPUS_STREAMS.items()}


def test_every_corpus_query_agrees_with_the_oracles_cel_on_both_builds():
    other, total, names = [], 0, corpus()
    assert len(names) >= 45, names
    for name in names:
        text = cel_text(name)
        q, cel = compile_cel(text, CORPUS_STREAMS), Cel(text, CORPUS_DECL)
        assert list(q.schemas[q.outputs[-1]].names) == [n for n, _ in cel.schema], f"{name}: output schema"
        for seed in range(CORPUS_SEEDS):
            events = [Event(e.stream, tuple(e.values), e.t0, e.t1) for e in corpus_events(seed)]
            want = by_name(expected(cel, events), q)
            got, _ = engine_witnesses(q, CORPUS_DECL, events)
            bad = differs(want, got, want)
            assert not bad, explain(name, q, CORPUS_DECL, events, want, got, bad, f"{BUILD} build")
            total += sum(want[q.outputs[-1]].values())
            if seed < 2:
                other.append((name, q, CORPUS_DECL, events, want, False))
    check_other_build(other)
    assert total > 10_000  # the corpus queries do match on these streams


# --------------------------------------------------------------------------- 3. the original compiler

@pytest.mark.parametrize("name,paths", pairs(), ids=lambda x: str(x))
def test_the_original_compilers_air_agrees_with_the_oracles_cel(name, paths):
    """No product code runs here: the original AIR read and run by the AIR
    oracle, the CEL read and evaluated by the oracle's CEL."""
    cel = Cel(cel_text(name), CORPUS_DECL)
    total = 0
    for seed in range(CORPUS_SEEDS):
        events = [Event(e.stream, tuple(e.values), e.t0, e.t1) for e in corpus_events(seed)]
        o = Oracle()
        for n, attrs in CORPUS_DECL.items():
            o.declare(n, attrs)
        for p in paths:
            o.add(read_air(p.read_text()), owner="orig")
        # the last file's automaton publishes the query's stream
        stream = next(out for s in o.automata[-1][1].states for out, _ in s.outputs)
        theirs = Counter((typed(w.values), w.t0, w.t1) for w in o.run(events) if w.stream == stream)
        mine = expected(cel, events)
        assert theirs == mine[None], f"{name}, seed {seed}: {sorted((theirs - mine[None]).items())[:3]} vs " \
                                     f"{sorted((mine[None] - theirs).items())[:3]}"
        total += sum(theirs.values())
    assert total > 0 or name in ("test15",), name  # DUAL: its events are few


def test_the_oracles_cel_reads_what_the_corpus_holds():
    """Every corpus query over declared streams is read by the oracle's CEL, and
    the few that read an undeclared stream are refused, as by the product."""
    for name in corpus():
        Cel(cel_text(name), CORPUS_DECL)
    for name in UNKNOWN_SCHEMA:
        with pytest.raises(OracleCelError):
            Cel(cel_text(name), CORPUS_DECL)
