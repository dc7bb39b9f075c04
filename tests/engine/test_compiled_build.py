"""Both builds of the engine pass the same suites.

``pip install`` compiles the engine where a C compiler exists (setup.py), so
this run normally uses the compiled build; here the engine, CEL, benchmark,
server, Spark and ``cayuga run`` suites run once more against the *other*
build: the pure-Python one (``CAYUGA_ENGINE=python``, same tree), or, in a tree
installed without a compiler, a compiled copy built with ``cayuga
build-engine``'s code (never in this tree). Which build a suite ran is checked,
not assumed (CAYUGA_EXPECT_ENGINE in tests/conftest.py). A compiled module
built from other sources than those beside it is not used."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple
from xml.etree import ElementTree

import pytest

from air.engine import BUILD
from air.engine import build as engine_build
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parents[2]
SUITES = ["tests/engine", "tests/cel", "tests/bench", "tests/server", "tests/spark", "tests/test_cli_run.py",
          "tests/test_user_functions.py"]
#: Suites of parts the engine build does not reach (the journal, the witness log, acknowledged
#: sends, resuming watchers, a full disk, HTTP connection limits, cayuga send, and the kill -9 and
#: recovery tests of them all, whose engine side tests/engine/test_engine_state.py runs on both
#: builds): run once, by the main run.
NOT_ENGINE = ["tests/server/test_journal.py", "tests/server/test_witlog.py", "tests/server/test_acks.py",
              "tests/server/test_resume.py", "tests/server/test_crash.py", "tests/server/test_recovery_property.py",
              "tests/server/test_diskfull.py", "tests/server/test_diskfull_serve.py",
              "tests/server/test_http_limits.py", "tests/server/test_send_cli.py"]
#: SUITES in two nested runs side by side, of about the same length: one alone used 0.5-0.8 of the
#: machine's two cores (its tests wait on the servers and workers they start) for 11-16 minutes, the
#: longest test of the suite (BENCHMARKS.md, "The test suite, run by run"). The second takes the
#: server's suites named here, the first the rest of them; every Spark test is in the second (one
#: Spark session at a time). Their times in the nested run of 2026-12-07, seconds: the server's 508
#: (these five 148: the first two were one file then), Spark 122, the engine's 36, the benchmarks' 34, the rest 15.
SERVER_SECOND = ["tests/server/test_worker_restart.py", "tests/server/test_worker_silent.py",
                 "tests/server/test_names.py", "tests/server/test_hostile.py", "tests/server/test_end_to_end.py"]
PARTS = [["tests/server"],
         [*SERVER_SECOND, *(s for s in SUITES if s != "tests/server")]]


def _run(args, cwd, timeout, **env):
    base = {k: v for k, v in os.environ.items() if k not in ("CAYUGA_ENGINE", "CAYUGA_EXPECT_ENGINE")}
    return subprocess.run(args, cwd=cwd, env={**base, **env}, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def compiled_tree(tmp_path_factory) -> Path:
    """A source tree with the compiled modules: this one, or else a copy built here."""
    if BUILD == "compiled":
        return ROOT
    if not (shutil.which("cc") or shutil.which("gcc")):
        unavailable("no C compiler on this machine: the compiled build cannot be made here")
    dst = tmp_path_factory.mktemp("compiled")
    skip = shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", ".hypothesis", ".pytest_cache")
    for d in ("air", "server", "clients", "tests", "examples"):
        shutil.copytree(ROOT / d, dst / d, ignore=skip)
    for f in ("pyproject.toml",):
        shutil.copy2(ROOT / f, dst / f)
    r = _run([sys.executable, "-c", "from air.engine.build import build; print(*build(), sep='\\n')"],
             dst, 900)
    assert r.returncode == 0, r.stdout + r.stderr
    return dst


def _build_of(tree: Path, **env) -> str:
    r = _run([sys.executable, "-W", "error::RuntimeWarning", "-c", "import air.engine as e; print(e.BUILD)"],
             tree, 60, **env)
    return r.stdout.strip() if r.returncode == 0 else r.stderr.strip().splitlines()[-1]


def test_the_compiled_tree_runs_compiled_unless_told_otherwise(compiled_tree):
    assert _build_of(compiled_tree) == "compiled"
    assert _build_of(compiled_tree, CAYUGA_ENGINE="python") == "python"


def test_compiled_events_are_outside_the_cyclic_collector(compiled_tree):
    """Compiled, an Event is made untracked (no_gc: it holds atoms only) and from a freelist;
    the plain-Python class is unchanged (the decorators do nothing there)."""
    probe = ("import gc, air.engine as e; ev = e.Event('S', (1, 'x'), 0, 1); "
             "print(e.BUILD, gc.is_tracked(ev), bool(type(ev).__flags__ & (1 << 14)), ev == e.Event('S', (1, 'x'), 0, 1))")
    compiled = _run([sys.executable, "-c", probe], compiled_tree, 60)
    plain = _run([sys.executable, "-c", probe], compiled_tree, 60, CAYUGA_ENGINE="python")
    assert compiled.stdout.split() == ["compiled", "False", "False", "True"], compiled.stderr
    assert plain.stdout.split() == ["python", "True", "True", "True"], plain.stderr


def test_compiled_emissions_are_the_named_tuples_tuple_new_makes(compiled_tree):
    """Compiled, the engine allocates each witness's ``Emission`` and fills it (runtime.pxd's
    ``_new_emission``): the same type, items, equality, hash and collector tracking as
    ``tuple.__new__`` gives, in both builds, and its ``Event`` as the type's call makes it."""
    probe = ("import gc, air.engine as e; from air.model import StreamSchema, Attribute; "
             "from air.cel import compile_cel; out = []; eng = e.Engine(on_emit=out.append); "
             "s = StreamSchema('S', (Attribute('A', 'int'),)); eng.declare(s); "
             "eng.add(tuple(compile_cel('SELECT * FROM S PUBLISH T', {'S': s}, name_prefix='q').automata), 'q'); "
             "eng.feed(e.Event('S', (7,), 1, 1)); eng.flush(); em, = out; "
             "want = tuple.__new__(e.Emission, tuple(em)); "
             "print(e.BUILD, type(em) is e.Emission, em == want, hash(em) == hash(want) == hash(tuple(em)), "
             "gc.is_tracked(em), em.kind, em.owner, em.event == e.Event(em.stream, (7,), 1, 1), len(em))")
    for env, build in (({}, "compiled"), ({"CAYUGA_ENGINE": "python"}, "python")):
        r = _run([sys.executable, "-c", probe], compiled_tree, 60, **env)
        assert r.stdout.split() == [build, "True", "True", "True", "True", "OUT", "q", "True", "4"], r.stderr


def _copy_engine(compiled_tree: Path, dst: Path) -> Path:
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(compiled_tree / "air", dst / "air", ignore=skip)
    return dst / "air" / "engine"


def test_a_compiled_module_built_from_other_sources_is_not_used(compiled_tree, tmp_path):
    engine = _copy_engine(compiled_tree, tmp_path / "changed")
    assert (engine / engine_build.STAMP).exists()
    src = engine / "runtime.py"
    src.write_text(src.read_text() + "\n# changed after the build\n")
    assert engine_build.stale("runtime", engine) and not engine_build.stale("network", engine)
    assert "built from older sources" in _build_of(tmp_path / "changed")  # the warning, made an error by -W
    r = _run([sys.executable, "-c", "import air.engine as e; print(e.BUILD)"], tmp_path / "changed", 60)
    assert r.stdout.strip() == "python" and "cayuga build-engine" in r.stderr


def test_installed_files_in_any_order_of_time_are_not_stale(compiled_tree, tmp_path):
    """pip gives each file of a wheel the time it was unpacked: the sources may
    look newer than the modules compiled from them. The digests decide."""
    engine = _copy_engine(compiled_tree, tmp_path / "installed")
    later = time.time() + 10
    for p in engine.glob("*.py"):
        os.utime(p, (later, later))
    assert _build_of(tmp_path / "installed") == "compiled"
    (engine / engine_build.STAMP).unlink()  # without digests (an older build): by age
    assert engine_build.stale("runtime", engine)


class Nested(NamedTuple):
    """What a nested pytest run did, from its JUnit XML report (not from its last lines)."""
    returncode: int
    tail: str
    tests: int
    failures: int
    errors: int
    skipped: list[str]  # "test id: reason", one per skipped test

    def report(self) -> str:
        lines = [f"nested run: {self.tests} tests, {self.failures} failed, {self.errors} errors, "
                 f"{len(self.skipped)} skipped"]
        return "\n".join(lines + [f"  skipped {s}" for s in self.skipped])

    def problems(self) -> list[str]:
        """Why the run does not show that the suites pass: it failed, ran nothing, or
        skipped a test (none of the suites it runs skips, but for a missing capability:
        a compiled engine, a C compiler, root; each skip would hide that)."""
        out = []
        if self.returncode != 0 or self.failures or self.errors:
            out.append(f"it failed (exit status {self.returncode})")
        if self.tests == 0:
            out.append("it ran no test")
        if self.skipped:
            out.append(f"it skipped {len(self.skipped)} tests, each hiding what it would have checked")
        return out


def nested_pytest(args: list[str], tree: Path, timeout: float, **env) -> Nested:
    """``python -m pytest args`` in ``tree``, counted from its JUnit XML report."""
    with tempfile.TemporaryDirectory(prefix="cayuga-nested-") as tmp:
        junit = Path(tmp) / "junit.xml"
        r = _run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={junit}",
                  *args], tree, timeout, **env)
        tail = (r.stdout + r.stderr)[-4000:]
        if not junit.exists():
            return Nested(r.returncode, tail, 0, 0, 0, [])
        root = ElementTree.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    count = lambda attr: sum(int(suite.get(attr, 0)) for suite in suites)  # noqa: E731
    skipped = [f"{case.get('classname')}::{case.get('name')}: {skip.get('message')}"
               for case in root.iter("testcase") for skip in case.findall("skipped")]
    return Nested(r.returncode, tail, count("tests"), count("failures"), count("errors"), skipped)


def test_the_suites_pass_against_the_other_build(compiled_tree):
    if BUILD == "compiled":  # this run is compiled: the suites again in plain Python
        tree, env = ROOT, {"CAYUGA_ENGINE": "python", "CAYUGA_EXPECT_ENGINE": "python"}
    else:
        tree, env = compiled_tree, {"CAYUGA_EXPECT_ENGINE": "compiled"}
    ignored = ["tests/engine/test_compiled_build.py", "tests/engine/test_builds_agree.py", *NOT_ENGINE]
    args = [["-x", *part, *[f"--ignore={p}" for p in ignored + (SERVER_SECOND if i == 0 else [])]]
            for i, part in enumerate(PARTS)]  # (the first leaves the second's server suites out: each runs once)
    with ThreadPoolExecutor(len(PARTS)) as pool:  # also PYTHONPATH for the processes the suites start
        runs = list(pool.map(lambda a: nested_pytest(a, tree, 1800, **env, PYTHONPATH=str(tree)), args))
    problems = []
    for part, run in zip(PARTS, runs):
        print(f"{' '.join(part)}: {run.report()}")
        problems += [f"{' '.join(part)}: {p}\n{run.report()}\n{run.tail}" for p in run.problems()]
    assert not problems, "\n".join(problems)
