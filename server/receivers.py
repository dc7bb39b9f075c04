"""TCP event receivers: one listener thread, one thread per connection.

Protocol (documented in the README): the client sends one event per line, as
JSON lines by default. A first line ``#format cayuga`` or ``#format csv``
(``#format jsonl`` too) selects another format for the rest of the
connection; with CSV the next line is the header. A line that cannot become
an event gets one line back on the same connection::

    error line 7: attribute 'Price' must be float, got 'cheap'

and is counted; the connection stays open. A client that does not read these
lines (one cannot be sent within POLL seconds) is sent no more of them on that
connection; they are still counted. Events without timestamps get point
timestamps from the server clock. When the queue is full the receiver stops
reading until there is room, so TCP flow control pushes back on the sender.

Limits, each refusal counted (``cayuga_tcp_refusals_total{reason}``): at most
``max_connections`` connections and ``max_connections_per_address`` from one
client address (a refused client gets ``error: ...`` and is closed); a
connection that sends no complete line for ``idle_timeout`` seconds is closed
with ``error: idle ...``. With ``auth_tokens`` set, the first line must be
``#token <token>`` (then ``#format`` may follow), within ``AUTH_SECONDS``;
otherwise the client gets ``error line 1: ...`` and is closed. An event whose
``t1`` is more than ``max_future`` seconds ahead of the clock, or with a string
value longer than ``max_value_bytes``, gets an error line like any bad line.

Whatever whole lines one read brings (up to :data:`RECV_BYTES`) are decoded as
one block (``Decoder.decode_batch``) and queued as one block
(``DelayQueue.put_batch``); line numbers count over the whole connection.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from typing import Callable, Iterable

from server.formats import FORMATS, make_decoder
from server.limits import AddressSlots, refusals, without
from server.metrics import Counters
from server.queue import DelayQueue, QueueClosed

log = logging.getLogger("cayuga.receivers")

POLL = 0.25  # seconds between checks of the stop flag while blocked
#: Bytes read from a connection at once: the lines in them are decoded and
#: queued as one block.
RECV_BYTES = 1 << 16
#: Seconds a client has to send its ``#token`` line when tokens are required.
AUTH_SECONDS = 10.0
#: Why a connection was refused or closed: the label of cayuga_tcp_refusals_total.
REFUSALS = ("max_connections", "per_address", "idle", "auth")


class TcpReceiver:
    def __init__(self, host: str, port: int, queue: DelayQueue, catalog: Callable, clock: Callable[[], float],
                 counters: Counters, *, max_connections: int = 64, max_line_bytes: int = 1 << 20,
                 time_unit_ms: float = 1.0, streams: Callable[[], Iterable[str]] = tuple,
                 max_per_address: int = 16, idle_timeout: float = 300.0, tokens: Iterable[str] = (),
                 horizon: Callable[[], float | None] = lambda: None, max_value_bytes: int = 1 << 16,
                 stamp: bool = True) -> None:
        """``catalog`` maps a stream name to its schema (or None); ``streams()``
        names the streams to prepare typed decoding for on each connection;
        ``horizon()`` the latest t1 accepted now (None: no bound); ``stamp``
        whether events without timestamps get the clock's time (else refused)."""
        self.host = host
        self.requested_port = port
        self.queue = queue
        self.catalog = catalog
        self.clock = clock
        self.counters = counters
        self.max_line_bytes = max_line_bytes
        self.time_unit_ms = time_unit_ms
        self.streams = streams
        self.idle_timeout = idle_timeout
        self.tokens = [t.encode() for t in tokens]
        self.horizon = horizon
        self.max_value_bytes = max_value_bytes
        self.stamp = stamp
        self._slots = threading.BoundedSemaphore(max_connections)
        self._addresses = AddressSlots(max_per_address)
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._listener: threading.Thread | None = None
        self._conns: dict[threading.Thread, socket.socket] = {}
        self._muted: set[socket.socket] = set()  # connections that stopped reading their error lines
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
            if not self._addresses.acquire(addr[0]):
                self._refuse(conn, "per_address", f"too many connections from {addr[0]} (at most "
                             f"{self._addresses.per_address}: the max_connections_per_address setting)")
                continue
            if not self._slots.acquire(blocking=False):
                self._addresses.release(addr[0])
                self._refuse(conn, "max_connections", "too many connections; try again later")
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
                    self._muted.discard(conn)
                self._slots.release()
                self._addresses.release(addr[0])

    def _refuse(self, conn: socket.socket, reason: str, message: str) -> None:
        """Count a refusal, tell the client why, close."""
        self.counters.add(f"tcp_refused_{reason}")
        log.info("TCP connection refused (%s): %s", reason, message)
        try:
            conn.settimeout(1.0)
            conn.sendall(f"error: {message}\n".encode())
        except OSError:
            pass
        finally:
            conn.close()

    def _blocks(self, conn: socket.socket):
        """Yield ``(first_line_number, block)`` until EOF or stop: ``block`` is
        whole lines (bytes, newline-terminated but for a final line at EOF), or
        None for one line longer than ``max_line_bytes`` (skipped to its end)."""
        buf = b""
        number = 1  # of the first line in buf
        skipping = False
        limit = self.max_line_bytes
        idle = min(self.idle_timeout, AUTH_SECONDS) if self.tokens else self.idle_timeout
        heard = time.monotonic()  # when the last complete line came (or the connection opened)
        while not self._stop.is_set():
            try:
                chunk = conn.recv(RECV_BYTES)
            except socket.timeout:
                if time.monotonic() - heard > idle:
                    self.counters.add("tcp_refused_idle")
                    log.info("closing idle TCP connection after %.0f s", idle)
                    conn.sendall(f"error: idle for {idle:g} s without a complete line "
                                 "(the idle_timeout setting); closing\n".encode())
                    return
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
            heard = time.monotonic()
            idle = self.idle_timeout  # the token line, if one was due, has come
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
        authenticated = not self.tokens
        for number, block in self._blocks(conn):
            if not authenticated:
                if block is None or not self._authenticate(block.partition(b"\n")[0]):
                    self.counters.add("tcp_refused_auth")
                    self._reject(conn, number, "authentication required: the first line must be "
                                 "'#token <token>' with one of the server's auth_tokens; closing", counted=False)
                    return
                authenticated = True
                block = block.partition(b"\n")[2]
                number += 1
                if not block:
                    continue
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
            events = batch.events
            if not events:
                continue
            index = None  # position in batch.events of each event queued, when some were refused
            refused = refusals(events, len(block), horizon=self.horizon(), max_value=self.max_value_bytes)
            if refused:
                for i, reason in sorted(refused.items()):
                    self._reject(conn, batch.line_of(i), reason)
                events, index = without(events, refused)
            late = self._enqueue(events)
            for i in late:
                j = i if index is None else index[i]
                self._reject(conn, batch.line_of(j), f"late: t1={events[i].t1} is older than events already "
                             "processed (see the time setting in the README)", counted=False)

    def _authenticate(self, line: bytes) -> bool:
        word, _, token = line.strip().partition(b" ")
        token = token.strip()
        return word == b"#token" and any(hmac.compare_digest(token, t) for t in self.tokens)

    def _decoder(self, fmt: str):
        return make_decoder(fmt, self.catalog, clock=self.clock if self.stamp else None,
                            time_unit_ms=self.time_unit_ms, streams=self.streams())

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
        if conn in self._muted:
            return
        try:
            conn.sendall(f"error line {number}: {reason}\n".encode())
        except OSError:  # the client does not read its error lines: stop sending them (each would wait POLL)
            with self._lock:
                self._muted.add(conn)
            self.counters.add("tcp_error_lines_muted")
            log.info("a TCP client does not read its error lines; no more are sent on that connection")
