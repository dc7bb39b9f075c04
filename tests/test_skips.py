"""Tests that cannot run here say so, and under ``CI=true`` they fail instead
of vanishing (tests/conftest.py ``unavailable``): .ci/run installs everything
they need (root for a tmpfs, a C compiler and so the compiled engine), so a
skip there would hide a broken machine behind a green run. The nested run of
the suites against the other engine build is counted from its report, skips
included."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from air.engine import build as engine_build
from tests.engine import test_builds_agree, test_compiled_build
from tests.oracle import test_differential
from tests.server import tmpfs as tmpfs_module

SKIP, FAIL = pytest.skip.Exception, pytest.fail.Exception


def outcome(fn) -> tuple[type | None, str]:
    """How ``fn`` ended: skipped or failed (pytest's outcomes, caught here so that a
    skip where a failure is due fails this test rather than skipping it), or neither."""
    try:
        fn()
    except (SKIP, FAIL) as exc:
        return type(exc), str(exc)
    return None, ""


def mount(tmp_path):
    with tmpfs_module.tmpfs(tmp_path, "1m"):
        pass


@pytest.fixture(params=["CI=true", "no CI"])
def ci(request, monkeypatch):
    if request.param == "CI=true":
        monkeypatch.setenv("CI", "true")
        return FAIL
    monkeypatch.delenv("CI", raising=False)
    return SKIP


def test_a_tmpfs_that_cannot_be_mounted(ci, monkeypatch, tmp_path):
    refused = subprocess.CompletedProcess(["mount"], 32, "", "mount: permission denied")
    monkeypatch.setattr(tmpfs_module.subprocess, "run", lambda *a, **kw: refused)
    kind, reason = outcome(lambda: mount(tmp_path))
    assert kind is ci and "mount -t tmpfs is not permitted here: mount: permission denied" in reason
    monkeypatch.setattr(tmpfs_module.os, "geteuid", lambda: 1000)
    kind, reason = outcome(lambda: mount(tmp_path))
    assert kind is ci and "needs root" in reason


def test_no_compiled_engine_to_compare_the_builds(ci, monkeypatch):
    monkeypatch.setattr(engine_build, "compiled_paths", lambda *a, **kw: [])
    kind, reason = outcome(lambda: test_builds_agree.test_compiled_and_python_builds_give_the_same_witnesses(1))
    assert kind is ci and "no compiled engine" in reason


def test_the_differential_tests_with_only_one_build(ci, monkeypatch):
    monkeypatch.setattr(engine_build, "compiled_paths", lambda *a, **kw: [])
    builds = []
    kind, reason = outcome(lambda: builds.extend(test_differential.builds()))
    if ci is FAIL:
        assert kind is FAIL and "only the pure-Python build would be checked" in reason
    else:  # on a machine without a C compiler, the one build there is is still checked
        assert kind is None and builds == ["python"]


def test_the_nested_run_counts_its_skips(tmp_path):
    """The suites' re-run against the other build was judged by its last lines
    (" passed" and no "failed"): a run whose tests skipped passed that check."""
    (tmp_path / "test_some.py").write_text(textwrap.dedent("""
        import pytest

        def test_runs():
            pass

        def test_cannot_run_here():
            pytest.skip("no compiled engine here")
    """))
    run = test_compiled_build.nested_pytest(["test_some.py"], tmp_path, 120)
    assert (run.returncode, run.tests, run.failures, run.errors) == (0, 2, 0, 0)
    assert " passed" in run.tail and "failed" not in run.tail  # what the old check accepted
    assert [s.split("::")[-1] for s in run.skipped] == ["test_cannot_run_here: no compiled engine here"]
    assert run.problems() == ["it skipped 1 tests, each hiding what it would have checked"]
    assert "2 tests, 0 failed, 0 errors, 1 skipped" in run.report() and "no compiled engine here" in run.report()

    (tmp_path / "test_some.py").write_text("def test_fails():\n    assert False\n")
    failed = test_compiled_build.nested_pytest(["test_some.py"], tmp_path, 120)
    assert failed.failures == 1 and failed.problems() == ["it failed (exit status 1)"]
    assert test_compiled_build.nested_pytest(["no_such_dir"], tmp_path, 120).problems()  # ran nothing
