"""The fuzzing campaign (RELIABILITY.md). The fuzzers run under the
Hypothesis profile chosen in tests/conftest.py:

- ``ci`` / ``dev`` (the default, with the rest of the suite): dozens of examples
  per fuzzer, a fresh seed each run (printed in the report header);
- ``long``: ``CAYUGA_HYPOTHESIS_PROFILE=long python -m pytest tests/fuzz`` --
  thousands of examples per fuzzer and a minute of overload (about half an hour).

A failing run prints its seed; ``--hypothesis-seed=N`` replays it.

Every fuzzer states what it proves in its docstring and asserts exactly that:
bad input gets a clear, typed refusal (a CayugaError, an error line, a 4xx),
good input gets in, nothing crashes, hangs or loses a neighbour. Findings
become ordinary tests in tests/server/test_hostile.py.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from clients.client import CayugaClient
from server.serve import RunningServer
from tests.conftest import examples
from tests.server.conftest import assert_no_cayuga_threads, make_settings

#: The long campaign (CAYUGA_HYPOTHESIS_PROFILE=long; tests/conftest.py loads it first).
LONG = settings.get_current_profile_name() == "long"


def FUZZ(test):
    """What most fuzzers run under: the loaded profile as it is, when they run
    (a settings object here would freeze the profile of import time: pytest
    imports this file before ``--hypothesis-profile`` is loaded)."""
    return test


def FUZZ_NET(test):
    """Fewer examples for fuzzers that go through a real socket: a third of the
    profile's (``tests.conftest.examples``, worked out when the test module is
    imported, after the profile is loaded)."""
    return examples(1 / 3)(test)
#: Seconds of overload.
OVERLOAD_SECONDS = 60.0 if LONG else 4.0


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    """One real server for a module's fuzzers (hypothesis calls the test many times)."""
    servers: list[RunningServer] = []

    def start(**kw) -> RunningServer:
        srv = RunningServer(make_settings(tmp_path_factory.mktemp("fuzz"), **kw)).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()
    assert_no_cayuga_threads()


def healthy(base_url: str, token: str | None = None) -> dict:
    with CayugaClient(base_url, token=token) as c:
        h = c.health()
    assert h["engine_thread"] and h["engine_error"] is None, h
    return h
