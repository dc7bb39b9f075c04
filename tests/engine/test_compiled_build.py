"""Both builds of the engine pass the same suites.

``pip install`` compiles the engine where a C compiler exists (setup.py), so
this run normally uses the compiled build; here the engine, CEL, benchmark,
server, Spark and ``cayuga run`` suites run once more against the *other*
build: the pure-Python one (``CAYUGA_ENGINE=python``, same tree), or, in a tree
installed without a compiler, a compiled copy built with ``cayuga
build-engine``'s code (never in this tree). Which build a suite ran is checked,
not assumed (CAYUGA_EXPECT_ENGINE in tests/conftest.py). A compiled module
older than its source is not used."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.engine import BUILD
from server.engine import build as engine_build

ROOT = Path(__file__).resolve().parents[2]
SUITES = ["tests/engine", "tests/cel", "tests/bench", "tests/server", "tests/spark", "tests/test_cli_run.py",
          "tests/test_user_functions.py"]


def _run(args, cwd, timeout, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("CAYUGA_ENGINE", "CAYUGA_EXPECT_ENGINE")}
    return subprocess.run(args, cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def compiled_tree(tmp_path_factory) -> Path:
    """A source tree with the compiled modules: this one, or else a copy built here."""
    if BUILD == "compiled":
        return ROOT
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


def test_the_compiled_tree_runs_compiled_unless_told_otherwise(compiled_tree):
    assert _build_of(compiled_tree) == "compiled"
    assert _build_of(compiled_tree, CAYUGA_ENGINE="python") == "python"


def test_a_compiled_module_older_than_its_source_is_not_used(compiled_tree, tmp_path):
    tree = tmp_path / "stale"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(compiled_tree / "server", tree / "server", ignore=skip)
    shutil.copytree(compiled_tree / "air", tree / "air", ignore=skip)
    src = tree / "server" / "engine" / "runtime.py"
    later = time.time() + 10
    os.utime(src, (later, later))
    assert engine_build.stale("runtime", src.parent)
    assert "older than its source" in _build_of(tree)  # the warning, made an error by -W
    r = _run([sys.executable, "-c", "import server.engine as e; print(e.BUILD)"], tree, 60)
    assert r.stdout.strip() == "python" and "cayuga build-engine" in r.stderr


def test_the_suites_pass_against_the_other_build(compiled_tree):
    if BUILD == "compiled":  # this run is compiled: the suites again in plain Python
        tree, env = ROOT, {"CAYUGA_ENGINE": "python", "CAYUGA_EXPECT_ENGINE": "python"}
    else:
        tree, env = compiled_tree, {"CAYUGA_EXPECT_ENGINE": "compiled"}
    r = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *SUITES,
              "--ignore=tests/engine/test_compiled_build.py", "--ignore=tests/engine/test_builds_agree.py"],
             tree, 1800, **env, PYTHONPATH=str(tree))  # also for the processes the suites start (server, Spark)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail
