"""The optional compiled engine (``cayuga build-engine``, server/engine/build.py)
gives exactly the results of the plain-Python one.

The compiled modules are built in a copy of the source (never in this tree, so
the rest of this run stays plain Python), then the engine, CEL, benchmark,
server, Spark and ``cayuga run`` suites run there against them: every
switch-equivalence, conformance and golden-witness test of those suites checks
the compiled build too. Which build a suite ran is checked, not assumed
(CAYUGA_EXPECT_ENGINE in tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.engine import build as engine_build

ROOT = Path(__file__).resolve().parents[2]
SUITES = ["tests/engine", "tests/cel", "tests/bench", "tests/server", "tests/spark", "tests/test_cli_run.py",
          "tests/test_user_functions.py"]


def _run(args, cwd, timeout, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("CAYUGA_ENGINE", "CAYUGA_EXPECT_ENGINE")}
    return subprocess.run(args, cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def compiled_tree(tmp_path_factory) -> Path:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on this machine: the compiled build cannot be made here")
    dst = tmp_path_factory.mktemp("compiled")
    skip = shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", ".hypothesis", ".pytest_cache")
    for d in ("air", "server", "clients", "bench", "tests", "examples"):
        shutil.copytree(ROOT / d, dst / d, ignore=skip)
    for f in ("pyproject.toml", "config.yaml"):
        shutil.copy2(ROOT / f, dst / f)
    r = _run([sys.executable, "-c", "from server.engine.build import build; print(*build(), sep='\\n')"],
             dst, 900)
    assert r.returncode == 0, r.stdout + r.stderr
    return dst


def _build_of(tree: Path, **env) -> str:
    r = _run([sys.executable, "-W", "error::RuntimeWarning", "-c", "import server.engine as e; print(e.BUILD)"],
             tree, 60, **env)
    return r.stdout.strip() if r.returncode == 0 else r.stderr.strip().splitlines()[-1]


def test_the_copy_runs_compiled_unless_told_otherwise(compiled_tree):
    assert _build_of(compiled_tree) == "compiled"
    assert _build_of(compiled_tree, CAYUGA_ENGINE="python") == "python"


def test_a_compiled_module_older_than_its_source_is_not_used(compiled_tree, tmp_path):
    tree = tmp_path / "stale"
    shutil.copytree(compiled_tree / "server", tree / "server")
    shutil.copytree(compiled_tree / "air", tree / "air")
    src = tree / "server" / "engine" / "runtime.py"
    later = time.time() + 10
    os.utime(src, (later, later))
    assert engine_build.stale("runtime", src.parent)
    assert "older than its source" in _build_of(tree)  # the warning, made an error by -W
    r = _run([sys.executable, "-c", "import server.engine as e; print(e.BUILD)"], tree, 60)
    assert r.stdout.strip() == "python" and "cayuga build-engine" in r.stderr


def test_the_suites_pass_against_the_compiled_engine(compiled_tree):
    r = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *SUITES,
              "--ignore=tests/engine/test_compiled_build.py"], compiled_tree, 1800, CAYUGA_EXPECT_ENGINE="compiled",
             PYTHONPATH=str(compiled_tree))  # also for the processes the suites start (server, Spark workers)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail
