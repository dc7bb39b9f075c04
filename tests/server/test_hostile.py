"""Hostile and careless clients (issue #13), over real sockets: each abuse is
refused clearly, counted, and costs nobody else anything."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.client import CayugaAPIError, CayugaClient, TcpSender
from clients.testing import wait_until
from server.ingest.connection import line_over
from tests.conftest import examples
from tests.server.conftest import collect, kept_by_cap, stock

ALL = "SELECT * FROM Stock PUBLISH All"


def metric(client: CayugaClient, line_start: str) -> float:
    for line in client.http.get("/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {line_start}")


def raw(server, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.tcp_port), timeout=timeout)


def read_all(sock: socket.socket) -> str:
    """What the server sends until it closes (or the socket's timeout)."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return out.decode()


def send_lines(client: CayugaClient, *lines: str | bytes, token: str | None = None) -> list[str]:
    """Send raw lines on one connection; the server's error lines."""
    s = TcpSender(*client.tcp_address(), token=token)
    for line in lines:
        s.sock.sendall((line if isinstance(line, bytes) else line.encode()) + b"\n")
    return s.close()


# --------------------------------------------------------------------------- connections


def test_idle_connections_are_closed_and_a_sender_gets_in_again(start_server):
    srv = start_server(max_connections=8, max_connections_per_address=9, idle_timeout=1.0)
    with CayugaClient(srv.base_url) as c:
        idle = [raw(srv) for _ in range(8)]
        wait_until(lambda: srv.daemon.receiver.connections == 8, what="8 connections taken")
        extra = raw(srv)
        assert read_all(extra) == "error: too many connections; try again later\n"
        extra.close()
        for s in idle:  # each is told why, then closed
            assert read_all(s).startswith("error: idle for 1 s without a complete line (the idle_timeout setting)")
            s.close()
        sub = c.subscribe(cel=ALL)
        with c.watch(sub["id"], timeout=10) as m:
            with c.sender() as s:
                s.send(stock("IBM", 1.0, 1, 1))
            assert collect(m, 1)[0]["Name"] == "IBM"
        assert metric(c, 'cayuga_tcp_refusals_total{reason="idle"}') == 8
        assert metric(c, 'cayuga_tcp_refusals_total{reason="max_connections"}') == 1


def test_connections_per_address_are_limited(start_server):
    srv = start_server(max_connections_per_address=2)
    with CayugaClient(srv.base_url) as c:
        held = [raw(srv), raw(srv)]
        wait_until(lambda: srv.daemon.receiver.connections == 2, what="2 connections taken")
        third = raw(srv)
        assert read_all(third) == ("error: too many connections from 127.0.0.1 (at most 2: the "
                                   "max_connections_per_address setting)\n")
        third.close()
        gone = held.pop()
        thread = f"cayuga-tcp-{gone.getsockname()[1]}"  # its end releases the address's slot
        gone.close()
        wait_until(lambda: thread not in {t.name for t in threading.enumerate()}, what=f"{thread} to end")
        assert send_lines(c, json.dumps(stock("IBM", 1.0, 1, 1))) == []
        held[0].close()
        assert metric(c, 'cayuga_tcp_refusals_total{reason="per_address"}') == 1


# --------------------------------------------------------------------------- time


def test_events_far_in_the_future_are_refused_and_the_queue_keeps_moving(client):
    sub = client.subscribe(cel=ALL)
    with client.watch(sub["id"], timeout=10) as m:
        errors = send_lines(client, json.dumps(stock("X", 1.0, 1, 10**15)), json.dumps(stock("IBM", 1.0, 1, 5)))
        assert collect(m, 1)[0]["Name"] == "IBM"
    assert len(errors) == 1 and errors[0].startswith("error line 1: t1=1000000000000000 is too far ahead of the "
                                                     "server clock")
    assert "max_future" in errors[0]
    body = client.post_events([stock("A", 1.0, 1, 6), stock("B", 1.0, 1, 10**15)])
    assert body["accepted"] == 1 and body["rejected"][0]["index"] == 1
    assert "too far ahead" in body["rejected"][0]["error"]
    assert client.health()["status"] == "ok" and client.health()["queue_depth"] == 0


def test_health_reports_a_stalled_queue(start_server, monkeypatch):
    import server.observability.health

    monkeypatch.setattr(server.observability.health, "STALL_SECONDS", 0.3)
    srv = start_server(queue_capacity=10, max_future=3600)
    with CayugaClient(srv.base_url) as c:
        soon = int(time.time() * 1000) + 1_800_000
        assert c.post_events([stock("IBM", 1.0, 1, soon)] * 10)["accepted"] == 10
        h = wait_until(lambda: (h := c.health())["status"] == "degraded" and h, what="health to say degraded")
    assert h["queue_stalled"].startswith("the event queue is full (10 events) and none has left for")
    assert re.search(r"; the next event is due in 1[78]\d\d s: senders are blocked$", h["queue_stalled"])


README_EVENTS = "examples/example9.jsonl"


def test_time_event_replays_old_events_after_a_clock_stamped_one(start_server):
    """time: event orders by the events' own t1 (watermark = newest t1 - delay):
    the README's 1970-style events replay as documented; an event without
    timestamps is refused there, since no clock stamps it."""
    srv = start_server(time="event")
    with CayugaClient(srv.base_url) as c:
        sub = c.subscribe(cel="SELECT Name, Price_1 AS Before, Price AS After FROM Stock NEXT{$1.Name = $2.Name "
                              "AND $2.Price >= 1.05 * $1.Price} Stock PUBLISH Rising")
        lines = open(README_EVENTS).read().splitlines()
        with c.watch(sub["id"], timeout=10) as m:
            errors = send_lines(c, json.dumps({"stream": "Stock", "Name": "X", "Price": 1.0, "Volume": 1}), *lines)
            got = collect(m, 2)
    assert errors == ["error line 1: missing timestamps t0/t1 (required here: no clock stamps events in offline "
                      "runs or with the server's time: event setting)"]
    assert got == [{"stream": "Rising", "t0": 33300000, "t1": 33840000, "Name": "IBM", "Before": 85.0, "After": 91.0},
                   {"stream": "Rising", "t0": 33660000, "t1": 33840000, "Name": "IBM", "Before": 81.0, "After": 91.0}]


def test_time_clock_explains_why_old_events_are_late(server, client):
    errors = send_lines(client, json.dumps({"stream": "Stock", "Name": "X", "Price": 1.0, "Volume": 1}))
    assert errors == []
    wait_until(lambda: server.daemon.engine.stats.events == 1, what="the clock-stamped event to be processed")
    errors = send_lines(client, json.dumps(stock("IBM", 1.0, 1, 33300000)))
    assert len(errors) == 1 and errors[0].startswith("error line 1: late: t1=33300000 is older than events already "
                                                     "processed (see the time setting in the README)")


# --------------------------------------------------------------------------- bad values on TCP


@pytest.mark.parametrize("line, reason", [
    ("[" * 100_000 + "]" * 100_000, "error line 1: invalid JSON: nested too deeply"),
    ('{"a":' * 100_000 + "1" + "}" * 100_000, "error line 1: invalid JSON: nested too deeply"),
    ('{"stream": "Stock", "t1": 1, "Name": "IBM", "Price": NaN, "Volume": 1}',
     "error line 1: invalid JSON: NaN at column 54 (non-finite numbers are not JSON and not accepted)"),
    ('{"stream": "Stock", "t1": 1, "Name": "IBM", "Price": Infinity, "Volume": 1}',
     "error line 1: invalid JSON: Infinity at column 54"),
    ('{"stream": "Stock", "t1": 1, "Name": "IBM", "Price": 1.0, "Volume": %d}' % 2**70,
     "error line 1: attribute 'Volume' must be int (64-bit), got 1180591620717411303424 which does not fit"),
    (b'{"stream": "Stock", "t1": 1, "Name": "I\xff\xfeM", "Price": 1.0, "Volume": 1}',
     "error line 1: not valid UTF-8: byte 40 of the line"),
])
def test_hostile_values_get_an_error_line_and_the_next_line_counts(client, line, reason):
    sub = client.subscribe(cel=ALL)
    with client.watch(sub["id"], timeout=10) as m:
        errors = send_lines(client, line, json.dumps(stock("IBM", 2.5, 1, 7)))
        assert collect(m, 1) == [{"stream": "All", "t0": 7, "t1": 7, "Name": "IBM", "Price": 2.5, "Volume": 1}]
    assert len(errors) == 1 and errors[0].startswith(reason), errors
    assert metric(client, 'cayuga_events_rejected_total{source="tcp"}') == 1


# --------------------------------------------------------------------------- HTTP bodies


def test_large_bodies_and_values_are_refused(start_server):
    srv = start_server(max_body_bytes=1 << 20, max_value_bytes=1000)
    with CayugaClient(srv.base_url) as c:
        big = json.dumps([stock("IBM" * 400_000, 1.0, 1, 1)])
        r = c.http.post("/events", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "larger than max_body_bytes (1048576)" in r.json()["detail"]

        def chunks():  # no content-length: refused once the limit is passed
            yield b"["
            for _ in range(100):
                yield json.dumps(stock("I" * 20_000, 1.0, 1, 1)).encode() + b","
            yield b"{}]"

        r = c.http.post("/events", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        body = c.post_events([stock("IBM", 1.0, 1, 1), stock("I" * 2000, 1.0, 1, 2)])
        assert body["accepted"] == 1 and body["rejected"] == [
            {"index": 1, "error": "a string value of 2000 bytes is longer than max_value_bytes (1000)"}]
        errors = send_lines(c, json.dumps(stock("I" * 2000, 1.0, 1, 3)), json.dumps(stock("IBM", 1.0, 1, 4)))
        assert errors == ["error line 1: a string value of 2000 bytes is longer than max_value_bytes (1000)"]
        assert metric(c, 'cayuga_http_refusals_total{reason="body_bytes"}') == 2



@settings(examples(3))
@given(st.lists(st.integers(0, 40), max_size=12), st.booleans(), st.integers(1, 45))
def test_line_over_says_whether_some_line_of_a_block_is_longer_than_the_limit(lengths, newline_at_end, limit):
    block = b"\n".join(b"x" * n for n in lengths) + (b"\n" if newline_at_end else b"")
    assert line_over(block, limit) == (max(map(len, block.split(b"\n"))) > limit)


def test_a_block_of_short_lines_longer_than_max_value_bytes_is_not_split_into_lines(start_server):
    """Only a block with a line longer than max_value_bytes is scanned value by
    value; finding there is none takes a few rfind calls, not a split of the block.
    The reader runs on a thread here (receivers: 0), where the probe sees it."""
    srv = start_server(max_value_bytes=1000, receivers=0)
    splits, read = [], []

    def profile(frame, event, arg):
        if not frame.f_code.co_filename.endswith("server/ingest/connection.py"):
            return
        if event == "c_call" and getattr(arg, "__name__", "") == "split":
            splits.append(frame.f_lineno)
        elif event == "call" and frame.f_code.co_name == "_read_lines":
            read.append(frame.f_lineno)

    threading.setprofile(profile)  # the connection's receiver thread starts with it
    try:
        with CayugaClient(srv.base_url) as c:
            short = b"".join(json.dumps(stock(f"N{i}", 1.0, 1, i)).encode() + b"\n" for i in range(1, 200))
            errors = send_lines(c, short + json.dumps(stock("I" * 2000, 1.0, 1, 200)).encode())
            wait_until(lambda: metric(c, 'cayuga_events_received_total{source="tcp"}') >= 199, 10, "the short lines")
    finally:
        threading.setprofile(None)
    assert errors == ["error line 200: a string value of 2000 bytes is longer than max_value_bytes (1000)"]
    assert splits == [] and len(read) == 1


def test_text_plain_body_is_415(client):

    r = client.http.post("/events", content=json.dumps(stock("IBM", 1.0, 1, 1)),
                         headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["detail"]
    assert metric(client, 'cayuga_http_refusals_total{reason="content_type"}') == 1


# --------------------------------------------------------------------------- auth


def test_tcp_needs_the_token_line_and_metrics_the_token(start_server, tmp_path):
    srv = start_server(auth_tokens=["sekret"])
    with CayugaClient(srv.base_url, token="sekret") as c:
        sub = c.subscribe(cel=ALL)
        s = raw(srv)
        s.sendall(json.dumps(stock("IBM", 1.0, 1, 1)).encode() + b"\n")
        assert read_all(s) == ("error line 1: authentication required: the first line must be '#token <token>' "
                               "with one of the server's auth_tokens; closing\n")
        s.close()
        s = raw(srv)
        s.sendall(b"#token wrong\n")
        assert "authentication required" in read_all(s)
        s.close()
        with c.watch(sub["id"], timeout=10) as m:
            with c.sender(fmt="cayuga") as s:  # CayugaClient's sender sends its token first
                s.send("IBM, 1.0, 1, Stock, 2, 2")
                s.send("bad")
            assert s.errors[0].startswith("error line 4: ")  # #token and #format are lines 1 and 2
            assert collect(m, 1)[0]["t1"] == 2
        assert metric(c, 'cayuga_tcp_refusals_total{reason="auth"}') == 2
    with CayugaClient(srv.base_url) as anon:
        assert anon.http.get("/metrics").status_code == 401
        assert anon.http.get("/health").status_code == 200


def test_cayuga_send_with_token(start_server, tmp_path):
    from click.testing import CliRunner

    from clients.cli import main

    srv = start_server(auth_tokens=["sekret"])
    f = tmp_path / "e.jsonl"
    f.write_text(json.dumps(stock("IBM", 1.0, 1, 1)) + "\nbad\n")
    args = ["send", str(f), "--url", srv.base_url]
    result = CliRunner().invoke(main, args + ["--token", "sekret"])
    assert "sent 2 lines, 1 rejected" in result.output
    assert f"{f}: error line 2: invalid JSON" in result.output  # counted in the file, not the connection
    result = CliRunner().invoke(main, args)  # refused for good: no retries for --retry-for seconds
    assert result.output == ("cayuga: error line 1: authentication required: the first line must be "
                             "'#token <token>' with one of the server's auth_tokens; closing; "
                             "0 of 2 lines acknowledged\n")
    assert result.exit_code == 1


# --------------------------------------------------------------------------- queries


def test_validate_lists_every_name_and_type_error(client):
    bad = client.validate(cel="SELECT Nme, Price AS P FROM FILTER{Prce > 1 AND Name = 3 AND Volume > FOO(1)}(Stock) "
                              "NEXT{$1.Nam = $2.Name} Stock PUBLISH X")
    assert bad["valid"] is False
    assert [e["message"].split(";")[0].split(" (")[0] for e in bad["errors"]] == [
        "unknown attribute 'Nme' in SELECT", "unknown attribute 'Prce' in FILTER", "cannot compare string with int",
        "unknown function FOO", "unknown attribute '$1.Nam'"]
    assert all(e["line"] == 1 and e["column"] > 0 for e in bad["errors"])


def test_error_excerpts_are_cut_to_a_window(client):
    air = open("tests/conformance/air/T4.xml").read().replace("<NFA>", "<NFA>" + "<Bogus/>" * 300_000, 1)
    r = client.http.post("/subscriptions", json={"air": air})
    assert r.status_code == 400 and len(r.content) < 2000, len(r.content)
    cel = "SELECT * FROM FILTER{" + "Price > 1 AND " * 20_000 + "Nope > 1}(Stock)"
    r = client.http.post("/subscriptions/validate", json={"cel": cel})
    (err,) = r.json()["errors"]
    text, caret = err["excerpt"].splitlines()
    assert len(text) < 140 and text.strip().startswith("...") and text[len(caret) - 1:].startswith("Nope")


def _frames(sock: socket.socket, texts: int | None = None, timeout: float = 60.0) -> list[tuple[int, bytes]]:
    """(opcode, payload) of the WebSocket frames the server sends until it
    closes, or (``texts``) that many text frames came; without ``texts``, until
    it goes quiet for 3 s. With ``texts``, a quiet spell is waited out (a loaded
    machine can pause a lagging client's catch-up for seconds) until ``timeout``."""
    sock.settimeout(3)
    data = b""
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    i = 0
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            if texts is None:
                break
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
        while i + 2 <= len(data):
            op, n, j = data[i] & 0x0F, data[i + 1] & 0x7F, i + 2
            if n == 126:
                n, j = int.from_bytes(data[j:j + 2], "big"), j + 2
            elif n == 127:
                n, j = int.from_bytes(data[j:j + 8], "big"), j + 8
            if j + n > len(data):
                break
            out.append((op, data[j:j + n]))
            i = j + n
        if texts is not None and sum(op == 1 for op, _ in out) >= texts:
            break
    return out


def test_a_client_that_does_not_read_for_a_while_lags_and_then_gets_every_witness_in_order(start_server):
    """Its buffer of 20 overflows at once: it is not cut (no 1013) but lags,
    and when it reads at last it gets all 400 witnesses, in order, from the
    witness log and then live; what was sent is what is counted."""
    from tests.server.test_lifecycle import stalled_websocket

    srv = start_server(client_buffer=20)
    with CayugaClient(srv.base_url) as c:
        c.declare_stream("Blob", {"Body": "string", "N": "int"})
        sub = c.subscribe(cel="SELECT * FROM Blob PUBLISH Blobs")
        slow = stalled_websocket(srv.http_port, f"/ws/subscriptions/{sub['id']}")
        with c.sender() as s:
            for i in range(400):
                s.send({"stream": "Blob", "t1": i, "Body": "X" * 20_000, "N": i})
        wait_until(lambda: metric(c, "cayuga_witness_log_appended_total") >= 400, what="400 witnesses logged")
        assert metric(c, "cayuga_client_lags_total") >= 1
        frames = _frames(slow, texts=400)
        slow.close()
        texts = [p for op, p in frames if op == 1]
        assert [json.loads(p)["N"] for p in texts] == list(range(400))
        assert not [p for op, p in frames if op == 8], "closed"
        wait_until(lambda: metric(c, "cayuga_witnesses_delivered_total") >= 400, what="400 witnesses delivered")
        assert metric(c, "cayuga_witnesses_delivered_total") == 400
        assert metric(c, 'cayuga_client_drops_total{policy="disconnect"}') == 0


def test_metrics_and_health_answer_while_every_worker_thread_waits(start_server):
    """40+ POST /events blocked on a full queue hold every worker thread (40:
    AnyIO's default); /metrics and /health do not need one: they answer (the
    request's timeout only bounds a hang; how fast they answer is measured by
    `cayuga bench overload`, not judged here)."""
    srv = start_server(queue_capacity=10)
    soon = int(time.time() * 1000) + 600_000
    with CayugaClient(srv.base_url) as c:
        c.post_events([stock("IBM", 1.0, 1, soon)] * 10)  # the queue is full for ten minutes

        def post():
            with httpx.Client(base_url=srv.base_url, timeout=60) as h:
                h.post("/events", json=[stock("IBM", 1.0, 1, soon)])

        posts = [threading.Thread(target=post) for _ in range(45)]
        for t in posts:
            t.start()
        # a worker thread is started only when none is idle: 40 of them means all are held at once
        wait_until(lambda: sum(t.name == "AnyIO worker thread" for t in threading.enumerate()) >= 40,
                   what="every worker thread to hold a blocked POST")
        for path in ("/metrics", "/health"):
            assert c.http.get(path, timeout=10).status_code == 200
        assert metric(c, "cayuga_instances_age_seconds") < 5
        srv.stop()  # the queue closes: the blocked posts get their answer
        for t in posts:
            t.join(30)


# --------------------------------------------------------------------------- server limits


def test_subscription_and_automaton_limits(start_server):
    srv = start_server(max_subscriptions=2, max_states=3, max_predicate_atoms=4)
    with CayugaClient(srv.base_url) as c:
        three = "SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock NEXT{$1.Name = $2.Name} Stock"
        r = c.http.post("/subscriptions", json={"cel": three})
        assert r.status_code == 400 and "states; at most 3 (the max_states setting)" in r.json()["detail"]
        assert "max_states" in c.validate(cel=three)["errors"][0]["message"]
        many = "SELECT * FROM FILTER{Price > 1 AND Price > 2 AND Price > 3 AND Price > 4 AND Price > 5}(Stock)"
        r = c.http.post("/subscriptions", json={"cel": many})
        assert r.status_code == 400 and "at most 4 (the max_predicate_atoms setting)" in r.json()["detail"]
        c.subscribe(cel=ALL)
        c.subscribe(cel="SELECT Name FROM Stock PUBLISH Names")
        r = c.http.post("/subscriptions", json={"cel": "SELECT Price FROM Stock PUBLISH Prices"})
        assert r.status_code == 403 and "max_subscriptions" in r.json()["detail"]
        c.unsubscribe(c.subscriptions()[0]["id"])
        with pytest.raises(CayugaAPIError) as info:  # a batch counts whole: two do not fit in one place
            c.subscribe_many(["SELECT Price FROM Stock PUBLISH P1", "SELECT Price FROM Stock PUBLISH P2"])
        assert info.value.status == 403
        with pytest.raises(CayugaAPIError) as info:  # one too large refuses the batch, with its index
            c.subscribe_many([three])
        assert info.value.status == 400 and info.value.body["errors"][0]["index"] == 0
        assert "max_states" in info.value.body["errors"][0]["message"]
        assert metric(c, "cayuga_subscriptions_refused_total") == 6


def test_a_subscription_over_its_instance_limit_loses_its_oldest_instances(start_server):
    """max_instances_per_subscription sheds oldest first, at the check after every
    256th event: the subscription keeps its newest instances (and their
    witnesses), counted, logged and marked inexact."""
    srv = start_server(max_instances_per_subscription=50)
    with CayugaClient(srv.base_url) as c:
        sub = c.subscribe(cel="SELECT * FROM Stock NEXT{$1.Name = $2.Name} Stock PUBLISH Pairs")
        c.post_events([stock(f"S{i}", 1.0, 1, i) for i in range(1, 301)])  # 300 open instances
        # one engine keeps S212..S256 (90% of the limit, the newest); N workers (it is row-scaled) 90% of
        # the limit's Nth each, the newest of their key groups: the limit holds for the subscription
        workers = c.health()["engine_workers"]
        kept = kept_by_cap([f"S{i}" for i in range(1, 257)], 50, workers)
        wait_until(lambda: metric(c, "cayuga_instances_evicted_total") == 256 - len(kept), what="the shedding")
        assert len(kept) <= 45 and "S256" in kept and "S1" not in kept
        assert metric(c, "cayuga_eviction_rounds_total") == max(workers, 1)  # one cut per engine that holds some
        assert metric(c, "cayuga_instances_evicted_shared_total") == 0
        with c.watch(sub["id"], timeout=10) as m:  # those shed are gone; the rest, and S257..S300, still match
            probes = [("S1", 310), ("S211", 311), ("S212", 312), ("S300", 313)]
            c.post_events([stock(name, 2.0, 1, t) for name, t in probes])
            want = [(int(name[1:]), t) for name, t in probes if name in kept or int(name[1:]) > 256]
            got = collect(m, len(want))
            assert [(w["t0"], w["t1"]) for w in got] == want
        assert c.subscription(sub["id"])["exact"] is False


@pytest.mark.parametrize("cel", ["SELECT * FROM " + "(" * 5000 + "Stock" + ")" * 5000,
                                 "SELECT * FROM FILTER{Price > " + "1 + " * 20_000 + "1}(Stock)"])
def test_queries_nested_too_deeply_are_400_not_500(client, cel):
    """Fuzzing finding: the CEL parser raised RecursionError on 5,000
    parentheses. RELIABILITY.md: a positioned 'nested too deeply' error, 400;
    /subscriptions/validate answers 200 with that error."""
    r = client.http.post("/subscriptions", json={"cel": cel})
    assert r.status_code == 400, r.text[:300]
    assert "the query is nested too deeply" in r.json()["detail"]
    r = client.http.post("/subscriptions/validate", json={"cel": cel})
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    assert body["valid"] is False and [(e["line"], e["column"]) for e in body["errors"]] == [(1, 1)]
    assert "the query is nested too deeply" in body["errors"][0]["message"]
    assert client.subscriptions() == []
    air = open("tests/conformance/air/94.xml").read()
    deep = air.replace('Expr="(NODE.cnt_n)+(1)"', 'Expr="' + "(" * 5000 + "NODE.cnt_n" + ")" * 5000 + '+(1)"', 1)
    r = client.http.post("/subscriptions", json={"air": deep})
    assert r.status_code == 400 and "nested too deeply" in r.json()["detail"]


def test_a_client_that_never_reads_its_error_lines_does_not_stall_its_connection(client):
    """Overload finding: each error line the client did not read cost its
    connection a 0.25 s send timeout (50,000 bad lines: hours)."""
    sub = client.subscribe(cel=ALL)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(client.tcp_address())
    with client.watch(sub["id"], timeout=20) as m:
        s.sendall(b"garbage\n" * 50_000 + json.dumps(stock("IBM", 1.0, 1, 1)).encode() + b"\n")
        assert collect(m, 1)[0]["Name"] == "IBM"
    s.close()
    assert metric(client, 'cayuga_events_rejected_total{source="tcp"}') == 50_000
    assert metric(client, "cayuga_tcp_error_lines_muted_total") == 1
