"""The intake's calls over a channel: a connection's reader in the reader process
(server/ingest/readers.py) and the main process's thread that answers it.

One channel a connection: a stream socket pair, made by the main process when it
hands the connection over, one end to each side. Each call is one request and one
answer, in order, MessagePack behind a 4-byte length: ``[op, args...]`` answered
``[0, value]``, or ``[1, kind, message, arg]`` for what the call raised (``disk``:
:class:`DiskFull` with its ``first_refused``; ``auth``: :class:`AuthRefused` with
its reason; ``os``: the server is stopping). A put, a block's events, has a form of
its own (:func:`put_request`): its ``Lines``, then the events as the journal packs
them, an engine worker's batch columns (:class:`~server.durability.retention.Columns`),
which the main process makes again (``events_of``) and writes as the block's journal
record, the bytes as they came (BENCHMARKS.md, "Engine workers, round 40"); its answer
says what is durable too. A stream's declaration crosses pickled (this channel joins
two processes of one server); the reader keeps a declared stream's for good (it never
changes while the server runs) and a published one's while it is unchanged, so that a
decoder finds the same object from block to block (docs/design/receivers.md, stage 1).
"""

from __future__ import annotations

import logging
import pickle
import socket
import struct
from typing import Any, Optional

import msgspec

from air.engine.convert import STRINGS, events_of
from air.formats import make_decoder
from server.durability.diskfull import DiskFull
from server.durability.retention import Columns
from server.ingest.intake import Intake, Lines
from server.observability.counters import Count
from server.security import AuthRefused

log = logging.getLogger("cayuga.receivers")

_LENGTH = struct.Struct("<I")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode
#: How a put's request begins: a byte no MessagePack value begins with (every other request is an
#: array), then its Lines (or nil) behind their length, then the events' Columns to the end: the
#: journal's bytes, sliced off as they are, with no pass over them but their decoding.
_PUT = b"\xc1"
_lines = msgspec.msgpack.Decoder(Optional[tuple[str, int, int, Optional[list[int]]]])
_columns = msgspec.msgpack.Decoder(Columns)


def send(sock: socket.socket, message: bytes) -> None:
    """One message: its length, then it (a large one not copied behind its length)."""
    if len(message) < 1 << 16:
        sock.sendall(_LENGTH.pack(len(message)) + message)
    else:
        sock.sendall(_LENGTH.pack(len(message)))
        sock.sendall(message)


def receive(sock: socket.socket) -> bytes | None:
    """One message, or None at the end of the channel."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    body = _exactly(sock, _LENGTH.unpack(head)[0])
    if body is None:
        raise ConnectionError("the channel ended inside a message")
    return bytes(body)


def _exactly(sock: socket.socket, n: int) -> bytearray | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            if got:
                raise ConnectionError("the channel ended inside a message")
            return None
        got += k
    return buf


# ---------------------------------------------------------------------- the main process's side


def serve(channel: socket.socket, intake: Intake) -> None:
    """Answer one connection's calls until its reader closes the channel; then give
    back the senders it held (a reader process killed does not release them)."""
    held: set[str] = set()
    try:
        while True:
            message = receive(channel)
            if message is None:
                break
            if message[:1] == _PUT:  # the hot path: a block's events
                op, args = "put", put_of(message)
            else:
                op, *args = _decode(message)
            try:
                value = _call(intake, op, args, held)
                answer = [0, value]
            except DiskFull as exc:
                answer = [1, "disk", [exc.part, exc.what, exc.path, exc.reason, exc.kind], exc.first_refused]
            except AuthRefused as exc:
                answer = [1, "auth", str(exc), exc.reason]
            except OSError as exc:
                answer = [1, "os", str(exc), None]
            send(channel, _encode(answer))  # (raises once the reader is gone: a killed reader process)
    finally:
        for sender in held:
            intake.release(sender)


def put_of(message: bytes) -> tuple:
    """A put's request (:func:`put_request`) as :meth:`Intake.put`'s arguments: the events made
    again, their Lines, and their columns' bytes (the journal record's events, written as they are)."""
    end = 5 + _LENGTH.unpack_from(message, 1)[0]
    lines = _lines.decode(message[5:end])
    packed = memoryview(message)[end:]
    cols = _columns.decode(packed)
    return (events_of(cols.s, cols.v, cols.t0, cols.t1, STRINGS), Lines(*lines) if lines is not None else None,
            msgspec.Raw(packed))


def _call(intake: Intake, op: str, args: list, held: set[str]):
    if op == "put":  # with the journal's position after it, and what is durable (an ack's first question)
        late = intake.put(*args)
        return [late, intake.position(), intake.durable() if intake.journaled else 0]
    if op == "record_progress":
        intake.record_progress(*args)
        return intake.position()
    if op == "claim":
        ok = intake.claim(args[0])
        if ok:
            held.add(args[0])
        return ok
    if op == "release":
        held.discard(args[0])
        intake.release(args[0])
        return None
    if op == "count":
        intake.count(Count(args[0]), args[1])
        return None
    if op == "authenticate":
        intake.authenticate(args[0], args[1])
        return None
    if op == "schema":  # [its declaration pickled or None, whether it is declared: never to change]
        schema = intake.catalog(args[0]) if isinstance(args[0], str) else None
        return [None, False] if schema is None else [pickle.dumps(schema), args[0] in intake.streams()]
    if op == "streams":
        return list(intake.streams())
    if op in ("progress", "durable", "position"):
        return getattr(intake, op)(*args)
    if op == "wait_durable":
        intake.wait_durable(*args)
        return None
    raise ValueError(f"unknown call {op!r} on a reader's channel")


# ---------------------------------------------------------------------- the reader's side


def put_request(events, lines: Lines | None) -> bytes:
    """A put's request: ``events`` as the journal packs them (:class:`Columns`), and their ``lines``."""
    head = _encode(tuple(lines) if lines is not None else None)
    return b"".join((_PUT, _LENGTH.pack(len(head)), head, _encode(Columns.of(events))))


class RemoteIntake:
    """An :class:`Intake` whose calls cross ``channel`` to the main process (one
    connection's, used by its reader's thread only). ``auth`` and ``journaled`` are
    told at the hand-over; ``clock``, ``time_unit_ms`` and ``stamp`` are the server's
    settings, for the decoders made here; ``horizon_ahead`` how far past ``clock`` the
    latest t1 accepted is (None: no bound), so that a block's horizon is reckoned here,
    a round trip fewer a block."""

    def __init__(self, channel: socket.socket, *, auth: bool, journaled: bool, clock, time_unit_ms: float,
                 stamp: bool, horizon_ahead: float | None = None) -> None:
        self.channel = channel
        self.auth = auth
        self.journaled = journaled
        self.clock = clock
        self.time_unit_ms = time_unit_ms
        self.stamp = stamp
        self.horizon_ahead = horizon_ahead
        self._position = 0
        self._durable: int | None = None  # what the last put's answer said is durable, until asked once
        self._schemas: dict[str, tuple[bytes, Any]] = {}  # published streams': their bytes and their schema
        self._declared: dict[str, Any] = {}  # declared streams' schemas

    def _call(self, *request):
        return self._ask(_encode(request))

    def _ask(self, request: bytes):
        send(self.channel, request)
        answer = receive(self.channel)
        if answer is None:
            raise OSError("the server ended the connection's channel")
        status, *rest = _decode(answer)
        if status == 0:
            return rest[0]
        kind, message, arg = rest
        if kind == "disk":
            raise DiskFull(*message, first_refused=arg)
        if kind == "auth":
            raise AuthRefused(arg, message)
        raise OSError(message)

    def authenticate(self, token: bytes | None, address: str) -> None:
        self._call("authenticate", token, address)

    def claim(self, sender: str) -> bool:
        return self._call("claim", sender)

    def release(self, sender: str) -> None:
        self._call("release", sender)

    def progress(self, sender: str) -> int:
        return self._call("progress", sender)

    def record_progress(self, sender: str, lines_done: int) -> None:
        self._position = self._call("record_progress", sender, lines_done)

    def decoder(self, fmt: str):
        return make_decoder(fmt, self.catalog, clock=self.clock if self.stamp else None,
                            time_unit_ms=self.time_unit_ms, streams=self._call("streams"))

    def catalog(self, name: str):
        """The declaration of stream ``name`` now (None: none), the same object while it is unchanged.
        A declared stream's is kept and not asked again: a declaration is never changed nor taken
        back while the server runs (a second one must be the same, else it is refused). A stream a
        subscription publishes may go with it, and one not known now may be declared at any time:
        those are asked each time, once a block."""
        kept = self._declared.get(name)
        if kept is not None:
            return kept
        data, declared = self._call("schema", name)
        if data is None:
            self._schemas.pop(name, None)
            return None
        if declared:
            self._schemas.pop(name, None)
            kept = self._declared[name] = pickle.loads(data)
            return kept
        kept = self._schemas.get(name)
        if kept is None or kept[0] != data:
            kept = self._schemas[name] = (data, pickle.loads(data))
        return kept[1]

    def horizon(self) -> float | None:
        return None if self.horizon_ahead is None else self.clock() + self.horizon_ahead

    def put(self, events, lines: Lines | None = None) -> list[int]:
        late, self._position, self._durable = self._ask(put_request(events, lines))
        return late

    def count(self, what: Count, n: int = 1) -> None:
        self._call("count", what.value, n)

    def position(self) -> int:
        """The journal's position after this connection's last put (or progress)."""
        return self._position

    def durable(self) -> int:
        """What is durable: as the last put's answer said, the first time after it (what its
        acknowledgement asks at once; a position a moment old only acknowledges later), else asked."""
        told, self._durable = self._durable, None
        return told if told is not None else self._call("durable")

    def wait_durable(self, position: int, wait: float) -> None:
        self._call("wait_durable", position, wait)

    def stop(self) -> None:
        """(The main process's intake stops the puts.)"""
