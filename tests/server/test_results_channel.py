"""The results channel (server/workers/channel.py): an engine worker's batch
results go to the main process's engine thread on a socket of their own, which
that thread waits on together with the event queue and reads itself.

What must hold: the worker never waits for the main process to read (else a
main process blocked writing a batch to a worker blocked writing a result would
stand still for ever), results and the answers to a check's decisions keep their
order, a worker's end is seen, and the queue's wait ends for a readable
descriptor as it does for events."""

from __future__ import annotations

import os
import pickle
import socket
import threading

import pytest

from air.cel.compiler import compile_cel
from air.engine import Event
from air.model import parse_stream_decl
from server.ingest.queue import DelayQueue
from server.workers import codec
from server.workers.channel import ResultReader, ResultWriter
from server.workers.link import WorkerLink, worker_settings
from tests.server.conftest import make_settings

MB = 1 << 20


def _in_thread(fn, *args, timeout: float = 120) -> list:
    """``fn(*args)`` on a thread; its value (the thread is joined: a hang fails the test, not the suite)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn.__name__} is still waiting"
    return out


def test_a_writer_never_waits_for_its_reader_and_the_order_is_kept():
    """Twenty 1 MiB results and answers between them, many times what the socket holds, are
    sent while nobody reads; then they are read whole and in order, the answers handed on
    in their place, and the writer's end is seen once after the last."""
    mine, theirs = socket.socketpair()
    writer = ResultWriter(theirs)
    msgs = []
    for i in range(20):
        msgs.append(codec.RESULT + bytes([i]) * MB)
        if i % 5 == 4:
            msgs.append(codec.ANSWER + pickle.dumps((0, True, i)))

    def send_all():
        for m in msgs:
            writer.send(m)
        return writer.backlog

    assert _in_thread(send_all)[0] > 10 * MB  # (held by its writer thread: the socket took a little)
    applied: list = []
    closed = []
    reader = ResultReader(mine, lambda body: applied.append(pickle.loads(body)[2]), lambda: closed.append(True))
    for i in range(20):
        tag, body = reader.get(timeout=60)
        assert tag == codec.RESULT and len(body) == MB and body == bytes([i]) * MB
        assert applied[:i // 5] == [4, 9, 14, 19][:i // 5]  # every answer sent before it handed on first
    writer.close()
    assert reader.get(timeout=60) == (b"", None) and closed == [True]
    assert applied == [4, 9, 14, 19]
    assert reader.fileno() == -1
    reader.close()


def test_a_reader_with_nothing_to_read_says_empty_at_once():
    import queue

    mine, theirs = socket.socketpair()
    reader = ResultReader(mine, lambda body: None)
    try:
        reader.get_nowait()
        raise AssertionError("a result out of nothing")
    except queue.Empty:
        pass
    assert reader.empty()
    ResultWriter(theirs).send(codec.RESULT + b"x")
    assert reader.get(timeout=60) == (codec.RESULT, b"x")
    theirs.close()
    reader.close()


def test_a_message_that_comes_in_pieces_is_waited_for_by_nobody():
    """A result whose length and body come in pieces (as from a worker stopped, or slow, in the
    middle of its write): every wait before its last byte ends empty when its time is up, never
    held until the rest comes; once whole it is handed out once, followed by the messages that
    shared its last read, and an answer among them is handed on in its place."""
    import queue
    import struct

    mine, theirs = socket.socketpair()
    applied: list = []
    reader = ResultReader(mine, lambda body: applied.append(pickle.loads(body)[2]))
    big = codec.RESULT + bytes(range(256)) * 4096  # 1 MiB and a byte: more than one read takes
    framed = struct.pack("!Q", len(big)) + big
    answer = codec.ANSWER + pickle.dumps((0, True, "applied"))
    after = struct.pack("!Q", len(answer)) + answer + struct.pack("!Q", 3) + codec.RESULT + b"ok"
    pieces = [framed[:3], framed[3:8], framed[8:9]] + [framed[i:min(i + 100_000, len(framed) - 1)]
                                                       for i in range(9, len(framed) - 1, 100_000)]
    pieces.append(framed[-1:] + after)  # (each piece less than the socket holds: the reader drains each)
    for piece in pieces[:-1]:
        theirs.sendall(piece)
        for wait in (reader.get_nowait, lambda: reader.get(timeout=0.05)):
            def empty(wait=wait):
                try:
                    return wait()
                except queue.Empty:
                    return "empty"
            assert _in_thread(empty, timeout=30) == ["empty"]  # (a wait held by the rest fails here)
        assert reader.empty() and reader.fileno() == mine.fileno()
    theirs.sendall(pieces[-1])
    assert reader.get(timeout=60) == (codec.RESULT, big[1:])
    assert applied == ["applied"]  # (read with the result that follows it, handed on before that is taken)
    assert reader.get(timeout=60) == (codec.RESULT, b"ok")
    assert reader.empty()
    theirs.close()
    reader.close()


def test_a_worker_gone_in_the_middle_of_a_message_ends_the_channel_without_it():
    """The end comes after a message's first half (the worker died writing it): the messages
    before it are handed out, the half is not, and the end is seen once."""
    import struct

    mine, theirs = socket.socketpair()
    closed: list = []
    reader = ResultReader(mine, lambda body: None, lambda: closed.append(True))
    whole = codec.RESULT + b"first"
    half = codec.RESULT + b"x" * 1000
    theirs.sendall(struct.pack("!Q", len(whole)) + whole + struct.pack("!Q", len(half)) + half[:500])
    assert reader.get(timeout=60) == (codec.RESULT, b"first")
    theirs.close()
    assert reader.get(timeout=60) == (b"", None)
    assert closed == [True] and reader.fileno() == -1
    reader.close()


def test_the_queues_wait_ends_for_a_readable_descriptor_for_events_and_for_wake():
    """``get_batch(fds=...)``: a result on one of the descriptors ends the wait with no events
    (as a nudge); events that come during it end it with them; :meth:`wake` ends it too."""
    q = DelayQueue(100, event_time=True)
    r, w = socket.socketpair()
    started = threading.Event()

    def wait_then(action):
        def go():
            started.set()
            return q.get_batch(10, timeout=600, fds=[r.fileno()])
        t_out: list = []
        t = threading.Thread(target=lambda: t_out.append(go()), daemon=True)
        t.start()
        started.wait()
        action()
        t.join(120)
        assert not t.is_alive()
        started.clear()
        return t_out[0]

    assert wait_then(lambda: w.send(b"!")) == []
    r.recv(1)
    got = wait_then(lambda: q.put_batch([Event("Stock", ("A", 1.0, 1), 1, 1),
                                            Event("Stock", ("A", 2.0, 1), 2, 2)]))
    assert [e.values[1] for e in got] == [1.0, 2.0]
    assert wait_then(q.wake) == []
    # a wake written after a wait's poll ended (before the lock was taken again, so not read then) is
    # read by the next wait, and does not stay to end later waits at once
    with q._lock:
        q._fd_waiting = True
        q._notify()
    assert wait_then(lambda: w.send(b"!")) == []
    r.recv(1)
    with pytest.raises(BlockingIOError):
        os.read(q._waker[0], 1)
    assert [e.values[1] for e in wait_then(lambda: q.put_batch([Event("Stock", ("A", 3.0, 1), 3, 3)]))] == [3.0]
    q.close()
    r.close()
    w.close()


def _worker(tmp_path) -> tuple[WorkerLink, bytes]:
    """A real worker with one subscription that echoes every event, and a batch whose result is
    about 4 MiB (40 events of 100 KiB names)."""
    link = WorkerLink(worker_settings(make_settings(tmp_path, engine_workers=1)))
    link.start()
    schema = parse_stream_decl("Stock(Name string, Price float, Volume int)")
    link.call("declare", schema)
    q = compile_cel("SELECT * FROM FILTER{Price > 0}(Stock) PUBLISH Echo", [schema])
    link.call("add", "echo", tuple(q.automata))

    def batch(fed: int) -> bytes:
        evs = [Event("Stock", (chr(65 + i % 26) * 100_000, 1.0 + i, 1), fed - 40 + i, fed - 40 + i)
               for i in range(40)]
        return codec.encode_batch(fed, [], evs)

    return link, batch


def test_a_worker_answers_commands_while_its_large_results_wait_unread(tmp_path):
    """The deadlock the channel must not have, with a real worker: three batches whose results
    are many times what a socket holds go out and nobody reads them; the worker still takes
    what comes on its pipe and answers a command. Then the three results come whole, in order."""
    link, batch = _worker(tmp_path)
    try:
        for k in range(1, 4):
            link.send(batch(40 * k))
        assert link.call("stats", timeout=120) is not None  # answered: the worker is not stuck writing
        for k in range(1, 4):
            tag, body = link.results.get(timeout=120)
            assert tag == codec.RESULT
            result = codec.decode_result(body)
            assert result[0] == 40  # events
            assert result[9].count() == 40  # every event's witness, with its 100 KiB
        assert link.results.empty()
    finally:
        link.stop()
    assert link.results.fileno() == -1 or link.process.poll() is not None


def test_drain_reads_to_the_end_in_one_call():
    """A worker that has gone: :meth:`drain` takes its last result and its answer and sees the
    end in one call (``pump(0)`` stops at a read that emptied the socket; a restart reads a dead
    worker's last answers with ``drain``)."""
    import struct

    mine, theirs = socket.socketpair()
    closed: list = []
    applied: list = []
    reader = ResultReader(mine, lambda body: applied.append(pickle.loads(body)[2]), lambda: closed.append(True))
    answer = codec.ANSWER + pickle.dumps((0, True, "last"))
    result = codec.RESULT + b"done"
    theirs.sendall(struct.pack("!Q", len(answer)) + answer + struct.pack("!Q", len(result)) + result)
    theirs.close()
    reader.drain()
    assert applied == ["last"] and closed == [True] and reader.fileno() == -1
    assert reader.get_nowait() == (codec.RESULT, b"done")
    assert reader.get_nowait() == (b"", None)
    reader.close()


def test_a_command_failed_twice_at_a_workers_end_keeps_the_first_failure():
    """The reader thread that sees a worker's end fails every pending command; a command whose
    send met that end fails its own too. Whichever comes second must not raise (it did, as
    InvalidStateError, on the engine thread, which then ended: a CI run of the plain-Python build,
    2026-12-02)."""
    from concurrent.futures import Future

    from server.workers.link import WorkerGone, _fail

    fut: Future = Future()
    _fail(fut, WorkerGone("first"))
    _fail(fut, WorkerGone("second"))
    assert str(fut.exception()) == "first"
