"""Limits on HTTP connections, below uvicorn: a header timeout and a cap.

uvicorn has no timeout for reading a request's headers, and keeps every
connection it accepts: a client that opens connections and sends half a
header each (slowloris) held them all, until the process ran out of file
descriptors and neither HTTP, ``/health`` nor the TCP event port could accept
anything. :class:`GuardedHttpToolsProtocol` (uvicorn's httptools protocol,
with three additions) and one :class:`HttpGuard` per server fix that:

- **Header timeout.** A connection gets ``http_header_timeout`` seconds from
  when it opens, and from the first byte of each later request on it, to send
  complete request headers; otherwise it is answered 408 and closed. Between
  requests uvicorn's keep-alive timeout (5 s) closes an idle connection.
- **Body timeout.** Once the headers are in, the body must keep coming: a
  request whose body pauses for ``http_body_timeout`` seconds while the
  server is reading it (not while uvicorn holds reading back because the
  application has not taken what arrived) is answered 408 and closed. Such a
  connection is busy, not waiting, so without this a slow trickle of body
  bytes held its place at the cap as long as the client liked.
- **A cap.** At most ``max_http_connections`` connections (WebSockets
  included) are open. One more arriving at the cap closes the oldest
  connection that is *waiting* (has not sent the complete headers of a
  request, or sits idle between requests) to make room: a flood of
  half-header connections then cycles through the cap while a client that
  sends its request at once (a probe of ``/health``) gets in and is served.
  When every connection is busy (in a request, or a WebSocket) the new one is
  answered 503 and closed at once: it holds no descriptor.
- Every connection closed or refused so is counted:
  ``cayuga_http_connections_refused_total{reason}`` with reason
  ``header_timeout``, ``body_timeout``, ``evicted`` or ``max_connections``.

Everything here runs on the event loop thread; nothing locks.
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.observability.counters import Counters, HTTP_CONN_REFUSED

log = logging.getLogger("cayuga.http")

#: Labels of cayuga_http_connections_refused_total (counters: ``HTTP_CONN_REFUSED``).
REFUSALS = tuple(HTTP_CONN_REFUSED)


def _response(status: str, detail: str, retry_after: int | None = None) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = [f"HTTP/1.1 {status}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class HttpGuard:
    """The state the connections of one HTTP server share: which of them are
    waiting (oldest first), and the settings and counters."""

    def __init__(self, max_connections: int, header_timeout: float, body_timeout: float,
                 counters: Counters) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.counters = counters
        # connections waiting for a request's headers (or idle between requests), oldest first
        self.waiting: dict[GuardedHttpToolsProtocol, None] = {}
        self._timeout_answer = _response(
            "408 Request Timeout", f"the request headers did not arrive within http_header_timeout "
                                   f"({header_timeout:g} s); send the whole request at once")
        self._body_answer = _response(
            "408 Request Timeout", f"the request body stopped arriving for http_body_timeout ({body_timeout:g} s)")
        self._evicted_answer = _response(
            "503 Service Unavailable", f"the server holds max_http_connections ({max_connections}) connections; "
                                       "this one had sent no complete request and made room for a new one",
            retry_after=1)
        self._full_answer = _response(
            "503 Service Unavailable", f"the server holds max_http_connections ({max_connections}) connections, "
                                       "all of them busy; retry later", retry_after=1)

    def refuse(self, transport: asyncio.BaseTransport, reason: str, answer: bool = True) -> None:
        """Answer (unless ``answer`` is false: a response has begun; best effort,
        never waiting for the peer to read) and close."""
        self.counters.add(HTTP_CONN_REFUSED[reason])
        if answer:
            text = {"header_timeout": self._timeout_answer, "body_timeout": self._body_answer,
                    "evicted": self._evicted_answer, "max_connections": self._full_answer}[reason]
            try:
                transport.write(text)  # type: ignore[attr-defined]
            except (OSError, RuntimeError):
                pass
        if transport.get_write_buffer_size():  # type: ignore[attr-defined]
            transport.abort()  # type: ignore[attr-defined]  # the peer does not read: free the descriptor now
        else:
            transport.close()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HttpGuard`'s header timeout
    and connection cap. Build it with ``functools.partial(...,
    guard=guard)`` as uvicorn's ``http`` protocol class."""

    def __init__(self, *args, guard: HttpGuard, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_at = 0.0  # loop time the request body last made progress
        self._refused = False

    # -- connection

    def connection_made(self, transport) -> None:  # type: ignore[override]
        g = self.guard
        if len(self.connections) >= g.max_connections:
            if g.waiting:
                oldest = next(iter(g.waiting))
                oldest._leave()
                if not oldest.transport.is_closing():  # else it is on its way out already (keep-alive timeout)
                    g.refuse(oldest.transport, "evicted")
            else:
                self._refused = True  # uvicorn never sees it: not in server_state.connections
                self.transport = transport
                g.refuse(transport, "max_connections")
                return
        super().connection_made(transport)
        self._wait()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._leave()
        self._body_done()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)

    # -- the request's headers

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._leave()
        super().on_headers_complete()
        self._body_done()
        if not (self.parser.should_upgrade() and self._should_upgrade()):
            self._body_at = self.loop.time()  # on_message_complete, in this same feed for a GET, cancels it
            self._body_timer = self.loop.call_later(self.guard.body_timeout, self._body_timeout)

    def on_body(self, body: bytes) -> None:
        self._body_at = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._body_done()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.cycle.response_complete:  # not a pipelined request started
            self.guard.waiting[self] = None  # idle until the next request (uvicorn's keep-alive timer runs)

    # -- helpers

    def _wait(self) -> None:
        self.guard.waiting[self] = None
        self._arm()

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.guard.header_timeout, self._header_timeout)

    def _leave(self) -> None:
        self.guard.waiting.pop(self, None)
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _body_done(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timeout(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused:  # uvicorn holds reading back (the application has not taken the body yet)
            self._body_at = now
        left = self._body_at + self.guard.body_timeout - now
        if left > 0:
            self._body_timer = self.loop.call_later(left, self._body_timeout)
            return
        log.debug("closing an HTTP connection from %s: its request body paused for %g s",
                  self.client, self.guard.body_timeout)
        self.guard.refuse(self.transport, "body_timeout", answer=not self.cycle.response_started)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        self.guard.waiting.pop(self, None)
        log.debug("closing an HTTP connection from %s: no complete request headers within %g s",
                  self.client, self.guard.header_timeout)
        self.guard.refuse(self.transport, "header_timeout")
