"""TCP event receivers: one listener thread, one thread per connection.

Protocol (documented in the README): the client sends one event per line, as
JSON lines by default. A first line ``#format cayuga`` or ``#format csv``
(``#format jsonl`` too) selects another format for the rest of the
connection; with CSV the next line is the header. A line that cannot become
an event gets one line back on the same connection::

    error line 7: attribute 'Price' must be float, got 'cheap'

and is counted; the connection stays open. Events without timestamps get point
timestamps from the server clock. When the queue is full the receiver stops
reading until there is room, so TCP flow control pushes back on the sender.

Whatever whole lines one read brings (up to :data:`RECV_BYTES`) are decoded as
one block (``Decoder.decode_batch``) and queued as one block
(``DelayQueue.put_batch``); line numbers count over the whole connection.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable, Iterable

from server.formats import FORMATS, make_decoder
from server.metrics import Counters
from server.queue import DelayQueue, QueueClosed

log = logging.getLogger("cayuga.receivers")

POLL = 0.25  # seconds between checks of the stop flag while blocked
#: Bytes read from a connection at once: the lines in them are decoded and
#: queued as one block.
RECV_BYTES = 1 << 16


class TcpReceiver:
    def __init__(self, host: str, port: int, queue: DelayQueue, catalog: Callable, clock: Callable[[], float],
                 counters: Counters, *, max_connections: int = 64, max_line_bytes: int = 1 << 20,
                 time_unit_ms: float = 1.0, streams: Callable[[], Iterable[str]] = tuple) -> None:
        """``catalog`` maps a stream name to its schema (or None); ``streams()``
        names the streams to prepare typed decoding for on each connection."""
        self.host = host
        self.requested_port = port
        self.queue = queue
        self.catalog = catalog
        self.clock = clock
        self.counters = counters
        self.max_line_bytes = max_line_bytes
        self.time_unit_ms = time_unit_ms
        self.streams = streams
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._listener: threading.Thread | None = None
        self._conns: dict[threading.Thread, socket.socket] = {}
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1] if self._sock else self.requested_port

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.requested_port))
        sock.listen(128)
        sock.settimeout(POLL)
        self._sock = sock
        self._listener = threading.Thread(target=self._accept_loop, name="cayuga-tcp-listener", daemon=True)
        self._listener.start()
        log.info("event receiver listening on %s:%d", self.host, self.port)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, let connection threads finish their current line, join all."""
        self._stop.set()
        if self._listener:
            self._listener.join(timeout)
        with self._lock:
            conns = list(self._conns.items())
        for t, c in conns:
            t.join(timeout)
            if t.is_alive():
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                t.join(timeout)
        if self._sock:
            self._sock.close()

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, addr = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            if not self._slots.acquire(blocking=False):
                self.counters.add("connections_refused")
                try:
                    conn.sendall(b"error: too many connections; try again later\n")
                finally:
                    conn.close()
                continue
            conn.settimeout(POLL)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # error lines go back at once
            t = threading.Thread(target=self._serve, args=(conn, addr), name=f"cayuga-tcp-{addr[1]}", daemon=True)
            with self._lock:
                self._conns[t] = conn
            t.start()

    def _serve(self, conn: socket.socket, addr) -> None:
        try:
            self._read_lines(conn)
        except OSError as exc:
            log.debug("connection %s ended: %s", addr, exc)
        finally:
            try:
                conn.close()
            finally:
                with self._lock:
                    self._conns.pop(threading.current_thread(), None)
                self._slots.release()

    def _blocks(self, conn: socket.socket):
        """Yield ``(first_line_number, block)`` until EOF or stop: ``block`` is
        whole lines (bytes, newline-terminated but for a final line at EOF), or
        None for one line longer than ``max_line_bytes`` (skipped to its end)."""
        buf = b""
        number = 1  # of the first line in buf
        skipping = False
        limit = self.max_line_bytes
        while not self._stop.is_set():
            try:
                chunk = conn.recv(RECV_BYTES)
            except socket.timeout:
                continue
            if not chunk:
                break
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    continue
                chunk, skipping = chunk[nl + 1:], False
                number += 1
            buf = buf + chunk if buf else chunk
            last = buf.rfind(b"\n")
            if last < 0:
                if len(buf) > limit:
                    yield number, None
                    buf, skipping = b"", True
                continue
            block, buf = buf[:last + 1], buf[last + 1:]
            if len(block) > limit:  # rare: some line in it may be too long
                yield from self._split_long(block, number)
            else:
                yield number, block
            number += block.count(b"\n")
            if len(buf) > limit:
                yield number, None
                buf, skipping = b"", True
        if buf.strip() and not skipping and not self._stop.is_set():
            yield number, buf

    def _split_long(self, block: bytes, number: int):
        lines = block.split(b"\n")[:-1]
        start = 0
        for i, line in enumerate(lines):
            if len(line) > self.max_line_bytes:
                if i > start:
                    yield number + start, b"\n".join(lines[start:i]) + b"\n"
                yield number + i, None
                start = i + 1
        if start < len(lines):
            yield number + start, b"\n".join(lines[start:]) + b"\n"

    def _read_lines(self, conn: socket.socket) -> None:
        decoder = self._decoder("jsonl")
        first = True
        for number, block in self._blocks(conn):
            if block is None:
                self._reject(conn, number, f"line longer than {self.max_line_bytes} bytes")
                first = False
                continue
            if first:
                first = False
                if block.startswith(b"#format"):
                    header, _, block = block.partition(b"\n")
                    fmt = header[len(b"#format"):].decode("utf-8", "replace").strip().lower()
                    if fmt in FORMATS:
                        decoder = self._decoder(fmt)
                    else:
                        self._reject(conn, number, f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
                    number += 1
                    if not block:
                        continue
            batch = decoder.decode_batch(block, number)
            for line, reason in batch.errors:
                self._reject(conn, line, reason)
            if not batch.events:
                continue
            late = self._enqueue(batch.events)
            for i in late:
                self._reject(conn, batch.line_of(i), f"late: t1={batch.events[i].t1} is older than events "
                             "already processed", counted=False)

    def _decoder(self, fmt: str):
        return make_decoder(fmt, self.catalog, clock=self.clock, time_unit_ms=self.time_unit_ms,
                            streams=self.streams())

    def _enqueue(self, events) -> list[int]:
        """Queue a decoded block (blocking while the queue is full); the
        indexes of late events."""
        try:
            return self.queue.put_batch(events, on_accepted=self._count_received, cancel=self._stop)
        except QueueClosed:
            raise OSError("server stopping") from None

    def _count_received(self, n: int) -> None:
        self.counters.add("received_tcp", n)

    def _reject(self, conn: socket.socket, number: int, reason: str, counted: bool = True) -> None:
        if counted:
            self.counters.add("rejected_tcp")
        log.info("rejected line %d: %s", number, reason)
        try:
            conn.sendall(f"error line {number}: {reason}\n".encode())
        except OSError:
            pass
