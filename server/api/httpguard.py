"""Limits on HTTP connections and WebSockets, below uvicorn: timeouts and caps.

uvicorn has no timeout for reading a request's headers, and keeps every
connection it accepts: a client that opens connections and sends half a
header each (slowloris) held them all, until the process ran out of file
descriptors and neither HTTP, ``/health`` nor the TCP event port could accept
anything. And WebSockets counted against the same cap: 256 idle watchers
locked ``/health`` and the REST API out (issue 33). :class:`GuardedHttpToolsProtocol`
(uvicorn's httptools protocol, with the additions below),
:class:`GuardedWebSocketProtocol` (uvicorn's websockets-sansio protocol) and one
:class:`HttpGuard` per server fix that:

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
- **A cap on HTTP connections.** At most ``max_http_connections`` plain HTTP
  connections (WebSockets are not among them) are open. One more arriving at
  the cap closes the oldest connection that is *waiting* (has not sent the
  complete headers of a request, or sits idle between requests) to make room:
  a flood of half-header connections then cycles through the cap while a
  client that sends its request at once (a probe of ``/health``) gets in and
  is served. When every connection is busy (in a request) the new one is
  answered 503 and closed at once: it holds no descriptor.
- **Caps on WebSockets, of their own.** A connection that upgrades to a
  WebSocket leaves the HTTP count and joins the WebSockets': at most
  ``max_websockets`` in all and ``max_websockets_per_address`` from one
  client address. One more is answered 503 with a JSON ``detail`` naming the
  cap, its value and its setting, and closed, before it becomes a WebSocket;
  the API and the probes keep their own room however many watchers there are.
- **Request size.** A request line longer than :data:`MAX_REQUEST_LINE` bytes
  is answered 414, request headers beyond :data:`MAX_HEADER_BYTES` 431, and
  the connection closed (uvicorn kept an endless URL in memory; a WebSocket
  handshake over websockets' own 8 KiB line limit got no answer at all: its
  414 or 431 is now sent). A request refused while it is still arriving
  (these, and the WebSocket caps) is closed gracefully: the answer, then the
  write side shut, the rest of the request read and thrown away for at most
  :data:`LINGER_SECONDS`, then the close; closing at once with unread bytes
  sent a reset, which can destroy the answer at the client before it reads it
  (RFC 9112, section 9.6).
- Every connection closed or refused so is counted:
  ``cayuga_http_connections_refused_total{reason}`` with reason
  ``header_timeout``, ``body_timeout``, ``evicted``, ``max_connections``,
  ``websockets``, ``websockets_per_address`` or ``request_too_large``.

Everything here runs on the event loop thread; nothing locks.
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidMessage, SecurityError

from server.observability.counters import Counters, HTTP_CONN_REFUSED

log = logging.getLogger("cayuga.http")

#: Labels of cayuga_http_connections_refused_total (counters: ``HTTP_CONN_REFUSED``).
REFUSALS = tuple(HTTP_CONN_REFUSED)

#: Longest request line (method, URL, version): websockets' limit for a handshake, and
#: the usual one of HTTP servers. A URL that makes a GET request line longer gets 414.
MAX_REQUEST_LINE = 8192
#: Longest URL taken (the request line of a GET: ``GET <url> HTTP/1.1`` and CRLF).
MAX_URL_BYTES = MAX_REQUEST_LINE - len(b"GET  HTTP/1.1\r\n")
#: Most bytes a request's headers may take (431 beyond).
MAX_HEADER_BYTES = 64 << 10
#: Seconds a connection answered in the middle of its request is read (and the bytes
#: thrown away) after the answer, before it is closed (a graceful close).
LINGER_SECONDS = 2.0


def _response(status: str, detail: str, retry_after: int | None = None) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = [f"HTTP/1.1 {status}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class HttpGuard:
    """The state the connections of one HTTP server share: the plain HTTP
    ones, which of them are waiting (oldest first), the WebSockets per client
    address, and the settings and counters."""

    def __init__(self, max_connections: int, header_timeout: float, body_timeout: float,
                 counters: Counters, max_websockets: int = 256, max_websockets_per_address: int = 128) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.max_websockets = max_websockets
        self.max_websockets_per_address = max_websockets_per_address
        self.counters = counters
        self.http: set[GuardedHttpToolsProtocol] = set()  # plain HTTP connections (not upgraded)
        # connections waiting for a request's headers (or idle between requests), oldest first
        self.waiting: dict[GuardedHttpToolsProtocol, None] = {}
        self.websockets = 0  # open WebSockets
        self.websockets_by_address: dict[str, int] = {}
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
        self._url_answer = _response(
            "414 URI Too Long", f"the request line is longer than {MAX_REQUEST_LINE} bytes (a URL of at most "
                                f"{MAX_URL_BYTES} bytes): shorten the URL")
        self._headers_answer = _response(
            "431 Request Header Fields Too Large", f"the request headers are larger than {MAX_HEADER_BYTES} bytes")
        self._websockets_answer = _response(
            "503 Service Unavailable", f"the server holds max_websockets ({max_websockets}) WebSockets, its cap for "
                                       "all clients; retry later, or raise max_websockets (CAYUGA_MAX_WEBSOCKETS) "
                                       "on the server", retry_after=5)

    # -- WebSockets

    def websocket_refusal(self, address: str) -> bytes | None:
        """The answer for a WebSocket from ``address`` beyond a cap (counted), or None: it may open."""
        if self.websockets >= self.max_websockets:
            self.counters.add(HTTP_CONN_REFUSED["websockets"])
            return self._websockets_answer
        if self.websockets_by_address.get(address, 0) >= self.max_websockets_per_address:
            self.counters.add(HTTP_CONN_REFUSED["websockets_per_address"])
            return _response(
                "503 Service Unavailable", f"this client address ({address}) holds max_websockets_per_address "
                                           f"({self.max_websockets_per_address}) WebSockets; close one of them, or "
                                           "raise max_websockets_per_address (CAYUGA_MAX_WEBSOCKETS_PER_ADDRESS) on "
                                           "the server", retry_after=5)
        return None

    def websocket_opened(self, address: str) -> None:
        self.websockets += 1
        self.websockets_by_address[address] = self.websockets_by_address.get(address, 0) + 1

    def websocket_closed(self, address: str) -> None:
        self.websockets -= 1
        n = self.websockets_by_address.get(address, 0) - 1
        if n > 0:
            self.websockets_by_address[address] = n
        else:
            self.websockets_by_address.pop(address, None)

    # -- answers

    def refuse(self, transport: asyncio.BaseTransport, reason: str, answer: bool | bytes = True,
               linger: bool = False) -> None:
        """Answer (unless ``answer`` is false: a response has begun; best effort,
        never waiting for the peer to read) and close. ``answer`` may be the
        response itself; the WebSocket caps count their refusals when they make it.
        ``linger``: the peer may still be sending its request (its protocol throws
        what comes away): the write side is shut after the answer and the close
        waits :data:`LINGER_SECONDS` (or the peer's own close)."""
        if reason not in ("websockets", "websockets_per_address"):
            self.counters.add(HTTP_CONN_REFUSED[reason])
        if answer:
            text = answer if isinstance(answer, bytes) else {
                "header_timeout": self._timeout_answer, "body_timeout": self._body_answer,
                "evicted": self._evicted_answer, "max_connections": self._full_answer}[reason]
            try:
                transport.write(text)  # type: ignore[attr-defined]
            except (OSError, RuntimeError):
                pass
        if transport.get_write_buffer_size():  # type: ignore[attr-defined]
            transport.abort()  # type: ignore[attr-defined]  # the peer does not read: free the descriptor now
        elif linger and transport.can_write_eof():  # type: ignore[attr-defined]
            transport.write_eof()  # type: ignore[attr-defined]
            asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)
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
        self._refused = False  # refused as it connected: uvicorn never saw it
        self._answered = False  # refused in the middle of a request (414, 431, a WebSocket cap): closing
        self._in_head = True  # the headers of a request are still arriving
        self._head_bytes = 0

    # -- connection

    def connection_made(self, transport) -> None:  # type: ignore[override]
        g = self.guard
        if len(g.http) >= g.max_connections:
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
        g.http.add(self)
        self._wait()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._leave()
        self._body_done()
        self.guard.http.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused or self._answered:
            return
        super().data_received(data)
        if self._in_head and not self._answered:  # bytes of headers not complete yet (uvicorn keeps them)
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES + MAX_REQUEST_LINE:
                self._answer("request_too_large", self.guard._headers_answer)

    def handle_websocket_upgrade(self) -> None:
        """Hand the connection to the WebSocket protocol, unless a WebSocket cap
        is reached (503 with the cap's setting, then closed)."""
        if self._answered:
            return
        address = self.client[0] if self.client else ""
        refusal = self.guard.websocket_refusal(address)
        if refusal is not None:
            log.debug("refused a WebSocket from %s: %s", address, refusal.split(b"\r\n\r\n", 1)[-1][:200])
            self._answer("websockets", refusal)
            return
        self.guard.http.discard(self)  # it counts as a WebSocket from now on (GuardedWebSocketProtocol)
        super().handle_websocket_upgrade()

    def _unsupported_upgrade_warning(self) -> None:
        if not self._answered:  # an answered request's headers were not kept: it is not "unsupported"
            super()._unsupported_upgrade_warning()

    def _answer(self, reason: str, response: bytes) -> None:
        """Refuse the request being read and close; nothing more of it is parsed or run."""
        self._answered = True
        self._leave()
        self._body_done()
        self.guard.refuse(self.transport, reason, answer=response, linger=True)

    # -- the request's line and headers

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0
        if self._header_timer is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        if self._answered:
            return
        if len(self.url) + len(url) > MAX_URL_BYTES:
            self._answer("request_too_large", self.guard._url_answer)
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._answered:
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._answered:
            return
        if sum(len(n) + len(v) + 4 for n, v in self.headers) > MAX_HEADER_BYTES:
            self._answer("request_too_large", self.guard._headers_answer)
            return
        self._leave()
        super().on_headers_complete()
        self._body_done()
        if not (self.parser.should_upgrade() and self._should_upgrade()):
            self._body_at = self.loop.time()  # on_message_complete, in this same feed for a GET, cancels it
            self._body_timer = self.loop.call_later(self.guard.body_timeout, self._body_timeout)

    def on_body(self, body: bytes) -> None:
        if self._answered:
            return
        self._body_at = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._answered:
            return
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


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, counted in :class:`HttpGuard`'s
    WebSockets for as long as it is connected, and answering a handshake that
    websockets refuses (a request line or header line over 8 KiB: 414 or 431;
    uvicorn before 0.55 never sent that answer, so the client got silence), and
    counting it as ``request_too_large``. Build it with
    ``functools.partial(..., guard=guard)`` as uvicorn's ``ws`` protocol class."""

    def __init__(self, *args, guard: HttpGuard, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self._address: str | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._address = self.client[0] if self.client else ""
        self.guard.websocket_opened(self._address)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._address is not None:
            self.guard.websocket_closed(self._address)
            self._address = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        closed_before = self.close_sent
        super().data_received(data)
        failed = self.conn.handshake_exc
        if failed is None or self.handshake_initiated or closed_before:
            return
        # the handshake failed in these bytes: counted here whoever answers it (uvicorn 0.55, installed
        # 2026-12-02, answers it itself and sets close_sent; the uvicorn this was written for did not)
        if isinstance(failed, SecurityError):  # a request line or header line over 8 KiB, too many headers
            self.guard.counters.add(HTTP_CONN_REFUSED["request_too_large"])
        elif not isinstance(failed, InvalidMessage):
            log.debug("a WebSocket handshake failed: %s", failed)
        if not self.close_sent:
            self.close_sent = True
            answer = b"".join(self.conn.data_to_send())
            if answer:
                self.transport.write(answer)
            self.transport.close()
