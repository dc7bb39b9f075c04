"""A limit on HTTP request bodies: 413 for a body over ``max_body_bytes``,
refused before it is read when it declares its length, and as soon as the
limit is passed when it is sent in chunks. Counted in
``cayuga_http_refusals_total``. An ASGI middleware: WebSockets pass through."""

from __future__ import annotations

import json


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app, max_bytes: int, counters) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.counters = counters

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, int(declared))
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
            await self._refuse(send, seen)

    async def _refuse(self, send, size: int) -> None:
        self.counters.add("http_body_too_large")
        body = json.dumps({"detail": f"the request body ({size} bytes or more) is larger than max_body_bytes "
                                     f"({self.max_bytes}); split it (POST /events takes a list: send several)"}
                          ).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
