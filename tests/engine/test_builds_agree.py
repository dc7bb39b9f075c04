"""Both builds of the engine, in the same run, on the same random automata and
streams: exactly the same witnesses in the same order, under every switch
combination. The compiled build is the one `pip install` makes where a C
compiler exists; CAYUGA_ENGINE=python runs the pure-Python one from the same
source (tests/engine/builds_probe.py runs in a child process per build)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from air.engine import build as engine_build
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]


def _probe(seed: int, n: int, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("CAYUGA_ENGINE", "CAYUGA_EXPECT_ENGINE")}
    r = subprocess.run([sys.executable, "-m", "tests.engine.builds_probe", str(seed), str(n)], cwd=ROOT,
                       env={**base, **env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("seed", [1, 4, 5])  # seeds whose cases stay small (some explode combinatorially)
def test_compiled_and_python_builds_give_the_same_witnesses(seed):
    if not all(engine_build.compiled_paths(m) for m in engine_build.MODULES):
        unavailable("this tree has no compiled engine (installed without a C compiler; `cayuga build-engine` "
                    "makes one); test_compiled_build.py builds one in a copy and runs the suites against it")
    compiled = _probe(seed, 40)
    python = _probe(seed, 40, CAYUGA_ENGINE="python")
    assert (compiled["build"], python["build"]) == ("compiled", "python")
    assert sum(len(w) for case in compiled["cases"] for w in case.values()) > 100  # the cases do match
    assert compiled["cases"] == python["cases"]
