"""TLS on the HTTP port, below uvicorn, with a clear answer to plain text.

uvicorn (asyncio) can serve TLS itself, but a client that sends a plain
``GET`` to a TLS port then sees its connection dropped in the handshake, with
nothing said. :class:`TlsFirst` is the first protocol of every connection
instead: it looks at the first byte. A TLS handshake record (0x16) starts
TLS with the server's current context (server/security/tls.py: swapped on
SIGHUP, so a reloaded certificate serves the next connection and leaves open
ones alone) through asyncio's own TLS protocol, over uvicorn's (guarded)
HTTP protocol, which sees an ``https`` connection as with uvicorn's TLS.
Anything else is answered ``400`` in plain text, saying to use ``https://``,
and closed: nothing it sent is read as a request.

Connections still in their handshake do not count against
``max_http_connections`` (uvicorn counts them once they are HTTP) but have a
bound of their own: at most that many at once (one more is closed at once),
and ``http_header_timeout`` seconds for the first byte and for the handshake.
Refusals are counted: ``cayuga_tls_plaintext_refused_total{port="http"}``,
``cayuga_tls_handshake_failures_total{port="http"}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from asyncio import sslproto

from server.observability.counters import TLS_HANDSHAKE_FAILED, TLS_PLAINTEXT, Counters
from server.security.tls import HANDSHAKE_RECORD, ServerTls

log = logging.getLogger("cayuga.http")

#: Seconds a TLS connection has, at a graceful stop or a keep-alive close, to answer the
#: server's close_notify before it is closed anyway (an idle pooled client never does).
TLS_SHUTDOWN_SECONDS = 1.0
_HOST = re.compile(rb"\r\nhost:[ \t]*([^\r\n]+)", re.IGNORECASE)
_TARGET = re.compile(rb"^[A-Z]+ (/[^ \r\n]*)")


def plaintext_answer(data: bytes) -> bytes:
    """The 400 a plain-text request gets, naming the https:// URL it should have used."""
    host = _HOST.search(data)
    target = _TARGET.match(data)
    url = ("https://" + host.group(1).decode("latin-1").strip() + (target.group(1).decode("latin-1")
                                                                    if target else "/")) if host else "https://..."
    body = json.dumps({"detail": f"this server speaks HTTPS only (its tls_certfile is set): use {url} (wss:// for "
                                 "WebSockets), trusting the CA that signed its certificate (curl --cacert CA.pem, "
                                 "cayuga ... --cacert CA.pem)"}).encode()
    return (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))


class _SSLProtocol(sslproto.SSLProtocol):
    """asyncio's TLS protocol, which sends the alert of a failed handshake before it
    closes (asyncio drops it): a client without the certificate tls_client_ca wants
    then reads "certificate required", not a connection closed without a word."""

    def _on_handshake_complete(self, handshake_exc):
        if handshake_exc is not None:
            try:
                self._process_outgoing()
            except Exception:  # noqa: BLE001 - only a courtesy to the client; closing goes on
                pass
        super()._on_handshake_complete(handshake_exc)


class TlsGate:
    """What the connections of one HTTP server share before their handshake is done."""

    def __init__(self, tls: ServerTls, max_pending: int, timeout: float, counters: Counters) -> None:
        self.tls = tls
        self.max_pending = max_pending
        self.timeout = timeout
        self.counters = counters
        self.pending: set[TlsFirst] = set()

    def abort_all(self) -> None:
        """Close the connections still in their handshake (a stop)."""
        for p in list(self.pending):
            p.abort()


class TlsFirst(asyncio.Protocol):
    """Build it with ``functools.partial(TlsFirst, inner=<uvicorn's protocol class>, gate=gate)`` as
    uvicorn's ``http`` protocol class; uvicorn's own arguments go to ``inner``."""

    def __init__(self, *args, inner, gate: TlsGate, **kwargs) -> None:
        self._make_inner = lambda: inner(*args, **kwargs)
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._done = False

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        g = self.gate
        if len(g.pending) >= g.max_pending:
            log.debug("closing an HTTP connection: %d connections are in their TLS handshake", len(g.pending))
            self._done = True
            transport.abort()
            return
        g.pending.add(self)
        self._timer = asyncio.get_running_loop().call_later(g.timeout, self._timed_out)

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        self._leave()
        if data[0] != HANDSHAKE_RECORD:
            self.gate.counters.add(TLS_PLAINTEXT["http"])
            log.debug("plain text on the TLS port from %s: answered 400", self.transport.get_extra_info("peername"))
            self.transport.write(plaintext_answer(data))
            self.transport.close()
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        tls = _SSLProtocol(loop, self._make_inner(), self.gate.tls.context, waiter, server_side=True,
                                   ssl_handshake_timeout=self.gate.timeout,
                                   ssl_shutdown_timeout=TLS_SHUTDOWN_SECONDS)
        self.gate.pending.add(self)  # until the handshake is over
        waiter.add_done_callback(self._handshake_over)
        self.transport.set_protocol(tls)
        tls.connection_made(self.transport)
        view = memoryview(data)
        while view:  # what was read already goes to the TLS layer first
            buf = tls.get_buffer(len(view))
            n = min(len(view), len(buf))
            buf[:n] = view[:n]
            tls.buffer_updated(n)
            view = view[n:]

    def _handshake_over(self, waiter: asyncio.Future) -> None:
        self.gate.pending.discard(self)
        if waiter.cancelled() or waiter.exception() is not None:
            self.gate.counters.add(TLS_HANDSHAKE_FAILED["http"])
            log.debug("TLS handshake failed: %s", None if waiter.cancelled() else waiter.exception())

    def _timed_out(self) -> None:
        self._timer = None
        if not self._done:
            self.gate.counters.add(TLS_HANDSHAKE_FAILED["http"])
            self.abort()

    def _leave(self) -> None:
        self._done = True
        self.gate.pending.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def abort(self) -> None:
        self._leave()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def eof_received(self) -> bool | None:
        self._leave()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave()
