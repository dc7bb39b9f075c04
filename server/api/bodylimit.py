"""A limit on HTTP request bodies: 413 for a body over ``max_body_bytes``,
refused before it is read when it declares its length, and as soon as the
limit is passed when it is sent in chunks. Counted in
``cayuga_http_refusals_total``. An ASGI middleware: WebSockets pass through.

Most clients (``urllib``, ``requests``, httpx) write the whole body before
they read the answer. Closing the connection with the rest of their body
unread made the kernel reset it, and such a client saw ``Connection reset by
peer`` instead of the 413. So the 413 is sent first, then the rest of the
body is read and discarded, up to ``drain_bytes`` (DRAIN_BYTES, or 4 x
``max_body_bytes`` if larger) and DRAIN_SECONDS, and only then is the
connection closed. A body declared larger than that is not read: the 413 is
sent and the connection closed (such a client may see a reset). Neither is a
client that sent ``Expect: 100-continue``: it waits for the answer before
sending its body, and gets the 413 instead.
"""

from __future__ import annotations

import asyncio
import json
from server.observability.counters import Count

#: Bytes of a refused body read and discarded so that the client reads the 413.
DRAIN_BYTES = 256 << 20
#: Seconds spent at most on that.
DRAIN_SECONDS = 30.0


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app, max_bytes: int, counters) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.counters = counters
        self.drain_bytes = max(DRAIN_BYTES, 4 * max_bytes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        declared = headers.get(b"content-length")
        drain = headers.get(b"expect", b"").lower() != b"100-continue"
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(receive, send, int(declared), drain and int(declared) <= self.drain_bytes, read=0)
            return
        seen = 0
        started = False

        async def counting_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def watching_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, watching_send)
        except _TooLarge:
            if started:
                raise
            await self._refuse(receive, send, seen, drain, read=seen)

    async def _refuse(self, receive, send, size: int, drain: bool, read: int) -> None:
        self.counters.add(Count.HTTP_BODY_TOO_LARGE)
        body = json.dumps({"detail": f"the request body ({size} bytes or more) is larger than max_body_bytes "
                                     f"({self.max_bytes}); split it (POST /events takes a list: send several)"}
                          ).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        # the whole answer is written, but the response stays open (more_body): the server closes the
        # connection once it is complete, and the body still coming must be read before that
        await send({"type": "http.response.body", "body": body, "more_body": drain})
        if drain:
            await self._discard(receive, read)
            await send({"type": "http.response.body", "body": b""})

    async def _discard(self, receive, seen: int) -> None:
        """Read what is left of the request body and drop it (bounded)."""
        try:
            async with asyncio.timeout(DRAIN_SECONDS):
                while seen <= self.drain_bytes:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        return
                    seen += len(message.get("body", b""))
        except TimeoutError:
            pass
