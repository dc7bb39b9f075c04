"""Shared fixtures: the conformance corpus, the Stock schema, stream generators."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from air.airxml import load_air
from air.model import parse_stream_decl
from server.engine import BUILD, Engine, Event

TESTS = Path(__file__).parent
ROOT = TESTS.parent
CONFORMANCE = TESTS / "conformance"  # a copy of ../shared/conformance (see its README)
AIR_DIR = CONFORMANCE / "air"
CEL_DIR = CONFORMANCE / "cel"
GOLDEN = TESTS / "golden"


def pytest_report_header(config):
    return f"cayuga engine build: {BUILD}"


def pytest_configure(config):
    # tests/engine/test_compiled_build.py runs suites with this set, so that a
    # build that silently fell back to plain Python cannot pass for the compiled one
    want = os.environ.get("CAYUGA_EXPECT_ENGINE")
    if want and want != BUILD:
        raise pytest.UsageError(f"CAYUGA_EXPECT_ENGINE={want}, but the engine build is {BUILD}")


STOCK = parse_stream_decl("Stock(Name string, Price float, Volume int)")
IBMSTOCK = parse_stream_decl("IBMStock(IBMPrice float)")

#: AIR files that read another file's output: load the publisher first.
PUBLISHERS = {"LONG_MONOTONIC_INC.xml": ["94.xml"], "IBM_MSFT_PAIR.xml": ["IBMStock.xml"],
              "IBM_OTHER_PAIR.xml": ["IBMStock.xml"]}


def air(name: str):
    return load_air((AIR_DIR / name).read_text(), name=Path(name).stem)


def engine_with(*files: str, declare=(STOCK,)) -> Engine:
    eng = Engine()
    for s in declare:
        eng.declare(s)
    for f in files:
        eng.add(air(f), owner=Path(f).stem)
    return eng


def stock_stream(seed: int, n: int = 40, names=("IBM", "MSFT", "Dell"), max_gap: int = 2,
                 long_names: bool = False, max_dur: int = 0) -> list[Event]:
    """A random Stock stream with many simultaneous events (gap 0 is common);
    with ``max_dur`` some events are intervals of up to that length."""
    rng = random.Random(seed)
    t = 0
    out = []
    pool = list(names) + (["IBM Corporation International", "IBM Corporation Internationals"]
                          if long_names else [])
    for _ in range(n):
        t += rng.randint(0, max_gap)
        name = rng.choice(pool)
        price = float(rng.choice([60, 80, 83, 85, 90, 99, 100, 101, 150, 201, 250]) + rng.choice([0, 0.5]))
        vol = rng.choice([100, 400, 500, 7000, 12000])
        dur = rng.choice([0, 0, rng.randint(0, max_dur)]) if max_dur else 0
        out.append(Event("Stock", (name, price, vol), t - dur, t))
    return out


@pytest.fixture
def stock():
    return STOCK
