"""The catalogue stays whole: a subscription that reads another's output
survives every restart, because the one it reads cannot be deleted alone."""

from __future__ import annotations

import pytest

from clients.client import CayugaAPIError, CayugaClient
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, collect, make_settings, stock

IBM = "SELECT Price AS IBMPrice FROM FILTER{Name = 'IBM'}(Stock) PUBLISH IBMStock"
PAIR = "SELECT IBMPrice, Price AS MSFTPrice FROM IBMStock NEXT{$2.Name = 'MSFT'}(Stock) PUBLISH Pair"
HIGH = "SELECT * FROM FILTER{MSFTPrice > 20}(Pair) PUBLISH HighPair"


def test_a_publisher_cannot_be_deleted_while_others_read_it_and_all_survive_restarts(tmp_path):
    settings = make_settings(tmp_path)
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        ibm, pair, high = (c.subscribe(cel=q) for q in (IBM, PAIR, HIGH))
        other = c.subscribe(cel="SELECT * FROM Stock PUBLISH All")
        for sid, reader in ((ibm["id"], pair["id"]), (pair["id"], high["id"])):
            with pytest.raises(CayugaAPIError) as info:
                c.unsubscribe(sid)
            assert info.value.status == 409
            assert info.value.body["readers"] == [reader]
            assert f"which {reader} reads" in info.value.body["detail"] and "?cascade=true" in info.value.body["detail"]
        c.unsubscribe(high["id"])  # nobody reads it: deleted
        c.unsubscribe(other["id"])
        high = c.subscribe(cel=HIGH)
    for k in range(2):  # restarts bring the chain back, and it runs
        base = k * 10 ** 6  # a restart goes on where the server stopped: later events have later times
        with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
            assert [s["id"] for s in c.subscriptions()] == [ibm["id"], pair["id"], high["id"]]
            with c.watch(high["id"], timeout=10) as m:
                c.post_events([stock("IBM", 90.0, 1, base + 1), stock("MSFT", 30.0, 1, base + 2)])
                # the partial match the last life left (IBM at 10**5) survived the restart
                kept = [{"stream": "HighPair", "t0": 10 ** 5, "t1": base + 2, "IBMPrice": 1.0, "MSFTPrice": 30.0}]
                assert collect(m, 1 + k) == kept * k + [{"stream": "HighPair", "t0": base + 1, "t1": base + 2,
                                                         "IBMPrice": 90.0, "MSFTPrice": 30.0}]
            c.post_events([stock("IBM", 1.0, 1, base + 10 ** 5)])  # a partial match for the next life
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        c.unsubscribe(ibm["id"], cascade=True)  # asked for: the readers go too
        assert c.subscriptions() == []
        assert c.subscribe(cel=PAIR.replace("IBMStock", "Stock").replace("IBMPrice,", "Price AS IBMPrice,"))
    with RunningServer(settings) as srv, CayugaClient(srv.base_url) as c:
        assert len(c.subscriptions()) == 1 and srv.daemon.restored == 1
    assert_no_cayuga_threads()
