"""Shared fixtures: the conformance corpus, the Stock schema, stream generators;
the Hypothesis profiles every property test and fuzzer runs under.

Hypothesis profiles (``CAYUGA_HYPOTHESIS_PROFILE``; default ``ci`` when
``CI=true``, else ``dev``; ``--hypothesis-profile`` overrides both):

- ``ci``: a bounded number of examples for a 2-core machine;
- ``dev``: Hypothesis' usual 100 examples;
- ``long``: the long fuzzing campaign (RELIABILITY.md), thousands of examples.

The profile decides how many examples every property test runs: a test
takes ``@settings(examples(scale))`` (below), the profile's number times its
scale, never a fixed number, so ``long`` is long for every test. A scale says
how a test's examples cost next to a typical one's: 3 for a cheap test,
below 1 for one whose examples start a server or a child process.

No profile is derandomized and none has a deadline (a wall-clock limit is
flaky on a busy machine). Each run draws a fresh seed unless
``--hypothesis-seed=N`` is given; the profile and seed are printed in the
report header and again after a failing run, and ``--hypothesis-profile=P
--hypothesis-seed=N`` replays that run (the database is not used when a seed
is given: the seed alone decides the examples).
"""

from __future__ import annotations

import os
import random
import secrets
from pathlib import Path
from typing import NoReturn

import pytest
from hypothesis import HealthCheck, settings

from air.airxml import load_air
from air.engine import BUILD, Engine, Event
from air.model import parse_stream_decl

TESTS = Path(__file__).parent
ROOT = TESTS.parent
CONFORMANCE = TESTS / "conformance"  # a copy of ../shared/conformance (see its README)
AIR_DIR = CONFORMANCE / "air"
CEL_DIR = CONFORMANCE / "cel"
GOLDEN = TESTS / "golden"


#: too_slow is a wall-clock check (flaky on 2 busy cores); function_scoped_fixture:
#: the fuzzers' servers are module fixtures, shared across examples on purpose.
_QUIET = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=50, deadline=None, derandomize=False, print_blob=True,
                          suppress_health_check=_QUIET)
settings.register_profile("dev", max_examples=100, deadline=None, derandomize=False, print_blob=True,
                          suppress_health_check=_QUIET)
settings.register_profile("long", max_examples=3000, deadline=None, derandomize=False, print_blob=True,
                          suppress_health_check=_QUIET)
PROFILES = ("ci", "dev", "long")


def hypothesis_profile_name() -> str:
    """The profile chosen by the environment (see the module docstring)."""
    name = os.environ.get("CAYUGA_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")
    if name not in PROFILES:
        raise pytest.UsageError(f"CAYUGA_HYPOTHESIS_PROFILE={name!r}: use one of {', '.join(PROFILES)}")
    return name


# loaded on import, not in pytest_configure: pytest imports the conftest.py of the
# directories named on its command line (tests/fuzz/) before it configures, and
# their module-level settings must see this profile
settings.load_profile(hypothesis_profile_name())


def examples(scale: float = 1.0, **kw) -> settings:
    """Settings for one property test: the loaded profile's ``max_examples`` times
    ``scale`` (at least 1); ``scale`` is relative to ``dev``'s 100, so 3 means 300
    examples under ``dev``, 150 under ``ci`` and 9000 under ``long``. Call it in
    the test module (collected after ``--hypothesis-profile`` is loaded), not in a
    conftest.py (tests/fuzz/conftest.py says why). Other settings in ``kw``."""
    return settings(max_examples=max(1, round(settings.default.max_examples * scale)), **kw)


def _hypothesis_run(config) -> str:
    """The profile and seed of this run, and the options that replay it."""
    profile, seed = settings.get_current_profile_name(), config.getoption("hypothesis_seed")
    return (f"hypothesis: profile {profile!r}, seed {seed} (replay this run with "
            f"--hypothesis-profile={profile} --hypothesis-seed={seed})")


def pytest_report_header(config):
    return [f"cayuga engine build: {BUILD}", _hypothesis_run(config)]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if exitstatus not in (0, 5):  # 5: nothing collected
        terminalreporter.write_line(_hypothesis_run(config))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # before Hypothesis' own pytest plugin configures: it then forces this seed on
    # every test (and loads --hypothesis-profile, if given, over the variable's)
    if config.getoption("hypothesis_seed") is None:
        config.option.hypothesis_seed = str(secrets.randbits(32))
    # tests/engine/test_compiled_build.py runs suites with this set, so that a
    # build that silently fell back to plain Python cannot pass for the compiled one
    want = os.environ.get("CAYUGA_EXPECT_ENGINE")
    if want and want != BUILD:
        raise pytest.UsageError(f"CAYUGA_EXPECT_ENGINE={want}, but the engine build is {BUILD}")


def in_ci() -> bool:
    """Whether this is a CI run (``CI=true``, as .ci/run sets it)."""
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> NoReturn:
    """A test that cannot run on this machine (no root to mount a tmpfs, no
    compiled engine, no promtool, ...): skipped with ``reason``, but under
    ``CI=true`` a failure with it. .ci/run installs everything the tests need,
    so there a missing capability is a broken machine, and a test that
    vanished would hide it."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: .ci/run provides this, so it is a failure, not a skip)", pytrace=False)
    pytest.skip(f"{reason} (CI=true makes this a failure)")


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
