"""WebSocket notifiers: /ws/subscriptions/{id} and /ws/streams/{name}.

Each witness is one text message, a JSON object
``{"stream", "t0", "t1", <attributes>}``. A client that asks for
``?batch=N`` (1 <= N <= 10000) gets up to N witnesses per message instead,
one JSON object per line (newline-delimited JSON): whatever is waiting when
the client can take more, so a batching client sees the same witnesses in the
same order with far fewer messages. Close codes: 4400 bad query parameter,
4401 bad token, 4404 unknown subscription or stream, 1013 the client was too
slow (its buffer overflowed; see notifiers.py), 1001 the server is shutting
down.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from server.api.deps import ws_token_ok
from server.notifiers import SHUTDOWN_CLOSE, SLOW_CLIENT_CLOSE, ClientChannel

router = APIRouter(tags=["notifications"])

MAX_BATCH = 10_000


async def _serve(ws: WebSocket, kind: str, key: str) -> None:
    d = ws.app.state.daemon
    await ws.accept()
    if not ws_token_ok(ws):
        await ws.close(code=4401, reason="missing or wrong token")
        return
    known = key in d.subscriptions if kind == "subscription" else d.engine.schema(key) is not None
    if not known:
        await ws.close(code=4404, reason=f"no {kind} named {key!r}")
        return
    try:
        batch = int(ws.query_params.get("batch", "1"))
        if not 1 <= batch <= MAX_BATCH:
            raise ValueError
    except ValueError:
        await ws.close(code=4400, reason=f"batch must be an integer from 1 to {MAX_BATCH}")
        return
    ch = ClientChannel(asyncio.get_running_loop(), d.settings.client_buffer, d.settings.slow_client_policy,
                       on_drop=d.on_client_drop, label=f"{kind}:{key}", batch=batch)
    d.hub.register(kind, key, ch)
    sender = asyncio.create_task(_send_loop(ws, ch, d.counters))
    receiver = asyncio.create_task(_receive_loop(ws))
    try:
        done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        d.hub.unregister(kind, key, ch)
        for t in (sender, receiver):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    if ch.overflowed:
        reason = f"too slow: more than {ch.capacity} witnesses were waiting"
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(code=SLOW_CLIENT_CLOSE, reason=reason), timeout=1.0)
    elif ch.closed:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(code=SHUTDOWN_CLOSE, reason="subscription removed or server stopping"),
                                   timeout=1.0)


async def _send_loop(ws: WebSocket, ch: ClientChannel, counters) -> None:
    """Send what the channel holds, as it comes; counts what was sent."""
    step = ch.batch
    while True:
        await ch.wake.wait()
        items = ch.take_all()
        try:
            if step == 1:
                for payload in items:
                    await ws.send_text(payload.decode())
                    ch.sent += 1
            else:
                for i in range(0, len(items), step):
                    part = items[i:i + step]
                    await ws.send_text(b"\n".join(part).decode())
                    ch.sent += len(part)
        finally:
            if ch.sent != ch.counted:
                counters.add("delivered", ch.sent - ch.counted)
                ch.counted = ch.sent
        if ch.overflowed or (ch.closed and not ch.buffer):
            return


async def _receive_loop(ws: WebSocket) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            await ws.receive_text()  # clients need not send anything; this notices a disconnect


@router.websocket("/ws/subscriptions/{sid}")
async def subscription_ws(ws: WebSocket, sid: str) -> None:
    await _serve(ws, "subscription", sid)


@router.websocket("/ws/streams/{name}")
async def stream_ws(ws: WebSocket, name: str) -> None:
    await _serve(ws, "stream", name)
