"""TCP event receivers: one listener thread, one thread per connection.

The listener accepts connections within the limits (``max_connections``,
``max_connections_per_address``: a refusal is counted and told in one line) and
gives each its thread, which runs its reader (server/ingest/connection.py: the
protocol, from the headers to the last ``#ack``). What a reader asks of the rest
of the server goes through the receiver's :class:`server.ingest.intake.Intake`.

The protocol a client implements -- headers, formats, every reply and
refusal, acknowledgements, limits, a full disk -- is docs/protocol.md
(``tests/server/test_protocol_doc.py`` keeps it in step with these modules).
"""

from __future__ import annotations

import logging
import socket
import threading

from server.ingest.connection import (AUTH_SECONDS, DISK_FULL_DRAIN_SECONDS, FINAL_ACK_SECONDS, POLL, RECV_BYTES,
                                      Connection, Limits, line_over, value_bound)
from server.ingest import remote
from server.ingest.intake import Intake
from server.ingest.limits import AddressSlots
from server.ingest.readers import ReaderProcess
from server.observability.counters import TCP_REFUSED
from server.observability.threadcpu import thread_ended
from server.security.tls import force_shutdown

log = logging.getLogger("cayuga.receivers")

__all__ = ["AUTH_SECONDS", "DISK_FULL_DRAIN_SECONDS", "FINAL_ACK_SECONDS", "POLL", "RECV_BYTES", "REFUSALS",
           "TcpReceiver", "bind_port", "line_over", "value_bound"]

#: Why a connection was refused or closed: the label of cayuga_tcp_refusals_total.
REFUSALS = tuple(TCP_REFUSED)


def bind_port(host: str, port: int) -> socket.socket:
    """The event port, bound but not listening yet (a connection is refused until
    :meth:`TcpReceiver.start` listens): ``cayuga serve`` binds it before anything
    starts, so that a port in use stops it at once with one line (server/serve.py)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


class TcpReceiver:
    def __init__(self, host: str, port: int, intake: Intake, *, limits: Limits = Limits(),
                 max_connections: int = 64, max_per_address: int = 16, security=None,
                 gate: threading.Event | None = None, sock: socket.socket | None = None,
                 readers: ReaderProcess | None = None) -> None:
        """``intake``: what the connections ask of the server; ``limits``: what
        each keeps to; ``gate``: connections are accepted once it is set (they
        wait in the listen backlog while a recovery puts back the journal's
        events); ``security`` (server/security: tokens, scopes, TLS), None:
        open, plain text; ``sock``: the port already bound (:func:`bind_port`),
        to listen on; ``readers``: the reader process the connections are handed
        to (server/ingest/readers.py), None: a reader thread each here."""
        self.gate = gate
        self.host = host
        self.requested_port = port
        self.intake = intake
        self.limits = limits
        self.tls = security.tls if security is not None else None
        self.readers = readers
        self._slots = threading.BoundedSemaphore(max_connections)
        self._addresses = AddressSlots(max_per_address)
        self._stop = threading.Event()
        self._sock: socket.socket | None = sock
        self._bound_port: int | None = None  # kept once the listener is closed (drain): /health reads it
        self._listener: threading.Thread | None = None
        self._conns: dict[threading.Thread, Connection | _Handed] = {}
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return self._bound_port if self._bound_port is not None else self.requested_port

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def start(self) -> None:
        if self.readers is not None:
            self.readers.start()
        sock = self._sock or bind_port(self.host, self.requested_port)
        sock.listen(128)
        sock.settimeout(POLL)
        self._bound_port = sock.getsockname()[1]
        self._sock = sock
        self._listener = threading.Thread(target=self._accept_loop, name="cayuga-tcp-listener", daemon=True)
        self._listener.start()
        log.info("event receiver listening on %s:%d", self.host, self.port)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, let connection threads finish their current line, join all."""
        self._stop.set()
        self.intake.stop()
        if self._listener:
            self._listener.join(timeout)
        if self.readers is not None:  # its connections end at their next line, as the threads' do
            self.readers.stop(timeout)
        with self._lock:
            conns = list(self._conns.items())
        for t, c in conns:
            t.join(timeout)
            if t.is_alive():
                force_shutdown(c.sock)  # under its thread's feet, TLS or not
                t.join(timeout)
        if self._sock:
            self._sock.close()

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while self.gate is not None and not self.gate.wait(POLL):  # recovery: connections wait in the backlog
            if self._stop.is_set():
                return
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
            if self.readers is not None:
                channel = self.readers.hand_over(conn, addr[0])
                if channel is None:
                    self._slots.release()
                    self._addresses.release(addr[0])
                    continue
                reader = _Handed(channel, addr[0], self.intake)
            else:
                reader = Connection(conn, addr[0], self.intake, self.limits, tls=self.tls, stop=self._stop)
            t = threading.Thread(target=self._serve, args=(reader,), name=f"cayuga-tcp-{addr[1]}", daemon=True)
            with self._lock:
                self._conns[t] = reader
            t.start()

    def _serve(self, reader: Connection | _Handed) -> None:
        try:
            reader.run()
        finally:
            try:
                reader.sock.close()
            finally:
                with self._lock:
                    self._conns.pop(threading.current_thread(), None)
                self._slots.release()
                self._addresses.release(reader.address)
                thread_ended()  # (its CPU kept by role: server/observability/threadcpu.py)

    def _refuse(self, conn: socket.socket, reason: str, message: str) -> None:
        """Count a refusal, tell the client why (in plain text: not on a TLS
        port, where the client awaits a handshake and could not read it), close."""
        self.intake.count(TCP_REFUSED[reason])
        log.info("TCP connection refused (%s): %s", reason, message)
        try:
            if self.tls is None:
                conn.settimeout(1.0)
                conn.sendall(f"error: {message}\n".encode())
        except OSError:
            pass
        finally:
            conn.close()


class _Handed:
    """A connection handed to the reader process: this process answers its
    reader's calls on ``sock``, its channel, until the reader ends it."""

    def __init__(self, sock: socket.socket, address: str, intake: Intake) -> None:
        self.sock, self.address, self.intake = sock, address, intake

    def run(self) -> None:
        try:
            remote.serve(self.sock, self.intake)
        except OSError as exc:
            log.debug("the channel of a connection from %s ended: %s", self.address, exc)
