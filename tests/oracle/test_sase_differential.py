"""Differential fuzzing of the SASE front end against the oracle's SASE.

Random queries (tests/oracle/sase_gen.py: 2 to 5 components, negation in every
position the product accepts, ANY, equivalence tests, simple, parameterized,
OR and failing predicates, windows) on random small streams. The oracle's
brute force (tests/oracle/sase.py) says what the matches are; the product
must give exactly those (as multisets, with their t0 and t1):

1. the product's automata, written out as AIR, run by both engine builds
   (each in a child process, tests/engine/oracle_probe.py) under every engine
   switch combination (indexes, state merging), and by the AIR oracle
   (tests/oracle/machine.py): a compiler bug and an engine bug show apart;
2. a batch of the cases through a real server, with one engine worker and with two
   (``POST /subscriptions`` with
   ``{"sase": ...}``, events over REST, witnesses from the witness log) and
   through ``cayuga run --query q.sase``.

Profiles as tests/oracle/test_differential.py: quick by default (a fresh seed
each run, printed), long with ``CAYUGA_FUZZ_PROFILE=long``; replay with
``CAYUGA_FUZZ_SEED=<seed>``.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections import Counter

import pytest

from air.airxml import dump_air
from air.model import Attribute, StreamSchema
from air.sase import compile_sase
from clients.client import CayugaClient
from clients.testing import wait_until
from clients.testing.witnesses import logged_witnesses
from tests.oracle import Event, Oracle, read_air, sase_gen
from tests.oracle.sase import Sase
from tests.oracle.test_differential import LONG, ROOT, SEED, builds, probe
from tests.server.conftest import start_server  # noqa: F401  (a fixture)

CASES = 1500 if LONG else 150
THROUGH = 80 if LONG else 16  # cases through the server and cayuga run
def replay() -> str:
    return f"seed={SEED} (replay: CAYUGA_FUZZ_SEED={SEED} python -m pytest tests/oracle/test_sase_differential.py)"


SCHEMAS = [StreamSchema(n, tuple(Attribute(a, t) for a, t in attrs)) for n, attrs in sase_gen.STREAMS.items()]


def matches_of_oracle(c: sase_gen.Case) -> Counter:
    return Counter((tuple(v), t0, t1) for v, t0, t1 in Sase(c.text, sase_gen.STREAMS).run(c.events))


def air_oracle(autos, c: sase_gen.Case, out: str) -> Counter:
    o = Oracle(max_instances=20_000)
    for name, attrs in sase_gen.STREAMS.items():
        o.declare(name, attrs)
    o.add([a for auto in autos for a in read_air(dump_air(auto))], owner="q")
    return Counter((w.values, w.t0, w.t1) for w in o.run(Event(*e) for e in c.events) if w.stream == out)


def cases(n: int, salt: int) -> list[sase_gen.Case]:
    rng = random.Random(SEED ^ salt)
    return [sase_gen.case(rng.randrange(10**9)) for _ in range(n)]


def test_random_sase_both_engine_builds_and_the_air_oracle_agree_with_the_sase_oracle():
    print(replay())
    todo, kinds = [], Counter()
    for c in cases(CASES, 0x5A5E):
        q = compile_sase(c.text, SCHEMAS, name_prefix="q")  # the generator writes only accepted queries
        want = matches_of_oracle(c)
        where = f"case seed {c.seed} (sase_gen.case({c.seed})): {c.text}"
        assert air_oracle(q.automata, c, "q") == want, f"the AIR oracle on the product's automata: {where}; {replay()}"
        todo.append((c, q, want, where))
        kinds.update(k for k, on in (("negation between", re.search(r"!\(\w+ e\d+\), \w", c.text)),
                                     ("negated end", c.text.split(" WHERE")[0].split(" WITHIN")[0].endswith("))")),
                                     ("ANY", "ANY(" in c.text), ("equivalence", "[k" in c.text),
                                     ("window", "WITHIN" in c.text), ("matches", want)) if on)
    jobs = [{"automata": ["<NFAs>\n" + "".join(dump_air(a) for a in q.automata) + "</NFAs>\n"],
             "streams": {k: [list(a) for a in v] for k, v in sase_gen.STREAMS.items()},
             "base": list(sase_gen.STREAMS), "events": [[s, list(v), t0, t1] for s, v, t0, t1 in c.events]}
            for c, q, _, _ in todo]
    total = sum(sum(w.values()) for _, _, w, _ in todo)
    for build in builds():
        for (c, q, want, where), per_config in zip(todo, probe(jobs, build)):
            for config, got in per_config.items():
                assert "error" not in got, f"{build} build, {config}: {got['error']}; {where}"
                found = Counter((tuple(w[3]), w[4], w[5]) for w in got["witnesses"] if w[1] == "q")
                assert found == want, f"{build} build, switches {config!r}, {where}; {replay()}"
    print(f"{len(todo)} queries ({dict(kinds)}), {total} matches")
    # not vacuous, whatever the seed: over 40 seeds of 150 cases, 48-79 had matches (mean 63, sd 6.4),
    # 39-61 a negation between (51, 5.6), 21-47 a negated end (29, 5.2); each floor is 5 sd below its mean
    # (a floor of a third for matches failed a CI run at 50 of 150, 2 sd below)
    assert kinds["negation between"] > len(todo) // 8 and kinds["negated end"] > len(todo) // 30
    assert kinds["matches"] > len(todo) // 5 and total > len(todo)


# --------------------------------------------------------------------------- 2. server and cayuga run


def _renamed(c: sase_gen.Case, i: int) -> tuple[str, dict, list]:
    """Case ``i`` over streams of its own (A -> A3, ...), so that many run side by side."""
    text = re.sub(r"\b([ABCD])\b", rf"\g<1>{i}", c.text)
    streams = {f"{n}{i}": attrs for n, attrs in sase_gen.STREAMS.items()}
    events = [(f"{s}{i}", v, t0, t1) for s, v, t0, t1 in c.events]
    return text, streams, events


def _batch():
    out = []
    for i, c in enumerate(cases(THROUGH, 0x5E7)):
        text, streams, events = _renamed(c, i)
        out.append((text, streams, events, matches_of_oracle(c)))
    merged = sorted((e for _, _, evs, _ in out for e in evs), key=lambda e: e[3])
    lines = [{"stream": s, "t0": t0, "t1": t1, **dict(zip([a for a, _ in streams_of(out, s)], v))}
             for s, v, t0, t1 in merged]
    return out, lines


def streams_of(batch, name):
    for _, streams, _, _ in batch:
        if name in streams:
            return streams[name]
    raise KeyError(name)


def _witness(line: dict) -> tuple:
    """A witness line (its attributes in the output's schema order) as the oracle gives a match."""
    return tuple(v for k, v in line.items() if k not in ("stream", "t0", "t1")), line["t0"], line["t1"]


@pytest.mark.parametrize("workers", [1, 2])  # (the default; and two: dealt whole or row-scaled, issue 32)
def test_random_sase_through_the_server_gives_the_oracles_matches(start_server, workers):
    server = start_server(engine_workers=workers)
    batch, lines = _batch()
    with CayugaClient(server.base_url) as client:
        for _, streams, _, _ in batch:
            for name, attrs in streams.items():
                client.declare_stream(name, dict(attrs))
        subs = [client.subscribe(sase=text) for text, _, _, _ in batch]
        outs = [client.validate(sase=text)["air"] is not None for text, _, _, _ in batch]
        assert all(outs)
        client.post_events(lines)
        want = {s["id"]: w for s, (_, _, _, w) in zip(subs, batch)}

        def done() -> bool:
            stats = client.http.get("/stats").json()
            return stats["events"] >= len(lines) and all(
                stats["subscriptions"][sid]["witnesses"] >= sum(w.values()) for sid, w in want.items())

        wait_until(done, 60, what="every event processed and every subscription's witnesses")
        for sub, (text, _, _, w) in zip(subs, batch):
            n = sum(w.values())
            got = Counter(_witness(json.loads(body)) for _, body in
                          logged_witnesses(server.base_url, sub["id"], n)) if n else Counter()
            assert got == w, f"{sub['id']}: {text}; {replay()}"
        stats = client.http.get("/stats").json()  # and nothing more came
        assert {sid: stats["subscriptions"][sid]["witnesses"] for sid in want} == \
            {sid: sum(w.values()) for sid, w in want.items()}, replay()


def test_random_sase_through_cayuga_run_gives_the_oracles_matches(tmp_path):
    batch, lines = _batch()
    args = []
    for i, (text, streams, _, _) in enumerate(batch):
        (tmp_path / f"q{i:03d}.sase").write_text(text)
        for name, attrs in streams.items():
            args += ["--stream", f"{name}({', '.join(f'{a} {t}' for a, t in attrs)})"]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = subprocess.run([sys.executable, "-m", "clients.cli", "run", *args, "--query", str(tmp_path),
                        "--events", str(tmp_path / "events.jsonl")], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    got: dict[str, Counter] = {}
    for line in r.stdout.splitlines():
        w = json.loads(line)
        got.setdefault(w["stream"], Counter())[_witness(w)] += 1
    for i, (text, _, _, want) in enumerate(batch):
        assert got.get(f"q{i:03d}", Counter()) == want, f"q{i:03d}.sase: {text}; {replay()}"
