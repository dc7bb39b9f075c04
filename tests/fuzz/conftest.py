"""The fuzzing campaign (RELIABILITY.md). Two hypothesis profiles:

- ``quick`` (the default, run by CI with the rest of the suite): a few dozen
  examples per fuzzer, seconds in all;
- ``long``: ``CAYUGA_FUZZ=long python -m pytest tests/fuzz`` -- thousands of
  examples per fuzzer and a minute of overload (about half an hour).

Every fuzzer asserts the same contract: bad input gets a clear, typed refusal
(a CayugaError, an error line, a 4xx), never a crash, a hang or a lost
neighbour. Findings become ordinary tests in tests/server/test_hostile.py.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from clients.client import CayugaClient
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, make_settings

LONG = os.environ.get("CAYUGA_FUZZ", "quick") == "long"

settings.register_profile("cayuga-fuzz-quick", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("cayuga-fuzz-long", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
#: The settings every fuzzer runs under (CAYUGA_FUZZ=long for the long campaign).
FUZZ = settings.get_profile("cayuga-fuzz-long" if LONG else "cayuga-fuzz-quick")
#: Fewer examples for fuzzers that go through a real socket.
FUZZ_NET = settings(FUZZ, max_examples=500 if LONG else 15)
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
