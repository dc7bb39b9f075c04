"""Acknowledged ingestion: #sender, #resume, #from, #ack over real sockets, POST
/events answering once durable, and cayuga send across a server restart."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest

from air.engine import Event
from clients.testing import wait_until
from server.durability.journal import Journal
from server.serve import RunningServer
from tests.server.conftest import assert_no_cayuga_threads, make_settings, stock

ROOT = Path(__file__).resolve().parents[2]


class Raw:
    """A raw TCP client: send bytes, read the server's lines (each read waits at most 10 s)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.file = self.sock.makefile("rb")

    def send(self, text: str) -> None:
        self.sock.sendall(text.encode())

    def line(self) -> str:
        return self.file.readline().decode().rstrip("\n")

    def until_ack(self, n: int) -> list[str]:
        """Lines up to the ack of ``n`` lines (acks are cumulative)."""
        out = []
        while True:
            line = self.line()
            assert line, f"connection ended before #ack {n}: {out}"
            out.append(line)
            if line.startswith("#ack ") and int(line.split()[1]) >= n:
                return out

    def rest(self) -> list[str]:
        """Every line until the server closes the connection."""
        out = []
        while line := self.line():
            out.append(line)
        return out

    def close(self) -> None:
        self.file.close()  # the file holds the socket open too: both, or the server never sees the end
        self.sock.close()


def lines(start: int, end: int, bad: tuple[int, ...] = ()) -> str:
    """Data lines numbered start..end (inclusive); those in ``bad`` are not JSON."""
    return "".join("bad\n" if i in bad else json.dumps(stock("IBM", float(i), i, i)) + "\n"
                   for i in range(start, end + 1))


def metric(srv, name: str) -> float:
    for line in httpx.get(srv.base_url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def tcp_port(srv) -> int:
    return srv.daemon.receiver.port


@pytest.mark.parametrize("durability", ["fsync", "write", "off"])
def test_sender_resume_acks_and_duplicates(start_server, durability):
    srv = start_server(durability=durability)
    c = Raw(tcp_port(srv))
    c.send("#sender feed-1\n#ack\n")
    assert c.line() == "#resume 0"
    c.send(lines(1, 100, bad=(7, 50)))
    got = c.until_ack(100)
    assert [x for x in got if x.startswith("error")] == [
        "error line 7: invalid JSON: expected a JSON object at column 1",
        "error line 50: invalid JSON: expected a JSON object at column 1"]
    acks = [int(x.split()[1]) for x in got if x.startswith("#ack")]
    assert acks == sorted(acks) and acks[-1] == 100
    c.close()

    # the same sender again, once the old connection's thread has ended: it resumes after line 100
    wait_until(lambda: srv.daemon.receiver.connections == 0, what="the first connection to end")
    c = Raw(tcp_port(srv))
    c.send("#sender feed-1\n#ack\n")
    assert c.line() == "#resume 100"
    c.send("#from 90\n" + lines(91, 120, bad=(115,)))  # 91..100 again: dropped
    got = c.until_ack(120)
    assert [x for x in got if x.startswith("error")] == [
        "error line 115: invalid JSON: expected a JSON object at column 1"]
    assert metric(srv, "cayuga_tcp_duplicates_dropped_total") == 10
    assert metric(srv, 'cayuga_events_received_total{source="tcp"}') == 98 + 19

    other = Raw(tcp_port(srv))  # a second live connection with that id is refused
    other.send("#sender feed-1\n")
    assert other.line().startswith("error: sender feed-1 is already connected")
    assert other.line() == ""
    other.close()
    c.close()

    if durability != "off":
        j = srv.daemon.journal
        evs = [e for _, evs, _, _ in j.replay(0) for e in evs]
        assert sorted(e.values[2] for e in evs) == [i for i in range(1, 121) if i not in (7, 50, 115)]
        assert j.senders == {"feed-1": 120}


def test_from_beyond_resume_and_bad_sender_ids_are_refused(server):
    port = tcp_port(server)
    c = Raw(port)
    c.send("#sender s\n")
    assert c.line() == "#resume 0"
    c.send("#from 5\n")
    line = c.line()
    assert line.startswith("error: #from 5 is beyond the 0 lines of sender s journaled so far (#resume 0)")
    assert c.line() == ""
    c.close()
    for bad in ("", "a b", "x" * 129, "é"):
        c = Raw(port)
        c.send(f"#sender {bad}\n")
        assert c.line().startswith("error: sender id"), bad
        c.close()
    c = Raw(port)
    c.send("#from 0\n")
    assert c.line().startswith("error: #from needs a #sender line before it")
    c.close()


def test_without_sender_lines_are_journaled_and_numbered_as_before(server):
    c = Raw(tcp_port(server))
    c.send("#format jsonl\n" + lines(1, 3, bad=(2,)))
    assert c.line() == "error line 3: invalid JSON: expected a JSON object at column 1"  # the header counts
    c.sock.shutdown(socket.SHUT_WR)
    assert c.line() == ""
    c.close()
    j = server.daemon.journal
    wait_until(lambda: j.appended >= 1, what="the batch to be journaled")
    assert [(s, n, len(e)) for _, e, s, n in j.replay(0)] == [(None, None, 2)]


def test_acks_never_wait_for_a_client_that_does_not_read_them(start_server):
    """A client that sends #ack and never reads: the server keeps taking its
    lines (acks are dropped when its socket is full, the newest kept)."""
    srv = start_server()
    s = socket.create_connection(("127.0.0.1", tcp_port(srv)), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"#sender mute\n#ack\n")
    n = 20_000
    for k in range(0, n, 200):  # many small blocks: many acks
        s.sendall(lines(k + 1, k + 200).encode())
    wait_until(lambda: srv.daemon.queue.progress("mute") >= n, timeout=60, what=f"{n} lines of sender mute")
    assert srv.daemon.queue.progress("mute") == n
    s.close()


def test_post_events_answers_once_durable(start_server):
    srv = start_server(durability="fsync")
    r = httpx.post(srv.base_url + "/events", json=[stock("IBM", 1.0, 1, 1), {"stream": "Nope"}])
    assert r.status_code == 202 and r.json()["accepted"] == 1
    j = srv.daemon.journal
    assert j.durable() >= j.appended >= 1  # answered after the sync
    assert [len(e) for _, e, _, _ in j.replay(0)] == [1]


# --------------------------------------------------------------------------- cayuga send across a restart


def test_cayuga_send_delivers_every_line_once_across_a_server_restart(tmp_path):
    n = 200_000
    path = tmp_path / "events.jsonl"
    expected = []
    with open(path, "w") as fh:
        for i in range(1, n + 1):
            t = i // 10
            fh.write(json.dumps(stock(f"S{i % 97}", i / 4, i, t)) + "\n")
            expected.append(Event("Stock", (f"S{i % 97}", i / 4, i), t, t))
    ports = {"http_port": 0, "tcp_port": 0}  # free ports at first; the restart takes the same ones again

    def start():
        return RunningServer(make_settings(tmp_path, durability="write", **ports)).start()

    srv = start()
    ports = {"http_port": srv.http_port, "tcp_port": srv.tcp_port}
    tcp = srv.tcp_port
    proc = None
    try:
        # --rate keeps the file going long enough to stop the server in the middle of it
        proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "send", str(path), "--url", srv.base_url,
                                 "--port", str(tcp), "--rate", "100000", "--retry-for", "60"],
                                cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        def a_fifth_in():
            assert proc.poll() is None, f"cayuga send ended early: {proc.communicate()[1]}"
            return srv.daemon.queue.accepted >= n // 5

        wait_until(a_fifth_in, timeout=60, what=f"{n // 5} lines accepted")
        srv.stop()
        first_life = srv.daemon.queue.accepted
        assert 0 < first_life < n, "the server must stop in the middle of the file"
        srv = start()  # cayuga send sees its connection go and retries until this one answers
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        assert f"sent {n} lines, 0 rejected, {n} acknowledged" in err
        second_life = srv.daemon.queue.accepted
        assert first_life + second_life == n  # every line accepted once, over both lives
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
        srv.stop()
    assert_no_cayuga_threads()
    j = Journal(tmp_path / "data" / "journal", "write")
    journaled = [e for _, evs, _, _ in j.replay(0) for e in evs]
    senders = dict(j.senders)
    j.close()
    assert Counter(journaled) == Counter(expected)  # exactly once
    assert list(senders.values()) == [n]


def test_cayuga_send_gives_up_with_one_line_when_no_server_comes(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text(lines(1, 3))
    with socket.socket() as closed:  # bound, never listening: a port that refuses connections and stays ours
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "clients.cli", "send", str(path), "--url",
                            f"http://127.0.0.1:{port}", "--port", str(port), "--retry-for", "1"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("cayuga: gave up after 1 s of retries: cannot reach")


def test_cayuga_send_says_at_once_that_it_cannot_reach_the_server_and_for_how_long_it_retries(tmp_path):
    """Issue 35: a stopped server meant a minute of silence, then "gave up". The first
    line comes while it still retries (it is read before the process is stopped)."""
    from clients.testing import stop_process

    path = tmp_path / "e.jsonl"
    path.write_text(lines(1, 3))
    with socket.socket() as closed:  # bound, never listening: a port that refuses connections and stays ours
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "send", str(path), "--url", url,
                                 "--retry-for", "600"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True)
        reader.start()
        try:
            wait_until(lambda: said or proc.poll() is not None, timeout=60, what="cayuga send's first line")
            assert proc.poll() is None, said  # still retrying
        finally:
            stop_process(proc)
            reader.join(10)
    assert said[0] == (f"cayuga: cannot reach the server at {url}: [Errno 111] Connection refused; is cayuga serve "
                       "running there? (--url or CAYUGA_URL names another); retrying for up to 600 s (--retry-for)\n")


def test_a_block_split_by_a_full_queue_journals_each_parts_progress_without_a_pass_over_its_lines(start_server):
    """A sender's block larger than the queue's room goes in as several parts,
    each journaled with the sender's lines done up to it; when every line of the
    block is an event, that number is known without Batch.line_of's pass over the
    block's lines (server/ingest/connection.py). The reader runs on a thread here
    (receivers: 0), where the probe sees it."""
    srv = start_server(queue_capacity=300, receivers=0)
    calls = Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name in ("line_of", "_read_lines"):
            calls[frame.f_code.co_name] += 1

    n = 6000
    threading.setprofile(profile)  # the connection's receiver thread starts with it
    try:
        s = socket.create_connection(("127.0.0.1", tcp_port(srv)), timeout=10)
        s.sendall(b"#sender split\n" + lines(1, n).encode())
        wait_until(lambda: srv.daemon.queue.progress("split") >= n, timeout=60, what=f"{n} lines of sender split")
        s.close()
    finally:
        threading.setprofile(None)
    records = [(len(r.events), r.lines_done) for r in srv.daemon.journal.replay(0) if r.sender == "split"]
    assert len(records) > 1  # parts of blocks
    done = 0
    for events, lines_done in records:
        done += events
        assert lines_done == done
    assert done == n and calls["line_of"] == 0 and calls["_read_lines"] == 1
