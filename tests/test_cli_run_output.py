"""`cayuga run` writes exactly what the engine emits, byte for byte, on both
builds: its block reader, its typed decoding and its batched witness encoding
against the plainest reference there is, built here line by line (each line
through the precise decoder, events sorted stably by t1, each witness encoded
on its own)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from air.formats import make_decoder, witness_bytes, LineError
from clients.offline import BLOCK, load_engine
from clients.testing import STOCK, random_walk
from tests.conftest import AIR_DIR, ROOT

QUERIES = ROOT / "clients" / "bench" / "queries"
STOCK_DECL = "Stock(Name string, Price float, Volume int)"


def _line(ev) -> bytes:
    name, price, volume = ev.values
    return (f'{{"stream": "Stock", "t0": {ev.t0}, "t1": {ev.t1}, "Name": "{name}", "Price": {price!r}, '
            f'"Volume": {volume}}}').encode()


def _events_file(path: Path) -> None:
    """Ticks with what a real file brings: blank lines, CRLF, bad lines,
    lenient values, escapes, a line longer than a read block, times out of
    order, and no newline at the end."""
    rng = random.Random(7)
    lines = [_line(ev) for ev in random_walk(12, 6000, seed=3, down=0.05, up=0.06)]
    odd = [b"", b"   \t", b"not json", b'{"stream": "Nope", "t1": 1}',
           b'{"stream": "Stock", "t0": 9, "t1": 4, "Name": "X", "Price": 1.0, "Volume": 1}',
           b'{"stream": "Stock", "t1": 30, "Name": "S00001", "Price": "1.5", "Volume": "7"}',
           b'{"stream": "Stock", "t1": 31, "Name": "S00002", "Price": NaN, "Volume": 1}',
           b'{"stream": "Stock", "t1": 32, "Name": "S00002", "Price": 1.0, "Volume": 1}{"stream": "Stock"}',
           b'{"stream": "Stock", "t1": 33, "Name": "S0\\u00e9\\"\\n", "Price": 2.0, "Volume": 1}\r',
           b'\t{"stream": "Stock", "t1": 34.5, "Name": "S00003", "Price": 3.0, "Volume": 2}']
    for i in sorted(rng.sample(range(len(lines)), 60), reverse=True):
        lines.insert(i, rng.choice(odd))
    big = b'{"stream": "Stock", "t0": 2000, "t1": 2000, "Name": "' + b"L" * (BLOCK + 4321) + \
        b'", "Price": 1.0, "Volume": 3}'
    lines.insert(2500, big)
    tail = lines[4000:4300]
    rng.shuffle(tail)  # out of t1 order: cayuga run sorts, stably
    lines[4000:4300] = tail
    path.write_bytes(b"\n".join(lines))


def _reference(path: Path, queries: list[str], include_resub: bool) -> tuple[bytes, list[str]]:
    engine, _ = load_engine([STOCK], queries)
    decoder = make_decoder("jsonl", engine.schema)
    events, rejected = [], []
    for n, line in enumerate(path.read_bytes().split(b"\n"), 1):
        try:
            ev = decoder.decode(line.rstrip(b"\r"))
        except LineError as exc:
            rejected.append(f"{path}:{n}: rejected: {exc}")
            continue
        if ev is not None:
            events.append(ev)
    events.sort(key=lambda e: e.t1)
    out = b"".join(witness_bytes(em.stream, em.event, engine.schema(em.stream)) + b"\n"
                   for em in engine.run(events) if em.kind == "OUT" or include_resub)
    return out, rejected


def _cayuga_run(path: Path, queries: list[str], out: Path, include_resub: bool, build: str):
    env = {k: v for k, v in os.environ.items() if k != "CAYUGA_ENGINE"}
    if build == "python":
        env["CAYUGA_ENGINE"] = "python"
    args = [sys.executable, "-m", "clients.cli", "run", "--stream", STOCK_DECL, "--events", str(path),
            "--output", str(out)]
    for q in queries:
        args += ["--query", q]
    if include_resub:
        args.append("--include-resub")
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


@pytest.mark.parametrize("queries, include_resub", [
    ([str(QUERIES / "rising.cel"), str(QUERIES / "all.cel"), str(QUERIES / "mshape.cel")], False),
    ([str(AIR_DIR / "94.xml"), str(QUERIES / "rising.cel")], True),
])
@pytest.mark.parametrize("build", ["compiled", "python"])
def test_cayuga_run_output_is_the_engines_witnesses_byte_for_byte(tmp_path, queries, include_resub, build):
    events = tmp_path / "events.jsonl"
    _events_file(events)
    expected, rejected = _reference(events, queries, include_resub)
    assert len(rejected) > 20 and expected.count(b"\n") > 1000  # the file does exercise both
    out = tmp_path / "witnesses.jsonl"
    r = _cayuga_run(events, queries, out, include_resub, build)
    assert r.returncode == 1, r.stderr  # some lines were rejected
    assert out.read_bytes() == expected
    assert [x for x in r.stderr.splitlines() if ": rejected: " in x] == rejected


def test_every_kind_of_source_decodes_to_the_same_events_and_rejections(tmp_path):
    """decode_file takes a binary file (read in blocks), a text file, or lines
    with or without their newlines: the same events, the same rejected lines."""
    from clients.offline import RunResult, decode_file

    path = tmp_path / "events.jsonl"
    _events_file(path)
    raw = path.read_bytes()
    lines = raw.split(b"\n")

    def decode(source):
        result = RunResult()
        events = decode_file(source, "jsonl", {"Stock": STOCK}.get, result, names=["Stock"])
        return events, [(r.line, r.text, r.reason) for r in result.rejected]

    with open(path, "rb") as fh:
        expected = decode(fh)
    assert len(expected[0]) > 5000 and len(expected[1]) > 20
    with open(path, encoding="utf-8", newline="") as fh:
        assert decode(fh) == expected
    assert decode(lines) == expected
    assert decode([line + b"\n" for line in lines[:-1]] + [lines[-1]]) == expected
    assert decode([line.decode() for line in lines]) == expected
