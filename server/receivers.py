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
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

from server.formats import FORMATS, LineError, make_decoder
from server.metrics import Counters
from server.queue import DelayQueue, QueueClosed

log = logging.getLogger("cayuga.receivers")

POLL = 0.25  # seconds between checks of the stop flag while blocked


class TcpReceiver:
    def __init__(self, host: str, port: int, queue: DelayQueue, catalog: Callable, clock: Callable[[], float],
                 counters: Counters, *, max_connections: int = 64, max_line_bytes: int = 1 << 20,
                 time_unit_ms: float = 1.0) -> None:
        self.host = host
        self.requested_port = port
        self.queue = queue
        self.catalog = catalog
        self.clock = clock
        self.counters = counters
        self.max_line_bytes = max_line_bytes
        self.time_unit_ms = time_unit_ms
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

    def _lines(self, conn: socket.socket):
        """Yield (line_number, text) until EOF or stop; over-long lines yield an error marker."""
        buf = b""
        number = 0
        skipping = False
        while not self._stop.is_set():
            try:
                chunk = conn.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                break
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) > self.max_line_bytes and not skipping:
                        number += 1
                        skipping = True
                        yield number, None
                    if skipping:
                        buf = b""
                    break
                line, buf = buf[:nl], buf[nl + 1:]
                if skipping:
                    skipping = False
                    continue
                number += 1
                yield number, line
        if buf.strip() and not skipping and not self._stop.is_set():
            yield number + 1, buf

    def _read_lines(self, conn: socket.socket) -> None:
        decoder = make_decoder("jsonl", self.catalog, clock=self.clock, time_unit_ms=self.time_unit_ms)
        for number, raw in self._lines(conn):
            if raw is None:
                self._reject(conn, number, f"line longer than {self.max_line_bytes} bytes")
                continue
            text = raw.decode("utf-8", errors="replace").rstrip("\r")
            if number == 1 and text.startswith("#format"):
                fmt = text[len("#format"):].strip().lower()
                if fmt not in FORMATS:
                    self._reject(conn, number, f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
                    continue
                decoder = make_decoder(fmt, self.catalog, clock=self.clock, time_unit_ms=self.time_unit_ms)
                continue
            try:
                ev = decoder.decode(text)
            except LineError as exc:
                self._reject(conn, number, str(exc))
                continue
            if ev is None:
                continue
            if not self._enqueue(ev):
                self._reject(conn, number, f"late: t1={ev.t1} is older than events already processed",
                             counted=False)
                continue
            self.counters.add("received_tcp")

    def _enqueue(self, ev) -> bool:
        while True:
            try:
                return self.queue.put(ev, timeout=POLL)
            except TimeoutError:
                if self._stop.is_set():
                    raise OSError("server stopping while the queue is full") from None
            except QueueClosed:
                raise OSError("server stopping") from None

    def _reject(self, conn: socket.socket, number: int, reason: str, counted: bool = True) -> None:
        if counted:
            self.counters.add("rejected_tcp")
        log.info("rejected line %d: %s", number, reason)
        try:
            conn.sendall(f"error line {number}: {reason}\n".encode())
        except OSError:
            pass
