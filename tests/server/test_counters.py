"""Counters are named (server/observability/counters.py): a misspelt one fails where it is used."""

from __future__ import annotations

import threading

import pytest

from server.observability.counters import CLIENT_DROPS, HTTP_CONN_REFUSED, TCP_REFUSED, Count, Counters


def test_a_misspelt_counter_fails_instead_of_reading_zero():
    c = Counters()
    c.add(Count.RECEIVED_TCP, 3)
    assert c.get(Count.RECEIVED_TCP) == 3
    with pytest.raises(KeyError, match="not a counter"):
        c.get("recieved_tcp")  # a string key, misspelt: once it read 0 and a metric stayed flat
    with pytest.raises(KeyError, match="not a counter"):
        c.add("received_tcp")  # nor a string that happens to be right: only Count members
    with pytest.raises(AttributeError):
        c.add(Count.RECIEVED_TCP)  # noqa - the misspelt member itself
    assert c.snapshot()[Count.RECEIVED_TCP] == 3 and c.snapshot()[Count.ENGINE_ERRORS] == 0


def test_every_label_of_a_counter_family_has_its_counter():
    assert TCP_REFUSED["idle"] is Count.TCP_REFUSED_IDLE and set(TCP_REFUSED) == {
        "max_connections", "per_address", "idle", "auth"}
    assert set(HTTP_CONN_REFUSED) == {"header_timeout", "body_timeout", "evicted", "max_connections", "websockets",
                                      "websockets_per_address", "request_too_large"}
    assert CLIENT_DROPS["disconnect"] is Count.DROP_DISCONNECT
    assert len({m.value for m in Count}) == len(Count)  # no two counters share a key


def test_counters_add_up_across_threads():
    c = Counters()

    def bump():
        for _ in range(10_000):
            c.add(Count.DELIVERED)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert c.get(Count.DELIVERED) == 40_000
