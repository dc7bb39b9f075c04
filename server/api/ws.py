"""WebSocket notifiers: /ws/subscriptions/{id} and /ws/streams/{name}.

Each witness is one text message, a JSON object
``{"stream", "t0", "t1", <attributes>}``. A client that asks for
``?batch=N`` (1 <= N <= 10000) gets up to N witnesses per message instead,
one JSON object per line (newline-delimited JSON): whatever is waiting when
the client can take more, so a batching client sees the same witnesses in the
same order with far fewer messages.

**Sequence numbers and resuming.** The witnesses of each subscription are
numbered 1, 2, 3, ... (its *seq*) and kept in the witness log
(server/durability/witlog.py, retention ``witness_log_bytes`` / ``witness_log_seconds``).

- ``/ws/subscriptions/{id}?seq=1``: each witness line is ``<seq> <witness JSON>``
  (e.g. ``17 {"stream":"Rising",...}``): the seq, one space, the JSON as
  without ``seq``.
- ``/ws/subscriptions/{id}?from=<seq>`` (implies ``seq=1``): starts at that
  seq: the witnesses from the log, then live ones, with no gap and no
  duplicate at the switch. A client that printed up to seq N resumes with
  ``from=N+1``. ``from`` may be at most the last seq + 1 (which waits for the
  next witness); one further is closed with 4416 and a reason naming the last
  seq (``from 999 is beyond the end of s1: its last witness is 41; from=42
  waits for the next``): the client has a number the server never gave, or
  lost in a crash. While a recovery replays its journal (``/health``'s
  ``replay_remaining`` > 0) a ``from`` ahead of the log waits instead: the
  replay is numbering those witnesses again.
- ``/ws/streams/{name}?seq=1``: each line is ``<sid>:<seq> <witness JSON>``
  (every subscription publishing the stream numbers its own witnesses).
- ``/ws/streams/{name}?from=<sid>:<seq>,<sid>:<seq>,...`` (implies ``seq=1``):
  each named subscription from that seq, the others from the start of what
  the log holds, then live; a seq beyond a subscription's last + 1 is closed
  with 4416 as above.

Without ``seq`` or ``from`` the messages are exactly the witnesses, as above.
Streams that are internal to a subscription (links between its automata) are
not logged: ``seq``/``from`` on them is refused with 4400.

**Slow clients** are never cut while the log holds what they need: a client
that lets ``client_buffer`` witnesses pile up lags (its buffer is dropped)
and is served from the log until it has caught up, then live again (see
server/delivery/hub.py); the same witnesses in the same order, with or without
seq.

**Control messages.** A message that is a JSON object with a ``"control"`` key
is not a witness: it is never batched with witnesses, and comes with or without
``seq``. ``{"control": "inexact", "subscription": "s2", "since_seq": 812,
"instances_lost": 7301, "reason": ..., "message": ...}`` says the subscription
lost partial matches when the server shed state (server/budget.py): its
witnesses after ``since_seq`` may lack some. A client gets it on connecting to
an inexact subscription (or to a stream one publishes), and again as the loss
grows (at most every ten seconds). ``{"control": "gap", "subscription": "s1",
"from": 68655, "to": 135595, "reason": ..., "message": ...}`` stands where the
witness log lacks witnesses that were numbered (lost while the server was
stopped, and not to be made again from the journal: server/durability/witgaps.py):
a client reading the log across them gets it in their place, then the witnesses
after ``to``; resuming, it asks ``from=<to + 1>``.

Close codes: 4400 bad query parameter, 4401 missing or wrong token, 4403 a
token without the ``watch`` scope, or one that does not reach the
subscription (or a subscription publishing the stream), 4429 too many wrong
tokens from the client's address (retry later), 4404 unknown
subscription or stream, 4409 a broken subscription (its stored query no longer
compiles against the server's configuration: the reason says why, cut to fit,
and what to do; GET /subscriptions/{id} has it whole; retrying cannot help until
the server restarts with a configuration that fits it), 4416 ``from`` beyond the end of the log (the reason
names the last seq), 4410 what the client needs is no longer retained
(the reason says where the log now starts, e.g. ``from 5 is no longer
retained: the log of s7 starts at 1200``), 1013 the server is starting (try
again shortly), or a client of an internal stream was too slow (its buffer
overflowed; such witnesses are not logged), 1001 the server is stopping (the
reason: ``the server is shutting down``; a WebSocket opened while it drains is
closed so at once) or the subscription was deleted (``subscription s1 was
deleted``); resume with ``from`` after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from air.names import shown
from server.api.deps import ws_principal, ws_subprotocol
from server.delivery.hub import GONE_CLOSE, SHUTDOWN_CLOSE, SHUTTING_DOWN, SLOW_CLIENT_CLOSE, ClientChannel
from server.durability.witgaps import LOST
from server.durability.witlog import Gap, Gone
from server.observability.counters import Count
from server.security import AuthRefused
from server.subscriptions.broken import BROKEN_CLOSE

router = APIRouter(tags=["notifications"])

MAX_BATCH = 10_000
#: Close code for a ``from`` beyond the last seq + 1 (as HTTP 416: the range cannot be served).
BEYOND_END_CLOSE = 4416
#: Seconds the server waits for a too-slow client to read up to its 1013 close
#: frame (it is queued right behind the witnesses already sent); then it gives up.
SLOW_CLOSE_SECONDS = 15.0
#: Witnesses read from the log per step of a client catching up.
CATCH_UP_RECORDS = 2000


class _BadParam(ValueError):
    pass


def _params(ws: WebSocket, kind: str) -> tuple[int, bool, dict[str, int] | None]:
    """batch, seq and the ``from`` positions (last seq the client has, per subscription)."""
    q = ws.query_params
    try:
        batch = int(q.get("batch", "1"))
        if not 1 <= batch <= MAX_BATCH:
            raise ValueError
    except ValueError:
        raise _BadParam(f"batch must be an integer from 1 to {MAX_BATCH}") from None
    seq_arg = q.get("seq", "0").lower()
    if seq_arg not in ("0", "1", "true", "false", ""):
        raise _BadParam("seq must be 1 or 0")
    seq = seq_arg in ("1", "true")
    raw = q.get("from")
    if raw is None:
        return batch, seq, None
    after: dict[str, int] = {}
    try:
        if kind == "subscription":
            n = int(raw)
            if n < 1:
                raise ValueError
            after[""] = n - 1
        else:
            for part in filter(None, raw.split(",")):
                sid, _, n = part.partition(":")
                if not sid or int(n) < 1:
                    raise ValueError
                after[sid] = int(n) - 1
    except ValueError:
        form = "a seq (an integer from 1)" if kind == "subscription" else "<sid>:<seq>,<sid>:<seq>,..."
        raise _BadParam(f"from must be {form}") from None
    return batch, True, after


def _beyond_end(d, wlog, kind: str, key: str, after: dict[str, int]) -> str | None:
    """Why a ``from`` cannot be served (a seq beyond the last one + 1), or None."""
    for sid, had in after.items():
        sid = sid or key  # a subscription's own from
        if kind == "stream" and sid not in d.subscriptions:
            continue  # not a subscription: nothing of it is served (as before)
        last = wlog.last_seq(sid)
        if had > last:
            return (f"from {had + 1} is beyond the end of {sid}: its last witness is {last}; "
                    f"from={last + 1} waits for the next")
    return None


def _fit(reason: str) -> str:
    """A close reason cut to the 123 bytes a close frame can carry (a longer one
    broke the connection without a close frame)."""
    return reason.encode()[:123].decode(errors="ignore")


async def _serve(ws: WebSocket, kind: str, key: str) -> None:
    d = ws.app.state.daemon
    await ws.accept(subprotocol=ws_subprotocol(ws))
    try:
        who = ws_principal(ws, "watch")
    except AuthRefused as exc:
        code, reason = {"scope": (4403, f"forbidden: {exc}"), "throttled": (4429, str(exc))}.get(
            exc.reason, (4401, "missing or wrong token"))
        await ws.close(code=code, reason=_fit(reason))
        return
    if ws.app.state.draining.is_set():  # it would be cut at once (by uvicorn, 1012 with no reason)
        await ws.close(code=SHUTDOWN_CLOSE, reason=SHUTTING_DOWN)
        return
    if not d.caught_up or d.witlog is None:  # restoring, or a replay has subscriptions still to reinstall
        await ws.close(code=SLOW_CLIENT_CLOSE, reason="the server is starting: try again shortly")
        return
    known = key in d.subscriptions if kind == "subscription" else d.engine.schema(key) is not None
    broken = d.broken.get(key) if kind == "subscription" and not known else None
    if broken is not None and (not who.restricted or d.security.reaches(who, broken)):
        await ws.close(code=BROKEN_CLOSE, reason=_fit(broken.close_reason()))
        return
    if not known:
        await ws.close(code=4404, reason=_fit(f"no {kind} named {shown(key)}"))
        return
    if who.restricted:
        problem = _out_of_reach(d, who, kind, key)
        if problem is not None:
            try:
                d.security.refuse(who, ws.client.host if ws.client else "unknown", "http", f"WS /ws/{kind}s/{key}",
                                  None, problem)
            except AuthRefused:
                pass
            await ws.close(code=4403, reason=_fit(f"forbidden: {problem}"))
            return
    try:
        batch, seq, after = _params(ws, kind)
    except _BadParam as exc:
        await ws.close(code=4400, reason=_fit(str(exc)))
        return
    resumable = kind == "subscription" or not any(key in s.internal for s in list(d.subscriptions.values()))
    if seq and not resumable:
        await ws.close(code=4400, reason=_fit(f"stream {key} links a subscription's automata and is not "
                                              "logged: watch it without seq or from"))
        return
    wlog = d.witlog
    if after and not d.replay_remaining:  # during a replay the witnesses ahead are being numbered again
        beyond = _beyond_end(d, wlog, kind, key, after)
        if beyond is not None:
            await ws.close(code=BEYOND_END_CLOSE, reason=_fit(beyond))
            return
    positions = (lambda: wlog.stream_last(key)) if kind == "stream" else None
    ch = ClientChannel(asyncio.get_running_loop(), d.settings.client_buffer, on_drop=d.on_client_drop,
                       label=f"{kind}:{key}", batch=batch, resumable=resumable, positions=positions)
    if after is not None:
        ch.start_lagging_at({key: after[""]} if kind == "subscription" else after)
    fmt = (_with_seq if kind == "subscription" else _with_sid_seq) if seq else _plain
    d.hub.register(kind, key, ch)
    for sid, mark in _inexact_of(d, kind, key):
        ch.notice(_encode(d.budget.notice(sid, mark)))
    sender = asyncio.create_task(_send_loop(ws, ch, d, kind, key, fmt))
    receiver = asyncio.create_task(_receive_loop(ws))
    cut = asyncio.create_task(ch.cut.wait())  # overflow: stop a send stuck on a client that does not read
    gone: Gone | None = None
    try:
        await asyncio.wait({sender, receiver, cut}, return_when=asyncio.FIRST_COMPLETED)
        if sender.done() and not sender.cancelled() and isinstance(sender.exception(), Gone):
            gone = sender.exception()
    finally:
        d.hub.unregister(kind, key, ch)
        for t in (sender, receiver, cut):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    if gone is not None:
        d.counters.add(Count.DROP_RETENTION)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(code=GONE_CLOSE, reason=str(gone)[:123]), timeout=SLOW_CLOSE_SECONDS)
    elif ch.overflowed:
        reason = f"too slow: more than {ch.capacity} witnesses were waiting"
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(code=SLOW_CLIENT_CLOSE, reason=reason), timeout=SLOW_CLOSE_SECONDS)
    elif ch.closed:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(code=SHUTDOWN_CLOSE, reason=_fit(ch.close_reason)), timeout=1.0)


def _out_of_reach(d, who, kind: str, key: str) -> str | None:
    """Why a token that reaches only some subscriptions may not watch ``key``, or None.
    A subscription of its own that reads what others publish is refused too: it is
    being deleted again (server/api/subscriptions.py: its registration is refused)."""
    sec = d.security
    if kind == "subscription":
        sub = d.subscriptions.get(key)
        if sub is not None and not sec.reaches(who, sub):
            return f"token {who.name} does not reach subscription {key}"
        if sub is not None and sec.reads_out_of_reach(who, sub, d.subscriptions, d.declared):
            return f"subscription {key} reads streams of subscriptions token {who.name} does not reach"
        return None
    others = sec.stream_publishers_out_of_reach(who, key, d.subscriptions)
    if others:
        return f"stream {key} is published by subscriptions token {who.name} does not reach ({', '.join(others[:3])})"
    return None


def _inexact_of(d, kind: str, key: str) -> list[tuple[str, object]]:
    """The inexact subscriptions (and their marks) a new client of ``key`` should hear of."""
    marks = dict(d.budget.inexact)  # a copy: the engine thread writes it
    if kind == "subscription":
        return [(key, marks[key])] if key in marks else []
    return [(sid, m) for sid, m in marks.items()
            if (sub := d.subscriptions.get(sid)) is not None and key in sub.outputs]


def _encode(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


async def _send_notices(ws: WebSocket, notices: list[bytes]) -> None:
    for n in notices:
        await ws.send_text(n.decode())


def _plain(sid: str, seq: int, payload: bytes) -> bytes:
    return payload


def _with_seq(sid: str, seq: int, payload: bytes) -> bytes:
    return b"%d %s" % (seq, payload)


def _with_sid_seq(sid: str, seq: int, payload: bytes) -> bytes:
    return b"%s:%d %s" % (sid.encode(), seq, payload)


#: How a client sees a live chunk's witnesses (server/delivery/hub.py's Chunk.lines), by formatter.
_CHUNK_FORMAT = {_plain: "plain", _with_seq: "seq", _with_sid_seq: "sid_seq"}


async def _send(ws: WebSocket, ch: ClientChannel, lines: list[bytes], counters) -> None:
    step = ch.batch
    try:
        if step == 1:
            for line in lines:
                await ws.send_text(line.decode())
                ch.sent += 1
        else:
            for i in range(0, len(lines), step):
                part = lines[i:i + step]
                await ws.send_text(b"\n".join(part).decode())
                ch.sent += len(part)
    finally:
        _count_sent(ch, counters)


def _count_sent(ch: ClientChannel, counters) -> None:
    if ch.sent != ch.counted:
        counters.add(Count.DELIVERED, ch.sent - ch.counted)
        ch.counted = ch.sent


async def _send_chunks(ws: WebSocket, ch: ClientChannel, chunks: list, fmt: str, counters) -> None:
    """Send live chunks: one that fits a message goes as the frame every
    client of that format shares (joined once); otherwise their lines, up to
    ``ch.batch`` a message."""
    if len(chunks) == 1 and 1 < len(chunks[0]) <= ch.batch:
        try:
            await ws.send_text(chunks[0].frame(fmt).decode())
            ch.sent += len(chunks[0])
        finally:
            _count_sent(ch, counters)
        return
    lines = chunks[0].lines(fmt) if len(chunks) == 1 else [x for c in chunks for x in c.lines(fmt)]
    await _send(ws, ch, lines, counters)


async def _send_loop(ws: WebSocket, ch: ClientChannel, d, kind: str, key: str, fmt) -> None:
    """Send what the channel holds, as it comes, and catch up from the
    witness log whenever the channel lags; counts what was sent."""
    floor: dict[str, int] = {}  # live witnesses at or below these seqs were asked not to be sent (from)
    shape = _CHUNK_FORMAT[fmt]
    while True:
        if ch.lagging and not ch.closed:
            floor = await _catch_up(ws, ch, d, kind, key, fmt)
            continue
        await ch.wake.wait()
        chunks, notices = ch.take_all()
        if notices:
            await _send_notices(ws, notices)
        if floor:
            chunks = [c for c in (x.after(floor.get(x.sid, 0)) for x in chunks) if c is not None]
        if chunks:
            await _send_chunks(ws, ch, chunks, shape, d.counters)
        if ch.overflowed or (ch.closed and not ch.buffer):
            return


async def _catch_up(ws: WebSocket, ch: ClientChannel, d, kind: str, key: str, fmt) -> dict[str, int]:
    """Send the channel's witnesses from the log, from where it is, until it
    has caught up; then switch it to live (under the delivery lock, see
    server/delivery/hub.py). Returns the positions beyond what the log held then
    (a ``from`` ahead of the log: live witnesses up to them are skipped).
    Raises :class:`Gone` when retention deleted what it needs."""
    wlog = d.witlog
    sid, stream = (key, None) if kind == "subscription" else (None, key)
    cur = wlog.cursor(sid=sid, stream=stream, after=ch.after)
    try:
        while not ch.closed:
            notices = ch.take_notices()
            if notices:
                await _send_notices(ws, notices)
            gaps = cur.gaps
            recs = await asyncio.to_thread(cur.read, CATCH_UP_RECORDS)
            if recs and cur.gaps != gaps:  # the log lacks some of them: said where they would be
                await _send_with_gaps(ws, ch, recs, fmt, d.counters)
                continue
            if recs:
                await _send(ws, ch, [fmt(s, n, p) for s, n, p in recs], d.counters)
                continue
            with d.hub.delivery_lock:
                if wlog.caught_up(cur.after, sid=sid, stream=stream):
                    ch.go_live()
                    return {s: n for s, n in cur.after.items() if n > wlog.last_seq(s)}
        return {}
    finally:
        cur.close()


async def _send_with_gaps(ws: WebSocket, ch: ClientChannel, recs: list, fmt, counters) -> None:
    """Send records read from the log, with a ``{"control": "gap"}`` notice
    where it lacks witnesses (a :class:`Gap` in their place)."""
    lines: list[bytes] = []
    for s, n, p in recs:
        if type(p) is not Gap:
            lines.append(fmt(s, n, p))
            continue
        if lines:
            await _send(ws, ch, lines, counters)
            lines = []
        await _send_notices(ws, [_encode(gap_notice(s, p))])
    if lines:
        await _send(ws, ch, lines, counters)


def gap_notice(sid: str, gap: Gap) -> dict:
    """What a watcher is told where the witness log lacks witnesses it asked for."""
    span = f"witnesses {gap.first} to {gap.last}" if gap.last > gap.first else f"witness {gap.first}"
    return {"control": "gap", "subscription": sid, "from": gap.first, "to": gap.last, "reason": LOST,
            "message": f"{span} of {sid} cannot be served: {LOST}; this watch goes on with witness {gap.last + 1} "
                       "(GET /health lists such gaps)"}


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
