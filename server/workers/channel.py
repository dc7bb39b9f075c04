"""The results channel: an engine worker's batch results, read by the main
process's engine thread straight from their socket.

A worker has two sockets to the main process. The first carries everything
else (batches and commands in, commands' answers and snapshots' ends out) and
is read there by the link's reader thread (server/workers/link.py). This one
carries, worker -> main, only what the engine thread takes: each batch's
result (``R``) and the answer to the decisions of a check (``A`` numbered 0),
in the order the worker made them. The engine thread waits on it together with
the event queue (server/ingest/queue.py's ``get_batch(fds=...)``), so a result
wakes the thread that delivers it and no other: before, a result woke the
reader thread, which queued it and woke the engine thread, two hand-overs of
the interpreter lock on every batch's path (BENCHMARKS.md, "Engine workers,
round 15").

No deadlock either way: the worker never waits for the engine thread to read.
:class:`ResultWriter` writes a message at once when the socket takes it whole
and hands the rest to a thread of its own otherwise (which ends once it has
written it all), so the worker goes on
reading its first socket, which the main process may be blocked writing to.
What waits there is bounded by the batches in flight (``dispatch.MAX_IN_FLIGHT``).

A message is its length (8 bytes, big-endian) and then its bytes: a tag byte
and a body, as on the first socket (server/workers/codec.py).
"""

from __future__ import annotations

import queue
import select
import socket
import struct
import threading
import time
from collections import deque
from typing import Callable

from server.workers.codec import ANSWER

_LENGTH = struct.Struct("!Q")
_CHUNK = 1 << 18  # what one read asks for (a batch's result is usually less: one read takes it whole)

#: Seconds the worker's writer thread waits to end once the worker has (what it still
#: holds is the main process's to read; it is stopping, or gone).
FLUSH_TIMEOUT = 2.0


class ResultWriter:
    """The worker's end (see the module's docstring). ``send`` never blocks on the
    socket: what it does not take at once is written by a ``cayuga-results-writer``
    thread, in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._cond = threading.Condition()
        self._backlog: deque[memoryview] = deque()  # what the socket has not taken yet, in order
        self._writing = False  # the writer thread holds the head of the backlog
        self._error: OSError | None = None  # the writer thread's failure (the main process has gone)
        self._thread: threading.Thread | None = None  # the writer thread, while there is a backlog

    def send(self, msg: bytes) -> None:
        header = _LENGTH.pack(len(msg))
        with self._cond:
            if self._error is not None:
                raise self._error
            if not self._backlog and not self._writing:
                try:
                    sent = self.sock.sendmsg([header, msg], [], socket.MSG_DONTWAIT)
                except BlockingIOError:
                    sent = 0
                if sent == len(header) + len(msg):
                    return
                rest = memoryview(header + msg)[sent:]
            else:
                rest = memoryview(header + msg)
            self._backlog.append(rest)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write, name="cayuga-results-writer", daemon=True)
                self._thread.start()
            self._cond.notify()

    @property
    def backlog(self) -> int:
        """Bytes written by none yet (the main process is behind)."""
        with self._cond:
            return sum(len(m) for m in self._backlog)

    def _write(self) -> None:
        while True:
            with self._cond:
                if not self._backlog:  # (the next backlog starts another: the worker forks for its
                    self._thread = None  # snapshots, best with one thread)
                    self._cond.notify_all()
                    return
                self._writing = True
                head = self._backlog.popleft()
            try:
                self.sock.sendall(head)  # (blocking: the socket is; only send() asks it not to wait)
            except OSError as exc:
                with self._cond:
                    self._error, self._writing = exc, False
                    self._backlog.clear()
                return
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def close(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Let the writer thread write what it holds (for ``timeout`` at most), then close."""
        with self._cond:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self.sock.close()


class ResultReader:
    """The main process's end, read by one thread (the engine thread; a restart's
    catch-up, on that thread too). Answers to a check's decisions go to
    ``on_applied`` as they are read; results are handed out in order by
    :meth:`get`. ``(b"", None)`` once the worker has gone: its socket closed, after
    ``on_closed`` (which waits until the link says why) has returned."""

    def __init__(self, sock: socket.socket, on_applied: Callable[[bytes], None],
                 on_closed: Callable[[], None] = lambda: None) -> None:
        self.sock = sock
        self.on_applied = on_applied
        self.on_closed = on_closed
        self._ready: deque[tuple[bytes, bytes | None]] = deque()
        self._ended = False
        self._head = b""  # the start of a message's length, when a read ended inside it
        self._partial: bytearray | None = None  # a message begun, its length's room, filled as it comes
        self._got = 0  # the bytes of ``_partial`` filled
        self._poll = select.poll()  # (not select(): a server's descriptors may be past FD_SETSIZE)
        self._poll.register(sock, select.POLLIN)

    def fileno(self) -> int:
        """The socket's descriptor (-1 once it has ended: nothing more to wait for)."""
        return -1 if self._ended else self.sock.fileno()

    def get(self, timeout: float | None = None) -> tuple[bytes, bytes | None]:
        """The next result (its tag and body); waits up to ``timeout`` seconds (None:
        as long as it takes), raises :class:`queue.Empty` when none came (as the
        :class:`queue.Queue` the reader thread used to fill)."""
        if not self._ready:
            self.pump(timeout)
        if not self._ready:
            raise queue.Empty
        return self._ready.popleft()

    def get_nowait(self) -> tuple[bytes, bytes | None]:
        return self.get(0)

    def empty(self) -> bool:
        """Nothing to take now (what has arrived is read first)."""
        if not self._ready:
            self.pump(0)
        return not self._ready

    def waiting(self) -> int:
        """Results read and not taken yet: answered by the worker, waiting for the engine thread,
        which takes them in the order of the batches (a length read once: from any thread)."""
        return max(0, len(self._ready) - self._ended)  # (the end's mark is none)

    def pump(self, timeout: float | None = 0) -> None:
        """Read what has arrived (waiting up to ``timeout`` for a result if none is in hand):
        results kept for :meth:`get`, answers handed on. Never waits for the rest of a
        message begun: what has come of it is kept for the next call (a worker stopped in the
        middle of a write holds up no other worker's results, nor the events)."""
        if self._ended:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not self._read_available():
                self._end()
                return
            if self._ready:
                return
            wait = None if deadline is None else (deadline - time.monotonic()) * 1000
            if wait is not None and wait <= 0 or not self._poll.poll(wait):
                return

    def drain(self) -> None:
        """Read all that has come and the end if it has come too (a worker that has gone: what
        it sent before it died), without waiting: :meth:`pump` stops at a read that emptied
        the socket and sees the end at its next call."""
        if not self._ended and not self._read_available(to_end=True):
            self._end()

    def _read_available(self, to_end: bool = False) -> bool:
        """Take every byte the socket holds now, without waiting (one ``recv`` where a message
        or more has come whole: no poll before it, no read of a length then of a body); False
        at the worker's end (``to_end``: read until the socket has nothing, to see an end that
        came after the last message)."""
        while True:
            partial = self._partial
            try:
                if partial is not None:  # the rest of a large message: straight into its place
                    n = self.sock.recv_into(memoryview(partial)[self._got:], 0, socket.MSG_DONTWAIT)
                    if n == 0:
                        return False
                    self._got += n
                    if self._got == len(partial):
                        self._partial = None
                        self._take(partial, 0, len(partial))
                    continue
                data = self.sock.recv(_CHUNK, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:  # (a reset: the worker has gone)
                return False
            if not data:
                return False
            self._split(self._head + data if self._head else data)
            if len(data) < _CHUNK and not to_end:
                return True  # (the socket had no more then: what comes after wakes the next wait)

    def _split(self, data: bytes) -> None:
        """The whole messages of ``data`` taken; the start of the next one kept."""
        p, n = 0, len(data)
        size = _LENGTH.size
        while n - p >= size:
            length = _LENGTH.unpack_from(data, p)[0]
            if n - p - size >= length:
                self._take(data, p + size, p + size + length)
                p += size + length
            else:  # begun: room for all of it, filled by the next reads
                self._partial = bytearray(length)
                got = n - p - size
                self._partial[:got] = memoryview(data)[p + size:]
                self._got = got
                self._head = b""
                return
        self._head = data[p:]  # (a length not whole yet)

    def _take(self, data: bytes | bytearray, start: int, end: int) -> None:
        """The message at ``data[start:end]``: its tag, and its body copied out once."""
        tag, body = bytes(data[start:start + 1]), bytes(memoryview(data)[start + 1:end])
        if tag == ANSWER:  # (the answer to a check's decisions, numbered 0)
            self.on_applied(body)
        else:
            self._ready.append((tag, body))

    def _end(self) -> None:
        """The worker has gone (what it left unfinished is dropped: it never made a whole message)."""
        self._ended = True
        self._partial, self._head = None, b""
        self.on_closed()
        self._ready.append((b"", None))

    def close(self) -> None:
        self._ended = True
        self.sock.close()
