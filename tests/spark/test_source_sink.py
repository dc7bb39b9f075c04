"""Source -> server -> sink, end to end: a real server on free loopback ports,
events streamed by a Spark job over TCP, witnesses received over WebSocket and
written as Parquet by Spark."""

from __future__ import annotations

import threading

import pytest

from clients.client import CayugaClient
from clients.offline import run_offline
from clients.spark.io import ColumnMapping
from clients.spark.sink import collect_witnesses, sink_to_parquet, witnesses_to_dataframe
from clients.spark.source import stream_to_server
from server.config import load_settings
from server.serve import RunningServer
from tests.conftest import CEL_DIR, STOCK
from tests.server.conftest import assert_no_cayuga_threads
from tests.spark.conftest import multiset


@pytest.fixture
def server(tmp_path):
    srv = RunningServer(load_settings(None, data_dir=tmp_path / "data", http_port=0, tcp_port=0,
                                      log_level="warning", shutdown_timeout=5)).start()
    try:
        yield srv
    finally:
        srv.stop(timeout=15)
        assert_no_cayuga_threads()


def expected_witnesses(event_files, query) -> list[dict]:
    with open(event_files["jsonl"], encoding="utf-8") as fh:
        return run_offline([STOCK], [str(query)], fh, "jsonl").witnesses


def start_collector(client, sid, count):
    box: dict = {}
    ready = threading.Event()

    def work():
        try:
            box["witnesses"] = collect_witnesses(client, sid, count=count, idle_timeout=30, ready=ready)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = exc
        finally:
            ready.set()

    t = threading.Thread(target=work, name="test-sink", daemon=True)
    t.start()
    assert ready.wait(15), "the WebSocket did not open"
    return t, box


def test_source_server_sink_end_to_end(spark, server, event_files, tmp_path):
    q = CEL_DIR / "test5.cel"
    expected = expected_witnesses(event_files, q)
    with CayugaClient(server.base_url) as client:
        client.declare_stream("Stock", {"Name": "string", "Price": "float", "Volume": "int"})
        sid = client.subscribe(cel=q.read_text())["id"]
        t, box = start_collector(client, sid, len(expected))
        mapping = ColumnMapping(t0="ts_start", t1="ts", attributes={"Name": "symbol"})
        sent = stream_to_server(spark, str(event_files["parquet"]), [STOCK], "127.0.0.1", server.tcp_port,
                                "parquet", mapping=mapping, partitions=3, progress=False)
        t.join(60)
        assert not t.is_alive(), "the sink did not finish"
        assert "error" not in box, box.get("error")
    assert sent.sent == 600 and sent.partitions == 3
    assert sent.server_errors == [] and sent.rejected_input == 0
    got = box["witnesses"]
    assert multiset(got) == multiset(expected)
    # Sink: the witnesses as a typed DataFrame, written as Parquet by Spark, read back unchanged.
    df = witnesses_to_dataframe(spark, got, None)
    assert df.columns == ["stream", "t0", "t1", "Name_1", "Price_1", "Volume_1", "Name", "Price", "Volume"]
    df.write.parquet(str(tmp_path / "sink"))
    back = [r.asDict() for r in spark.read.parquet(str(tmp_path / "sink")).collect()]
    assert multiset(back) == multiset(expected)


def test_sink_to_parquet_with_server_schema(spark, server, event_files, tmp_path):
    q = CEL_DIR / "test4.cel"
    expected = expected_witnesses(event_files, q)
    out = tmp_path / "t4"
    with CayugaClient(server.base_url) as client:
        client.declare_stream("Stock", {"Name": "string", "Price": "float", "Volume": "int"})
        sid = client.subscribe(cel=q.read_text())["id"]
        box: dict = {}
        ready = threading.Event()

        def work():
            try:
                box["n"] = sink_to_parquet(spark, client, str(out), sid, count=len(expected), idle_timeout=30,
                                           batch_size=7, ready=ready)
            except BaseException as exc:  # noqa: BLE001
                box["error"] = exc
            finally:
                ready.set()

        t = threading.Thread(target=work, name="test-sink", daemon=True)
        t.start()
        assert ready.wait(15)
        sent = stream_to_server(spark, str(event_files["jsonl"]), [STOCK], "127.0.0.1", server.tcp_port,
                                "jsonl", progress=False)
        t.join(90)
        assert not t.is_alive() and "error" not in box, box.get("error")
    assert sent.sent == 600
    assert box["n"] == len(expected)
    df = spark.read.parquet(str(out))
    # appended batches share one schema: times are doubles whatever each batch held
    assert dict(df.dtypes)["t0"] == dict(df.dtypes)["t1"] == "double"
    back = [r.asDict() for r in df.collect()]
    assert multiset(back) == multiset([{**w, "t0": float(w["t0"]), "t1": float(w["t1"])} for w in expected])


def test_source_and_sink_over_mutual_tls(spark, event_files, tmp_path):
    """Issue 38: the source streams over TLS to the TCP port, the sink watches over wss://, each with
    the client certificate a server with tls_client_ca wants (cayuga spark source/sink --cacert --cert --key)."""
    from clients.testing import make_tls_files

    tls = make_tls_files(tmp_path / "tls")
    srv = RunningServer(load_settings(None, data_dir=tmp_path / "data", http_port=0, tcp_port=0, log_level="warning",
                                      shutdown_timeout=5, auth_tokens=["spark-token"],
                                      **tls.settings(mutual=True))).start()
    q = CEL_DIR / "test5.cel"
    expected = expected_witnesses(event_files, q)
    try:
        with CayugaClient(srv.base_url, token="spark-token", cacert=str(tls.ca), cert=str(tls.client_cert),
                          key=str(tls.client_key)) as client:
            sid = client.subscribe(cel=q.read_text())["id"]
            t, box = start_collector(client, sid, len(expected))
            mapping = ColumnMapping(t0="ts_start", t1="ts", attributes={"Name": "symbol"})
            sent = stream_to_server(spark, str(event_files["parquet"]), [STOCK], "127.0.0.1", srv.tcp_port,
                                    "parquet", mapping=mapping, partitions=2, progress=False, token="spark-token",
                                    ssl_context=client.tcp_ssl_context)
            t.join(60)
            assert not t.is_alive() and "error" not in box, box.get("error")
    finally:
        srv.stop(timeout=15)
    assert_no_cayuga_threads()
    assert sent.sent == 600 and sent.server_errors == []
    assert multiset(box["witnesses"]) == multiset(expected)
