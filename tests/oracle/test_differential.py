"""Differential fuzzing: the engine against the independent oracle.

1. Random valid AIR (tests/oracle/gen.py; every third case with values, literals
   and exponents from the whole domain, where expressions overflow and fail) on
   random point and interval streams with many simultaneous events: both engine builds (compiled and pure Python,
   each in a child process, tests/engine/oracle_probe.py), under every engine
   switch combination (indexes, state merging), with some automata added or
   removed while the events flow, and some restarted from an exported state
   (a snapshot) in the middle of the stream, give the oracle's witnesses, epoch by epoch,
   as multisets per output stream.
2. Random CEL from a small grammar, compiled by the product and written out as
   AIR (some Volumes up to the 64-bit extremes): the engine running the compiled automata (and the other build, under
   every switch combination, loading that AIR) gives what the oracle gives
   reading that AIR, and what the oracle's own CEL (tests/oracle/celeval.py,
   which does not use the product's compiler) gives; the richer random CEL of
   tests/oracle/test_cel_differential.py does the latter on both builds.
3. The original compiler's AIR (tests/conformance/air) and the product's
   compilation of the same CEL (tests/conformance/cel), both run by the oracle,
   give the same witnesses.

Profiles: quick by default (a fresh seed each run, printed; well under a
minute), long with ``CAYUGA_FUZZ_PROFILE=long`` (or ``CAYUGA_FUZZ=long``).
Replay a run with ``CAYUGA_FUZZ_SEED=<seed>``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from air.airxml import dump_air, load_air
from air.cel import CelError, compile_cel
from air.engine import BUILD, Engine
from air.engine import build as engine_build
from tests.cel.corpus import STREAMS, cel_text, pairs
from tests.cel.test_equivalence import events as cel_events
from tests.conftest import in_ci
from tests.oracle import Oracle, OracleRunError, gen, read_air
from tests.oracle.celeval import Cel

ROOT = Path(__file__).resolve().parents[2]
LONG = "long" in (os.environ.get("CAYUGA_FUZZ_PROFILE", ""), os.environ.get("CAYUGA_FUZZ", ""))
SEED = int(os.environ.get("CAYUGA_FUZZ_SEED") or random.SystemRandom().randrange(10**9))
AIR_CASES = 3000 if LONG else 60
CEL_CASES = 1500 if LONG else 40
CEL_STREAMS = 40 if LONG else 4
MAX_INSTANCES = 3000  # a case whose instances explode (FOLD{} doubling) is skipped, and counted


def replay(extra: str = "") -> str:
    return f"seed={SEED} (replay: CAYUGA_FUZZ_SEED={SEED} python -m pytest {Path(__file__).relative_to(ROOT)}{extra})"


def by_epoch(witnesses) -> dict:
    """``(owner, stream, kind)`` -> that stream's epochs in order, each a
    multiset of ``(values, t0, t1)``; a witness out of epoch order fails."""
    out: dict = {}
    for owner, stream, kind, values, t0, t1 in witnesses:
        epochs = out.setdefault((owner, stream, kind), [])
        if not epochs or epochs[-1][0] != t1:
            assert not epochs or epochs[-1][0] < t1, f"witness out of epoch order on {stream}: t1={t1}"
            epochs.append((t1, Counter()))
        epochs[-1][1][(tuple(values), t0, t1)] += 1
    return out


# --------------------------------------------------------------------------- 1. random AIR

def with_errors(case_seed: int) -> bool:
    """Every third case lets some expressions fail (division by an attribute that may be 0)."""
    return case_seed % 3 == 0


def oracle_case(c: gen.Case):
    o = Oracle(max_instances=MAX_INSTANCES)
    for name, attrs in gen.BASE.items():
        o.declare(name, attrs)
    for i, (text, (add, remove)) in enumerate(zip(c.automata, c.schedule)):
        o.add(read_air(text), owner=f"a{i}", at=add)
        if remove is not None:
            o.remove(f"a{i}", at=remove)
    ws = o.run(c.events)
    if not with_errors(c.seed):
        assert o.eval_errors == 0, o.last_eval_error  # the generator made no failing expression
    return [(w.owner, w.stream, w.kind, w.values, w.t0, w.t1) for w in ws]


def as_json(c: gen.Case) -> dict:
    return {"automata": c.automata, "streams": {k: [list(a) for a in v] for k, v in c.streams.items()},
            "base": list(gen.BASE), "events": [[e.stream, list(e.values), e.t0, e.t1] for e in c.events],
            "schedule": c.schedule, "close": c.seed % 2 == 0, "restart_at": c.restart_at}


def probe(cases: list[dict], build: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("CAYUGA_ENGINE", "CAYUGA_EXPECT_ENGINE")}
    if build == "python":
        env["CAYUGA_ENGINE"] = "python"
    r = subprocess.run([sys.executable, "-m", "tests.engine.oracle_probe"], cwd=ROOT, input=json.dumps(cases),
                       env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["build"] == build, f"asked for the {build} build, the child ran {out['build']}"
    return out["results"]


def has_compiled_build() -> bool:
    """Whether this tree has the compiled engine; without it (installed without a C
    compiler) only the pure-Python build is checked here, and under CI=true, where
    .ci/run installs the compiler, that is a failure: both builds must be checked."""
    if all(engine_build.compiled_paths(m) for m in engine_build.MODULES):
        return True
    if in_ci():
        pytest.fail("this tree has no compiled engine, so only the pure-Python build would be checked against "
                    "the oracle (CI=true: .ci/run installs a C compiler, pip compiles the engine)", pytrace=False)
    return False


def builds() -> list[str]:
    return ["compiled", "python"] if has_compiled_build() else ["python"]


def test_random_air_both_engine_builds_agree_with_the_oracle():
    print(replay())
    rng = random.Random(SEED)
    seeds = [rng.randrange(10**9) for _ in range(AIR_CASES)]
    cases, expected, skipped = [], [], 0
    for s in seeds:
        c = gen.case(s, errors=with_errors(s))
        try:
            expected.append(oracle_case(c))
        except OracleRunError:
            skipped += 1
            continue
        cases.append((s, c))
    assert skipped < len(seeds) // 5, f"{skipped} of {len(seeds)} cases too large: {replay()}"
    total = 0
    for build in builds():
        results = probe([as_json(c) for _, c in cases], build)
        for (s, c), want, per_config in zip(cases, expected, results):
            for config, got in per_config.items():
                where = (f"{build} build, switches {config!r}, case seed {s} "
                         f"(gen.case({s}, errors={with_errors(s)}) rebuilds its AIR and events)")
                assert "error" not in got, f"{where}: {got['error']}; {replay()}"
                if not with_errors(s):  # (with failures, counts depend on evaluation order; witnesses do not)
                    assert got["eval_errors"] == 0, got["last_eval_error"]
                assert by_epoch(got["witnesses"]) == by_epoch(want), f"{where} differs from the oracle; {replay()}"
            total += len(want)
    assert total > len(cases)  # the cases do match: the comparison is not vacuous


# --------------------------------------------------------------------------- 2. random CEL

ATOMS_NEXT = ["$1.Name = $2.Name", "$2.Price > $1.Price", "$2.Price < $1.Price", "$2.Price >= 1.05 * $1.Price",
              "$2.Name = 'IBM'", "$2.Name != 'MSFT'", "$2.Volume > 300", "$2.Volume % 3 = 1",
              "CONTAINS($2.Name, 'IBM') = 1", "$2.Price - $1.Price > 2", "DUR < 100", "DUR >= 2",
              "$2.Price * 2 > 100", "$2.Volume / 7 > 30", "$2.Price ^ 2 > 3000"]
ATOMS_FILTER = ["Name = 'IBM'", "Price > 60", "Price <= 90", "Volume > 300", "CONTAINS(Name, 'I') = 1",
                "Volume % 2 = 0", "Price + 10 > 100", "DUR > 0"]


def _pred(rng: random.Random, atoms: list[str]) -> str:
    clauses = [" AND ".join(rng.sample(atoms, rng.choice([1, 1, 2]))) for _ in range(rng.choice([1, 1, 2]))]
    return " OR ".join(clauses)


def _unary(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.35:
        return "Stock"
    if r < 0.7:
        return f"FILTER{{{_pred(rng, ATOMS_FILTER)}}}(Stock)"
    if r < 0.8:
        return "(SELECT Name, Price, Volume FROM Stock)"
    # a right operand that is itself a sequence: compiled apart, its output resubscribed
    inner = f"Stock NEXT{{$1.Name = $2.Name}} FILTER{{{_pred(rng, ATOMS_FILTER)}}}(Stock)"
    if rng.random() < 0.5:
        inner = f"SELECT Name, Price, Volume FROM {inner} PUBLISH Inner{rng.randrange(1000)}"
    return f"(SELECT Name, Price, Volume FROM ({inner}))" if "PUBLISH" not in inner else f"({inner})"


def random_cel(rng: random.Random) -> str:
    left = rng.choice(["Stock", "(SELECT *, 1 AS cnt FROM Stock)", f"FILTER{{{_pred(rng, ATOMS_FILTER)}}}(Stock)"])
    text = left
    has_cnt = "cnt" in left
    for _ in range(rng.choice([1, 1, 2])):
        if rng.random() < 0.4:
            aggs = "$.cnt + 1 AS cnt" if has_cnt and rng.random() < 0.7 else ""
            filt = rng.choice(["$2.Name = $.Name", "$2.Name = $1.Name", ""])
            rebind = rng.choice(["$2.Price > $.Price", "$2.Price < $.Price", "$2.Volume >= 0", ""])
            text = f"({text}) FOLD{{{filt}, {rebind}, {aggs}}} {rng.choice(['Stock', 'FILTER{Price > 50}(Stock)'])}"
            has_cnt = False  # renamed by the next NEXT; keep aggregates to the first FOLD
        else:
            text = f"({text}) NEXT{{{_pred(rng, ATOMS_NEXT)}}} {_unary(rng)}"
            has_cnt = False
        if rng.random() < 0.3:
            text = f"FILTER{{DUR {rng.choice(['<', '>=', '>'])} {rng.choice([1, 3, 100])}}}({text})"
    return f"SELECT * FROM {text} PUBLISH Out"


def wide_volumes(rng: random.Random, evs: list) -> list:
    """``evs`` with some Volumes from the whole int domain (gen.INT_EDGES, up to the
    64-bit extremes): the random queries' Volume atoms (> 300, % 3, % 2, / 7, >= 0)
    cannot fail on them, and the remainders are computed exactly."""
    return [type(e)(e.stream, (*e.values[:2], rng.choice(gen.INT_EDGES)), e.t0, e.t1)
            if e.stream == "Stock" and rng.random() < 0.2 else e for e in evs]


def cel_case(q, evs) -> dict:
    """A case for tests/engine/oracle_probe.py: the compiled automata written out as AIR."""
    return {"automata": [dump_air(a) for a in q.automata],
            "streams": {n: [[a.name, a.type] for a in s.attributes] for n, s in STREAMS.items()},
            "base": list(STREAMS), "events": [[e.stream, list(e.values), e.t0, e.t1] for e in evs]}


def oracle_of_compiled(q, evs) -> Counter:
    o = Oracle(max_instances=MAX_INSTANCES)
    for s in STREAMS.values():
        o.declare(s.name, tuple((a.name, a.type) for a in s.attributes))
    for auto in q.automata:
        o.add(read_air(dump_air(auto)), owner="q")
    return Counter((w.stream, w.values, w.t0, w.t1) for w in o.run(evs) if w.stream == q.outputs[-1])


def engine_of_compiled(q, evs) -> Counter:
    eng = Engine()
    for s in STREAMS.values():
        eng.declare(s)
    eng.add(q.automata, owner="q")
    out = Counter((em.stream, tuple(em.event.values), em.event.t0, em.event.t1) for em in eng.run(evs)
                  if em.stream == q.outputs[-1])
    assert eng.stats.eval_errors == 0, eng.stats.last_eval_error
    return out


def test_random_cel_compiled_by_the_product_engine_agrees_with_the_oracle():
    print(replay())
    rng = random.Random(SEED ^ 0xCE1)
    compiled = total = skipped = resub = 0
    other = []  # (text, output stream, case for the probe, the oracle's witnesses)
    for _ in range(CEL_CASES):
        text = random_cel(rng)
        try:
            q = compile_cel(text, STREAMS)
        except CelError:
            continue
        cel = Cel(text, {n: tuple((a.name, a.type) for a in s.attributes) for n, s in STREAMS.items()})
        compiled += 1
        resub += len(q.automata) > 1
        for s in range(CEL_STREAMS):
            evs = wide_volumes(rng, cel_events(rng.randrange(10**6), n=30))
            try:
                want = oracle_of_compiled(q, evs)
            except OracleRunError:
                skipped += 1
                continue
            assert engine_of_compiled(q, evs) == want, f"{text!r} on cel_events: {replay()}"
            mine = cel.run([(e.stream, tuple(e.values), e.t0, e.t1) for e in evs])[None]
            assert Counter({(q.outputs[-1], *k): n for k, n in mine.items()}) == want, (
                f"{text!r}: the oracle's CEL differs from the product's compilation: {replay()}")
            total += sum(want.values())
            if s == 0:
                other.append((text, q.outputs[-1], cel_case(q, evs), want))
    # the other build (and every engine switch combination), on the compiled AIR written out
    # the build this process did not run (none when it ran the only one)
    build = ("python" if BUILD == "compiled" else "compiled") if has_compiled_build() else None
    if build and other:
        for (text, out, _, want), per_config in zip(other, probe([c for _, _, c, _ in other], build)):
            for config, got in per_config.items():
                assert "error" not in got, f"{text!r}: {got['error']}"
                found = Counter((w[1], tuple(w[3]), w[4], w[5]) for w in got["witnesses"] if w[1] == out)
                assert found == want, f"{build} build, switches {config!r}: {text!r}; {replay()}"
    print(f"{compiled} of {CEL_CASES} random queries compiled ({resub} into several automata); {total} witnesses")
    assert compiled >= CEL_CASES // 2, f"only {compiled} of {CEL_CASES} random queries compiled"
    assert total > 0 and skipped < compiled * CEL_STREAMS // 5


# --------------------------------------------------------------------------- 3. original AIR vs our CEL

@pytest.mark.parametrize("name,paths", pairs(), ids=lambda x: str(x))
def test_original_air_and_our_compilation_agree_under_the_oracle(name, paths):
    q = compile_cel(cel_text(name), STREAMS)
    total = 0
    for seed in range(24 if LONG else 8):
        evs = cel_events(seed)
        theirs = Oracle()
        mine = Oracle()
        for o in (theirs, mine):
            for s in STREAMS.values():
                o.declare(s.name, tuple((a.name, a.type) for a in s.attributes))
        for p in paths:
            theirs.add(read_air(p.read_text()), owner="orig")
        for auto in q.automata:
            mine.add(read_air(dump_air(auto)), owner="ours")
        out = q.outputs[-1]
        a = Counter((w.values, w.t0, w.t1) for w in theirs.run(evs) if w.stream == out)
        b = Counter((w.values, w.t0, w.t1) for w in mine.run(evs) if w.stream == out)
        assert a == b, f"seed {seed}"
        total += sum(a.values())
    assert total > 0  # the comparison is not vacuous


def test_dump_then_oracle_read_is_faithful_on_the_corpus():
    """The oracle reads the product's AIR writing and the original files alike:
    the original file run directly and after the product's load/dump round trip
    agree (the CEL checks above depend on reading dumped AIR)."""
    evs = cel_events(3)
    for _, paths in pairs():
        a, b = Oracle(), Oracle()
        for o in (a, b):
            for s in STREAMS.values():
                o.declare(s.name, tuple((x.name, x.type) for x in s.attributes))
        for p in paths:
            a.add(read_air(p.read_text()), owner="q")
            b.add(read_air(dump_air(load_air(p.read_text()))), owner="q")
        assert Counter(a.run(evs)) == Counter(b.run(evs)), paths
