"""``receivers: 1``: the TCP connections' lines read in a process of their own
(server/ingest/readers.py; docs/design/receivers.md, stage 1). What a sender sees
is what a reader thread gives it -- replies, refusals, acknowledgements, TLS and
tokens, declarations made while it is connected -- and a reader process killed
loses no accepted line and takes none twice. (The whole suite runs so with
``CAYUGA_RECEIVERS=1``; these run at the default too.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from clients.client import CayugaClient, TcpSender
from clients.testing import ServerProcess, collect, make_tls_files, stock, wait_until
from server.observability.counters import Count

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "r3ader-token"


def _reader(srv) -> dict:
    return httpx.get(srv.base_url + "/health", timeout=10).json()["tcp_reader"]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return True


def test_the_reader_process_replies_refuses_and_acknowledges_as_a_thread_does(start_server):
    srv = start_server(receivers=1)
    reader = _reader(srv)
    assert reader["restarts"] == 0 and reader["pid"] not in (None, os.getpid()) and not _gone(reader["pid"])
    assert reader["cpu_seconds"] >= 0
    s = socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10)
    f = s.makefile("rwb")
    f.write(b"#sender feed\n#ack\n")
    f.flush()
    assert f.readline() == b"#resume 0\n"
    taken = socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10)  # one connection a sender
    taken.sendall(b"#sender feed\n")
    assert taken.makefile("rb").readline().startswith(b"error: sender feed is already connected")
    taken.close()
    good = b"".join(json.dumps(stock(f"S{i % 7}", 1.0, i, i)).encode() + b"\n" for i in range(1, 501))
    f.write(good + b'{"stream": "Nope", "t0": 1, "t1": 1}\n' + b"not json\n")
    f.flush()
    replies = [f.readline() for _ in range(3)]
    assert replies[0] == b"error line 501: unknown stream 'Nope'; declare it first\n"
    assert replies[1].startswith(b"error line 502: ") and replies[2] == b"#ack 502\n"
    f.close()
    s.close()
    counters = srv.daemon.counters
    assert counters.get(Count.RECEIVED_TCP) == 500 and counters.get(Count.REJECTED_TCP) == 2
    assert counters.get(Count.TCP_SENDER_TAKEN) == 1 and srv.daemon.queue.progress("feed") == 502
    wait_until(lambda: srv.daemon.receiver.connections == 0, 10, "the connections' channels to end")
    text = httpx.get(srv.base_url + "/metrics", timeout=10).text
    assert "cayuga_tcp_reader_restarts_total 0.0" in text and "cayuga_tcp_reader_cpu_seconds_total " in text


def test_a_reader_process_reckons_the_max_future_horizon_as_the_server_does(start_server, tmp_path):
    """The reader process reckons each block's horizon itself (no round trip): a time past the
    server's clock by more than ``max_future`` is refused with the reply a reader thread gives."""
    import time

    replies = []
    for receivers in (0, 1):
        srv = start_server(receivers=receivers, max_future=60, data_dir=tmp_path / f"data{receivers}")
        now_ms = int(time.time() * 1000)
        with socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10) as s:
            f = s.makefile("rwb")
            f.write(b"#ack\n" + json.dumps(stock("IBM", 1.0, 1, now_ms + 3_600_000)).encode() + b"\n"
                    + json.dumps(stock("IBM", 1.0, 2, now_ms + 1_000)).encode() + b"\n")
            f.flush()
            replies.append([f.readline(), f.readline()])
        assert srv.daemon.counters.get(Count.RECEIVED_TCP) == 1 and srv.daemon.counters.get(Count.REJECTED_TCP) == 1
    for got in replies:
        assert got[0].startswith(b"error line 1: t1=") and b"too far ahead of the server clock" in got[0]
        assert got[1] == b"#ack 2\n"


def test_a_stream_declared_while_a_sender_is_connected_is_known_to_its_reader(start_server):
    srv = start_server(receivers=1)
    s = socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10)
    f = s.makefile("rwb")
    line = b'{"stream": "Trade", "Sym": "IBM", "t0": 5, "t1": 5}\n'
    f.write(line)
    f.flush()
    assert f.readline() == b"error line 1: unknown stream 'Trade'; declare it first\n"
    with CayugaClient(srv.base_url) as c:
        c.declare_stream("Trade", {"Sym": "string"})
    f.write(line)
    f.flush()
    wait_until(lambda: srv.daemon.counters.get(Count.RECEIVED_TCP) == 1, 10, "the declared stream's event")
    f.close()
    s.close()


def test_kill_9_of_the_reader_process_loses_no_line_and_takes_none_twice(start_server, tmp_path):
    """``cayuga send`` sees its connection end when the reader process is killed, and resumes
    from what the journal holds; a new reader process takes it. Every line is accepted once."""
    srv = start_server(receivers=1, durability="write")
    n = 60_000
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(stock(f"S{i % 31}", i / 4, i, i // 10)) + "\n" for i in range(1, n + 1)))
    first = _reader(srv)["pid"]
    proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "send", str(path), "--url", srv.base_url,
                             "--port", str(srv.tcp_port), "--rate", "20000", "--retry-for", "60"],
                            cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: srv.daemon.queue.accepted >= n // 5, 60, f"{n // 5} lines accepted")
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: _reader(srv)["restarts"] == 1, 30, "the reader process to be started again")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert f"sent {n} lines, 0 rejected, {n} acknowledged" in err
    assert srv.daemon.queue.accepted == n  # every line once
    assert sum(len(r.events) for r in srv.daemon.journal.replay(0)) == n
    second = _reader(srv)["pid"]
    assert second != first and _gone(first) and not _gone(second)


def test_tls_and_tokens_through_the_reader_process_and_it_ends_with_its_server(tmp_path):
    files = make_tls_files(tmp_path / "tls")
    env = {"CAYUGA_RECEIVERS": "1", "CAYUGA_TLS_CERTFILE": str(files.cert), "CAYUGA_TLS_KEYFILE": str(files.key),
           "CAYUGA_AUTH_TOKENS": f'["{TOKEN}"]'}
    with ServerProcess(tmp_path / "data", settings=env, cacert=files.ca) as srv:
        client = CayugaClient(srv.base_url, token=TOKEN, cacert=str(files.ca))
        try:
            reader = client.health()["tcp_reader"]
            sid = client.subscribe(cel="SELECT * FROM Stock PUBLISH All")["id"]
            with client.watch(sid, timeout=30) as matches:
                sender = TcpSender("127.0.0.1", srv.tcp_port, token=TOKEN, ssl_context=client.tcp_ssl_context,
                                   sender_id="tls-feed", ack=True)
                sender.send_many(stock("IBM", float(i), i, i + 1) for i in range(50))
                assert sender.wait_acked(50, 30)
                assert sender.close(timeout=10) == []
                assert [w["Volume"] for w in collect(matches, 50)] == list(range(50))
            wrong = TcpSender("127.0.0.1", srv.tcp_port, token="not-it", ssl_context=client.tcp_ssl_context)
            wrong.send(stock("IBM", 1.0, 1, 100))
            assert any("authentication required" in e for e in wrong.close(timeout=10))
        finally:
            client.close()
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(10)
        wait_until(lambda: _gone(reader["pid"]), 10, "the reader process to end with its server")


def test_a_channel_that_ends_while_its_put_is_answered_gives_back_its_sender():
    """A reader process killed while the main process queues its block: the answer finds the channel
    gone, and the sender its reader held is free again for the sender's next connection."""
    from server.ingest import remote
    from server.ingest.intake import Intake, Lines
    from server.ingest.queue import DelayQueue
    from server.observability.counters import Counters
    from clients.testing.market import STOCK
    from air.engine import Event

    intake = Intake(DelayQueue(100), {STOCK.name: STOCK}.get, lambda: 1.0, Counters())
    ours, theirs = socket.socketpair()
    reader = remote.RemoteIntake(theirs, auth=False, journaled=False, clock=lambda: 1.0, time_unit_ms=1.0,
                                 stamp=True)
    outcome: list = []
    server = threading.Thread(target=lambda: outcome.append(_serve(remote, ours, intake)))
    server.start()
    assert reader.claim("feed") and not intake.claim("feed")
    events = [Event("Stock", ("IBM", 1.0, i), i, i) for i in range(1, 4)]
    remote.send(theirs, remote.put_request(events, Lines("feed", 1, 3)))
    theirs.close()  # gone before the answer
    server.join(10)
    assert outcome and len(intake.queue) == 3 and intake.progress("feed") == 3  # (accepted: the sender resumes after)
    assert intake.claim("feed")  # given back
    ours.close()


def _serve(remote, channel, intake) -> str:
    try:
        remote.serve(channel, intake)
        return "ended"
    except OSError as exc:
        return f"ended: {exc}"


def test_a_reader_processs_block_is_journaled_as_a_reader_thread_journals_it(tmp_path):
    """The reader process sends a block's events as the journal packs them, and the main process
    writes those bytes as they came: its journal is the same, byte for byte, as the one a reader
    thread's puts make, and a block with late events journals only those kept, as a thread's does."""
    from server.durability.journal import Journal
    from server.ingest import remote
    from server.ingest.intake import Intake, Lines
    from server.ingest.queue import DelayQueue
    from server.observability.counters import Counters
    from clients.testing.market import STOCK
    from air.engine import Event

    blocks = [[Event("Stock", (f"S{i % 3}", 1.5 + i, i), i, i) for i in range(1, 6)],
              [Event("Stock", ("IBM", 2.0, 7), 6.0, 6.5), Event("Trade", ("x", True), 7, 7)],
              [Event("Stock", ("IBM", 2.0, 8), 2, 2), Event("Stock", ("IBM", 2.0, 9), 9, 9)]]  # t1 2: late
    made = []
    for way in ("thread", "process"):
        journal = Journal(tmp_path / way, "write")
        queue = DelayQueue(100)
        queue.journal = journal
        intake = Intake(queue, {STOCK.name: STOCK}.get, lambda: 1.0, Counters())
        target = intake
        if way == "process":
            ours, theirs = socket.socketpair()
            server = threading.Thread(target=_serve, args=(remote, ours, intake))
            server.start()
            target = remote.RemoteIntake(theirs, auth=False, journaled=True, clock=lambda: 1.0, time_unit_ms=1.0,
                                         stamp=True)
        lates, first = [], 1
        for block in blocks:
            if block is blocks[-1]:
                queue.get_batch(100, timeout=0)  # all taken: t1 up to 7 released, so t1 2 is late
            lates.append(target.put(block, Lines("feed", first, first + len(block) - 1)))
            first += len(block)
        if way == "process":
            theirs.close()
            server.join(10)
            ours.close()
        made.append((lates, [(r.events, r.lines_done) for r in journal.replay(0)],
                     [p.read_bytes() for p in sorted((tmp_path / way).iterdir())]))
        journal.close()
    assert made[0] == made[1]
    lates, replayed, files = made[1]
    packed = remote.put_of(remote.put_request(blocks[0], None))[2]
    assert bytes(packed) in files[0]  # (the block's columns, the record's events as they crossed)
    assert lates == [[], [], [0]] and replayed[-1] == ([blocks[-1][1]], 9)


def test_a_declared_streams_declaration_is_asked_once_and_a_published_ones_each_block():
    """A declaration never changes while the server runs: the reader process keeps it after the first
    answer. A stream a subscription publishes may go with it, and a name unknown now may be declared:
    those are asked at each block, so a sender sees them come and go as a reader thread does."""
    from air.model import Attribute, StreamSchema
    from server.ingest import remote
    from server.ingest.intake import Intake
    from server.ingest.queue import DelayQueue
    from server.observability.counters import Counters

    declared = StreamSchema("Stock", (Attribute("Name", "string"),))
    published = {"Out": StreamSchema("Out", (Attribute("Name", "string"),))}
    asked: list[str] = []

    def catalog(name):
        asked.append(name)
        return declared if name == "Stock" else published.get(name)

    intake = Intake(DelayQueue(100), catalog, lambda: 1.0, Counters(), streams=lambda: ["Stock"])
    ours, theirs = socket.socketpair()
    server = threading.Thread(target=_serve, args=(remote, ours, intake))
    server.start()
    reader = remote.RemoteIntake(theirs, auth=False, journaled=False, clock=lambda: 1.0, time_unit_ms=1.0,
                                 stamp=True)
    try:
        decoder = reader.decoder("jsonl")
        block = (b'{"stream": "Stock", "Name": "IBM", "t0": 1, "t1": 1}\n'
                 b'{"stream": "Out", "Name": "x", "t0": 1, "t1": 1}\n')
        for _ in range(3):
            batch = decoder.decode_batch(block, 1)
            assert not batch.errors and [e.stream for e in batch.events] == ["Stock", "Out"]
        assert reader.catalog("Stock") is reader.catalog("Stock")
        del published["Out"]  # its subscription removed
        batch = decoder.decode_batch(block, 1)
        assert [e.stream for e in batch.events] == ["Stock"] and "unknown stream 'Out'" in batch.errors[0][1]
    finally:
        theirs.close()
        server.join(10)
        ours.close()
    assert asked.count("Stock") == 1 and asked.count("Out") >= 4  # (at every block, as a reader thread's decoder asks)


def test_a_block_of_declared_events_with_acks_crosses_the_channel_once(tmp_path, monkeypatch):
    """Per block, a connection in the reader process asks the main process one thing: its put, whose
    answer also says what is durable (the acknowledgement's first question). The horizon is reckoned
    there and a declared stream's declaration kept. A real Connection, RemoteIntake and serve over
    socket pairs, a real queue and journal (``durability: write``: durable once written); every line
    acknowledged, with no other call."""
    from collections import Counter

    from clients.testing.market import STOCK
    from server.durability.journal import Journal
    from server.ingest import remote
    from server.ingest.connection import Connection, Limits
    from server.ingest.intake import Intake
    from server.ingest.queue import DelayQueue
    from server.observability.counters import Counters

    calls: Counter = Counter()
    answer = remote._call

    def counted(intake, op, args, held):  # each request that crossed the channel
        calls[op] += 1
        return answer(intake, op, args, held)

    monkeypatch.setattr(remote, "_call", counted)
    journal = Journal(tmp_path / "j", "write")
    queue = DelayQueue(100_000)
    queue.journal = journal
    intake = Intake(queue, {STOCK.name: STOCK}.get, lambda: 1.0, Counters(), streams=lambda: [STOCK.name])
    ours, theirs = socket.socketpair()
    client, conn = socket.socketpair()
    client.settimeout(10)  # (an acknowledgement that never comes fails the test, not hangs it)
    conn.settimeout(0.05)
    server = threading.Thread(target=_serve, args=(remote, ours, intake))
    server.start()
    reader = Connection(conn, "test", remote.RemoteIntake(theirs, auth=False, journaled=True, clock=lambda: 1.0,
                                                          time_unit_ms=1.0, stamp=True, horizon_ahead=1e12),
                        Limits(), stop=threading.Event())
    thread = threading.Thread(target=reader.run)
    thread.start()
    f = client.makefile("rwb")
    try:
        f.write(b"#ack\n")
        blocks = 20
        for b in range(blocks):
            f.write(b"".join(json.dumps(stock("IBM", 1.0, i, b * 100 + i)).encode() + b"\n" for i in range(100)))
            f.flush()
            wait_until(lambda b=b: len(queue) == (b + 1) * 100, 10, "the block queued")
        acked = b""
        while acked != f"#ack {blocks * 100}\n".encode():
            acked = f.readline()
            assert acked.startswith(b"#ack "), acked  # (every reply an acknowledgement; none lost at an end)
        # (besides the puts: the decoder's streams, and Stock's declaration once)
        assert calls == Counter({"put": blocks, "streams": 1, "schema": 1})
    finally:
        f.close()
        client.close()
        thread.join(10)
        conn.close()
        theirs.close()
        server.join(10)
        ours.close()
        journal.close()
