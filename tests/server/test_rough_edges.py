"""Issue 33, the rough edges, on a real ``cayuga serve`` process with real
TCP, HTTP and WebSocket clients (the read-only data directory is in
test_datadir.py):

- a JSON event with a key given twice was taken with its last value, on TCP
  and ``POST /events``; now that line (or item) is refused with the reason
  and the others are taken;
- one ``NaN`` in a ``POST /events`` list made the whole body a 400, while
  TCP refuses just that line; now the other items are accepted and that one
  is reported with its index and reason, as TCP reports a line;
- ``?from=999999999`` on a WebSocket was taken silently (it waited for a
  witness the server may never number); now a ``from`` beyond the last seq
  + 1 is closed with 4416 and a reason naming the last seq, ``from`` = last
  + 1 still waits for the next witness, and ``cayuga watch --from`` beyond
  the end exits 1 saying so.
"""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import ConnectionClosed

from clients.testing import ServerProcess, cayuga_command, stock, wait_until

DUP_PRICE = b'{"stream": "Stock", "t0": 2, "t1": 2, "Name": "IBM", "Price": 1.0, "Volume": 5, "Price": 99.0}'


def line(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


@pytest.fixture
def srv(tmp_path):
    with ServerProcess(tmp_path / "data", tmp_path / "server.log") as s:
        yield s
    assert "Traceback" not in s.log.read_text()


def received(srv) -> int:
    return srv.http_client.get("/stats", params={"limit": 0}).json()["received"]


def tcp_exchange(port: int, lines: list[bytes]) -> list[str]:
    """Send ``#ack`` and ``lines`` on one connection; the server's lines up to ``#ack <all>``."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"#ack\n" + b"\n".join(lines) + b"\n")
        got = b""
        while f"#ack {len(lines)}\n".encode() not in got:
            chunk = s.recv(65536)
            assert chunk, f"the connection ended before #ack {len(lines)}: {got!r}"
            got += chunk
    return [x for x in got.decode().splitlines() if not x.startswith("#ack")]


def test_a_duplicate_key_is_refused_for_that_line_with_the_reason(srv):
    good = [line(stock("IBM", 1.0, 5, 1)), line(stock("IBM", 2.0, 5, 3))]
    said = tcp_exchange(srv.tcp_port, [good[0], DUP_PRICE, good[1]])
    assert said == ["error line 2: duplicate key 'Price': a JSON event names each key once (the stream, t0, t1 and "
                    "each attribute); send it with one value"], said
    wait_until(lambda: received(srv) == 2, what="the two good lines, and only them, received")
    # a block that takes the typed path but for a key given twice after a space, and the stream key twice
    more = [line(stock("IBM", 3.0, 5, 4)),
            b'{"stream":"Stock","stream":"Stock","t1":5,"Name":"IBM","Price":3.0,"Volume":5}',
            b'{"stream":"Stock","t1":6,"t1" :7,"Name":"IBM","Price":3.0,"Volume":5}']
    said = tcp_exchange(srv.tcp_port, more)
    assert [s.split(":")[0] for s in said] == ["error line 2", "error line 3"], said
    assert "duplicate key 'stream'" in said[0] and "duplicate key 't1'" in said[1]
    wait_until(lambda: received(srv) == 3, what="the third good line received")

    r = srv.http_client.post("/events", content=b"[" + line(stock("IBM", 4.0, 5, 20)) + b"," + DUP_PRICE + b"]",
                             headers={"content-type": "application/json"})
    assert r.status_code == 202, r.text
    assert r.json()["accepted"] == 1
    assert r.json()["rejected"] == [{"index": 1, "error": said[0].split(": ", 1)[1].replace("'stream'", "'Price'")}]


def test_one_nan_in_a_post_events_list_rejects_that_item_only_as_tcp_does(srv):
    def items(t: int) -> list[bytes]:  # times after the last batch's: none is late
        return [line(stock("IBM", 1.0, 5, t)), b'{"stream":"Stock","t1":%d,"Name":"IBM","Price":NaN,"Volume":5}' % t,
                line(stock("IBM", 2.0, 5, t + 1)),
                b'{"stream":"Stock","t1":%d,"Name":"IBM","Price":-Infinity,"Volume":5}' % (t + 1)]

    def reasons(t: int) -> list[str]:  # what TCP says of a line, the same words for an item
        nan, inf = items(t)[1], items(t)[3]
        return [f"invalid JSON: NaN at column {nan.index(b'NaN') + 1} (non-finite numbers are not JSON and not "
                "accepted)", f"invalid JSON: -Infinity at column {inf.index(b'-Inf') + 1} (non-finite numbers are "
                "not JSON and not accepted)"]

    assert tcp_exchange(srv.tcp_port, items(1)) == [f"error line 2: {reasons(1)[0]}", f"error line 4: {reasons(1)[1]}"]
    for t, body in ((10, b"[" + b",\n ".join(items(10)) + b"]"), (20, b'{"events": [' + b", ".join(items(20)) + b"]}")):
        r = srv.http_client.post("/events", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 202, r.text
        answer = r.json()
        assert answer["accepted"] == 2 and not answer["late"], answer
        assert answer["rejected"] == [{"index": 1, "error": reasons(t)[0]}, {"index": 3, "error": reasons(t)[1]}]
    wait_until(lambda: received(srv) == 6, what="the good events of TCP and of both posts")
    # a body that is not a list of items at all is still one 400 saying where
    r = srv.http_client.post("/events", content=b'[{"stream": "Stock", "t1": 1',
                             headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["detail"].startswith("invalid JSON"), r.text


def test_a_from_beyond_the_end_is_closed_with_4416_naming_the_last_seq(srv):
    sid = srv.http_client.post("/subscriptions", json={"cel": "SELECT * FROM Stock PUBLISH All"}).json()["id"]
    r = srv.http_client.post("/events", json=[stock("IBM", 1.0, 5, 1), stock("IBM", 2.0, 5, 2)])
    assert r.status_code == 202
    wait_until(lambda: srv.http_client.get(f"/subscriptions/{sid}").json()["last_seq"] == 2, what="two witnesses")
    base = f"ws://127.0.0.1:{srv.http_port}"
    for path in (f"/ws/subscriptions/{sid}?from=999999999", f"/ws/subscriptions/{sid}?from=4",
                 f"/ws/streams/All?from={sid}:999999999"):
        with ws_client.connect(base + path, open_timeout=30) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=60)  # the close comes at once; a timeout here is the silence of before
        assert closed.value.rcvd.code == 4416, closed.value.rcvd
        reason = closed.value.rcvd.reason
        assert reason.endswith(f"is beyond the end of {sid}: its last witness is 2; from=3 waits for the next"), reason
    # from = last + 1 waits for the next witness, as documented
    with ws_client.connect(f"{base}/ws/subscriptions/{sid}?from=3", open_timeout=30) as ws:
        wait_until(lambda: srv.health()["clients"] == 1, what="the client registered")
        srv.http_client.post("/events", json=[stock("IBM", 3.0, 5, 3)])
        got = ws.recv(timeout=60)
    assert got.startswith("3 ") and json.loads(got[2:])["Price"] == 3.0
    # cayuga watch says so and stops (4416 is final: retrying cannot help)
    watch = subprocess.run(cayuga_command("watch", sid, "--url", srv.base_url, "--from", "999"), env=srv.env,
                           capture_output=True, text=True, timeout=120)
    assert watch.returncode == 1
    assert "from 999 is beyond the end of" in watch.stderr and "its last witness is 3" in watch.stderr, watch.stderr
