"""Liveness and readiness (issue 25): /health reports everything and answers
200 (503 only while draining); the probes answer 503 where they fail --
/readyz while the server starts, drains or is degraded, /livez only when the
engine thread is gone (a restart would help)."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from clients.testing import wait_until
from tests.server.conftest import stock


class _EngineDies(BaseException):
    """Not an Exception: nothing on the engine thread catches it."""


def _probe(base: str, path: str) -> tuple[int, dict]:
    r = httpx.get(base + path, timeout=10)
    return r.status_code, r.json()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's death is the subject
def test_a_running_server_is_alive_and_ready_until_its_engine_thread_dies(start_server):
    srv = start_server()
    assert _probe(srv.base_url, "/livez") == (200, {"status": "alive"})
    assert _probe(srv.base_url, "/readyz") == (200, {"status": "ok", "reason": None})

    def die(eng):
        raise _EngineDies()

    srv.daemon.submit(die)
    wait_until(lambda: not srv.daemon.engine_alive, 10, "the engine thread to die")
    code, body = _probe(srv.base_url, "/livez")
    assert code == 503 and body == {"status": "dead", "reason": "the engine thread is not running"}
    code, body = _probe(srv.base_url, "/readyz")
    assert code == 503 and body["status"] == "degraded"
    code, body = _probe(srv.base_url, "/health")
    assert code == 200 and body["status"] == "degraded" and body["engine_thread"] is False


def test_a_stalled_queue_is_not_ready_but_alive(start_server):
    """At the shipped threshold (STALL_SECONDS, not patched: the other tests of a
    stall shorten it): a full queue that released nothing for that long."""
    from server.observability.health import STALL_SECONDS

    srv = start_server(queue_capacity=10, max_future=3600)
    soon = int(time.time() * 1000) + 1_800_000
    r = httpx.post(srv.base_url + "/events", json=[stock("IBM", 1.0, 1, soon)] * 10, timeout=10)
    assert r.status_code == 202
    # (the timeout only bounds a hang: the stall is due STALL_SECONDS after the queue last released)
    wait_until(lambda: _probe(srv.base_url, "/readyz")[0] == 503, STALL_SECONDS + 60, "readyz to fail")
    code, body = _probe(srv.base_url, "/readyz")
    assert body["status"] == "degraded" and body["reason"].startswith("the event queue is full (10 events)")
    idle = int(re.search(r"none has left for (\d+) s", body["reason"]).group(1))
    assert idle >= STALL_SECONDS and "the next event is due in" in body["reason"]
    assert _probe(srv.base_url, "/livez") == (200, {"status": "alive"})
