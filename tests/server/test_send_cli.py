"""``cayuga send`` as a process against a real server (issue 19): it never
hangs, sends only what the server lacks, and ends every wait with a reason.

Each test runs ``cayuga send`` as a subprocess with a modest timeout: a hang
shows as ``TimeoutExpired``. The servers are in-process ``RunningServer``s on
loopback ports picked by the kernel; the one test that needs a server to say
something a real one cannot be made to say on demand (a full disk) talks to a
scripted peer on a real loopback socket."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest

from clients.testing import wait_until
from tests.server.conftest import stock

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a ``cayuga send`` run may take here before it counts as hung.
HUNG = 30


def cayuga_send(path: Path, srv, *args: str, timeout: float = HUNG) -> subprocess.CompletedProcess:
    url, port = (srv.base_url, srv.tcp_port) if not isinstance(srv, tuple) else srv
    return subprocess.run([sys.executable, "-m", "clients.cli", "send", str(path), "--url", url,
                           "--port", str(port), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def write_events(path: Path, n: int, fmt: str = "jsonl") -> list[int]:
    """A file of ``n`` Stock events, Volume 1..n (with ``csv``, a header line first)."""
    if fmt == "csv":
        text = "stream,t0,t1,Name,Price,Volume\n" + "".join(f"Stock,{i},{i},IBM,{i}.0,{i}\n" for i in range(1, n + 1))
    else:
        text = "".join(json.dumps(stock("IBM", float(i), i, i)) + "\n" for i in range(1, n + 1))
    path.write_text(text)
    return list(range(1, n + 1))


def journaled_volumes(srv) -> Counter:
    """How often each Volume is in the server's journal."""
    return Counter(e.values[2] for _, evs, _, _ in srv.daemon.journal.replay(0) for e in evs)


def metric(srv, name: str) -> float:
    for line in httpx.get(srv.base_url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def last_line(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    return r.stderr.strip().splitlines()[-1]


# --------------------------------------------------------------------------- what the server already has


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_sending_a_file_again_sends_nothing_and_exits_0_at_once(start_server, tmp_path, fmt):
    srv = start_server(durability="write")
    path = tmp_path / f"events.{fmt}"
    write_events(path, 30, fmt)
    lines = 31 if fmt == "csv" else 30
    r = cayuga_send(path, srv, "--format", fmt)  # the default sender id: derived from the file
    assert r.returncode == 0, r.stderr
    assert last_line(r) == f"cayuga: sent {lines} lines, 0 rejected, {lines} acknowledged"

    r = cayuga_send(path, srv, "--format", fmt, timeout=20)
    assert r.returncode == 0, r.stderr
    assert last_line(r).startswith(f"cayuga: nothing new to send: the server already has all {lines} lines of "
                                   f"{path} (sender id send-")
    assert metric(srv, 'cayuga_events_received_total{source="tcp"}') == 30
    assert journaled_volumes(srv) == Counter(range(1, 31))


def test_a_file_rewritten_in_place_is_sent_as_new(start_server, tmp_path):
    """The default sender id counts the content: the same path and size with
    other lines is not "nothing new"."""
    srv = start_server(durability="write")
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(stock("IBM", 1.0, i, 10 + i)) + "\n" for i in range(1, 21)))
    assert cayuga_send(path, srv).returncode == 0
    size = path.stat().st_size
    path.write_text("".join(json.dumps(stock("XYZ", 1.0, i, 50 + i)) + "\n" for i in range(1, 21)))  # later times
    assert path.stat().st_size == size
    r = cayuga_send(path, srv, timeout=20)
    assert r.returncode == 0, r.stderr
    assert last_line(r) == "cayuga: sent 20 lines, 0 rejected, 20 acknowledged"
    names = Counter(e.values[0] for _, evs, _, _ in srv.daemon.journal.replay(0) for e in evs)
    assert names == {"IBM": 20, "XYZ": 20}


def test_a_half_sent_file_resumes_and_the_server_has_each_line_once(start_server, tmp_path):
    """A first sender is cut off in the middle of line 26 (as a ``cayuga
    send`` killed inside a write is); sending the file again sends lines
    26-50, line 26 whole, and the server has each line exactly once."""
    srv = start_server(durability="write")
    path = tmp_path / "events.jsonl"
    write_events(path, 50)
    text = path.read_bytes()
    cut = text.index(b"\n", text.index(b'"Volume": 26')) - 10  # inside line 26
    first = socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10)
    with first, first.makefile("rb") as reply:  # both: the socket stays open while its file is
        first.sendall(b"#sender half\n#ack\n")
        assert reply.readline() == b"#resume 0\n"
        first.sendall(text[:cut])
        while reply.readline() != b"#ack 25\n":
            pass
    wait_until(lambda: srv.daemon.receiver.connections == 0, 10, "the first connection to end")

    r = cayuga_send(path, srv, "--sender-id", "half", timeout=20)
    assert r.returncode == 0, r.stderr
    assert journaled_volumes(srv) == Counter(range(1, 51))  # line 26 neither lost nor twice
    assert srv.daemon.journal.senders["half"] == 50
    assert (f"cayuga: the server already has lines 1-25 of {path} (sender id half); sending lines 26-50"
            in r.stderr.splitlines())
    assert last_line(r) == "cayuga: sent 25 lines, 0 rejected, 50 acknowledged"
    assert metric(srv, 'cayuga_events_received_total{source="tcp"}') == 50
    assert metric(srv, 'cayuga_events_rejected_total{source="tcp"}') == 0


def test_a_sender_id_with_more_lines_than_the_file_is_refused(start_server, tmp_path):
    srv = start_server(durability="write")
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    write_events(big, 40)
    write_events(small, 10)
    assert cayuga_send(big, srv, "--sender-id", "shared").returncode == 0
    r = cayuga_send(small, srv, "--sender-id", "shared", timeout=20)
    assert r.returncode == 1
    assert last_line(r) == (f"cayuga: the server already has 40 lines from sender id shared, more than the 10 "
                            f"lines of {small}: that id was used to send another file (or this one before it was "
                            "changed); give --sender-id an id of its own for this file")
    assert metric(srv, 'cayuga_events_received_total{source="tcp"}') == 40


# --------------------------------------------------------------------------- another connection holds the id


def test_a_second_sender_with_a_connected_id_gives_up_with_the_reason(start_server, tmp_path):
    srv = start_server()
    path = tmp_path / "events.jsonl"
    write_events(path, 10)
    holder = socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10)
    with holder, holder.makefile("rb") as reply:
        holder.sendall(b"#sender taken\n")
        assert reply.readline() == b"#resume 0\n"
        r = cayuga_send(path, srv, "--sender-id", "taken", "--retry-for", "2", timeout=20)
    assert r.returncode == 1
    said = r.stderr.strip().splitlines()
    assert said[0] == ("cayuga: another connection with sender id taken is still open (the server refuses a "
                       "second one); retrying for up to 2 s (--retry-for)")
    assert last_line(r) == ("cayuga: gave up after 2 s of retries: another connection with sender id taken is "
                            "still open (the server refuses a second one): wait until it ends (is another cayuga "
                            "send of this file running?) and run this again, or give --sender-id another id to "
                            "send the file as a new sender; 0 of 10 lines acknowledged")
    assert metric(srv, "cayuga_tcp_protocol_errors_total") >= 2  # it retried before giving up


def test_a_second_sender_gets_in_once_the_connected_one_ends(start_server, tmp_path):
    srv = start_server(durability="write")
    path = tmp_path / "events.jsonl"
    write_events(path, 10)
    holder = socket.create_connection(("127.0.0.1", srv.tcp_port), timeout=10)
    proc = None
    try:
        holder.sendall(b"#sender taken\n")
        with holder.makefile("rb") as reply:
            assert reply.readline() == b"#resume 0\n"
        proc = subprocess.Popen([sys.executable, "-m", "clients.cli", "send", str(path), "--url", srv.base_url,
                                 "--port", str(srv.tcp_port), "--sender-id", "taken", "--retry-for", "60"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: metric(srv, "cayuga_tcp_protocol_errors_total") >= 1, 20, "cayuga send to be refused once")
        holder.close()
        out, err = proc.communicate(timeout=HUNG)
    finally:
        holder.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "cayuga: sent 10 lines, 0 rejected, 10 acknowledged"
    assert journaled_volumes(srv) == Counter(range(1, 11))


# --------------------------------------------------------------------------- a server that takes nothing


@pytest.mark.parametrize("lines", [2_000, 300_000])
def test_a_server_that_takes_no_line_ends_the_send_with_the_reason(start_server, tmp_path, lines):
    """The engine is held busy, so the small queue fills, the receiver stops
    reading and no line is acknowledged: ``cayuga send`` gives up with the
    reason (waiting for acknowledgements with the small file; blocked in a
    write, most likely, with the large one). Once the engine is free again,
    a second run sends the rest and every line is journaled exactly once."""
    srv = start_server(durability="write", queue_capacity=100)
    path = tmp_path / "events.jsonl"
    write_events(path, lines)
    busy, holding = threading.Event(), threading.Event()

    def hold(engine):
        holding.set()
        busy.wait(60)

    try:
        srv.daemon.submit(hold)
        assert holding.wait(10), "the engine thread did not take the command"
        r = cayuga_send(path, srv, "--sender-id", "stuck", "--retry-for", "1", timeout=20)
    finally:
        busy.set()
    assert r.returncode == 1, r.stderr
    said = last_line(r)
    assert said.startswith("cayuga: gave up after 1 s of retries: the server has taken no line for "), said
    assert "(overloaded, shutting down, or its journal stuck?)" in said
    acked = int(said.split("; ")[-1].split(" of ")[0])
    assert acked < lines

    r = cayuga_send(path, srv, "--sender-id", "stuck", timeout=60)  # the connection given up may linger a moment
    assert r.returncode == 0, r.stderr
    assert journaled_volumes(srv) == Counter(range(1, lines + 1))


# --------------------------------------------------------------------------- a full disk


class ScriptedPeer:
    """A loopback TCP peer that answers each connection's ``#sender`` with
    ``#resume 0``, reads one data line, then says ``answer`` and closes, as a
    server whose disk is full does. Counts the connections."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scripted-peer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with conn, conn.makefile("rb") as reader:
                conn.settimeout(5)
                try:
                    while not reader.readline().startswith(b"#sender"):
                        pass
                    conn.sendall(b"#resume 0\n")
                    while reader.readline().startswith(b"#"):
                        pass
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sock.close()


def test_a_full_disk_is_retried_within_retry_for_then_named(tmp_path):
    path = tmp_path / "events.jsonl"
    write_events(path, 10)
    peer = ScriptedPeer(b"error: disk full: the journal could not be written (No space left on device); "
                        b"nothing from line 1 on was accepted; retry later\n")
    try:
        r = cayuga_send(path, ("http://127.0.0.1:9", peer.port), "--sender-id", "full", "--retry-for", "1",
                        timeout=20)
    finally:
        peer.close()
    assert r.returncode == 1
    assert last_line(r) == ("cayuga: gave up after 1 s of retries: the server's disk is full: the journal could not "
                            "be written (No space left on device); nothing from line 1 on was accepted; retry "
                            "later: free space on the server and run this again (it resumes); 0 of 10 lines "
                            "acknowledged")
    assert peer.connections >= 2  # it was retried


def test_reconnection_waits_double_up_to_the_cap_each_drawn_with_jitter():
    """Senders and watchers cut off by one server restart must not all return at
    once: each wait is drawn between half and all of the doubling step."""
    from clients.client import Backoff

    lo, hi = Backoff(rand=lambda: 0.0), Backoff(rand=lambda: 1.0)
    assert [round(lo.next(), 3) for _ in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.5, 2.5]
    assert [round(hi.next(), 3) for _ in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    hi.reset()
    assert hi.next() == 0.1
    waits = {round(Backoff().next(), 6) for _ in range(50)}  # the default draws at random
    assert len(waits) > 40 and all(0.05 <= w <= 0.1 for w in waits)
