"""Overload (clients/bench/overload.py drives it): a TCP sender pushes events as fast
as the socket lets them, far faster than the engine runs (a slow subscription
set makes sure of it), for OVERLOAD_SECONDS, while /health and /metrics are
polled. What it proves, whatever the machine's speed: the queue stays within
its capacity at every sample, every /health and /metrics request is answered
200 (the request timeout only bounds a hang), memory stays bounded (the queue
by its capacity, the subscriptions' instances by
max_instances_per_subscription), and nothing accepted is lost: after the
sender stops, everything received is processed. How fast they answer, and
how much faster the sender is than the engine, are figures of
``cayuga bench overload`` (RELIABILITY.md), not judged here."""

from __future__ import annotations

import json

import pytest

from clients.bench.overload import CAPACITY, INSTANCES, drive
from tests.fuzz.conftest import OVERLOAD_SECONDS


@pytest.fixture
def overload_server(fuzz_server):
    return fuzz_server(queue_capacity=CAPACITY, max_instances_per_subscription=INSTANCES)


def test_overload_keeps_memory_and_answers_bounded(overload_server):
    r = drive(overload_server, OVERLOAD_SECONDS)
    s = r["samples"]
    print("overload:", json.dumps({k: v for k, v in r.items() if k != "samples"}))
    assert s["queue"] and max(s["queue"]) <= CAPACITY
    assert set(s["status"]) == {200}
    assert r["received"] == r["processed"]  # nothing accepted was lost
    assert r["received"] > 5_000  # the overload did send
    assert max(s["rss_mb"]) - r["base_rss_mb"] < 300, r  # memory, not time: bounded by the limits
