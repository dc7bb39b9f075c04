"""What crosses the pipe between the main process and an engine worker.

Every message is one ``send_bytes`` (on the results channel, a length and then
the message): a tag byte, then its body.

main -> worker
  ``B``  a batch: MessagePack ``[fed, recorded, streams, values, t0s, t1s, per_stream]``:
         ``fed`` the events taken once this batch is (the state budget's check
         points are multiples of it), ``recorded`` the sheddings a recovery
         applies again at this point (``[sid, keep, reason, shared, seq]``), then
         the events as columns of :class:`air.engine.Event`'s arguments (one
         C-level call makes them all): their streams (one name where they are
         all of one stream), their values (``[[values...], ...]``), their
         ``t0`` (nil where each is its ``t1``, or an int equal to it: point events) and their ``t1``;
         decoded once, in the main process, and not pickled (MessagePack of
         plain values); ``per_stream`` their number per stream where the main
         process counted them (nil: the worker counts them).
  ``C``  a command: pickle ``(number, name, args)``; answered by an ``A``.
  ``P``  the decisions of the last check to apply (or none): pickle ``list[Decision]``,
         answered by an ``A`` numbered 0 with the outcomes.

worker -> main (``R`` and the ``A`` numbered 0 on the results channel, server/workers/channel.py,
which the engine thread reads; the rest on the pipe, which the link's reader thread reads)
  ``R``  a batch's result: MessagePack ``[events, groups, internal, stats, epoch,
         errors, check, recorded, places, owners, counts, streams, sids, rest,
         nums, stream_nums, fresh, fresh_streams, checks, ref, sizes, befores]``: the witnesses encoded
         as the witness log and the WebSocket frames hold them, the engine's
         running totals, the epoch, the errors of events the engine failed on,
         what the state budget's check found (or nil), the outcomes of
         ``recorded``, and ``places``: per row-scaled subscription with witnesses,
         ``[sid, [place...]]``, the place in this worker's batch of the event
         that made each witness (the main process merges the workers' by them).
         The witnesses come in two forms. A row-scaled subscription's (to be
         merged before they are numbered) and the watched internal streams'
         are ``groups`` and ``internal``: ``[sid, [streams], payloads joined by
         newlines]`` per subscription. Every other subscription's are columns
         the witness log's batch record is made of, so that the main process
         neither splits nor re-packs them (server/delivery/witnesses.py's
         ``Columns``): per subscription, in the order they first emitted, its
         sid, its number of witnesses and their stream (a list of each one's
         where not all are on one), as three arrays (the numbers as int32 bin,
         the machine's order: read by one ``numpy.frombuffer``); ``sids`` the array of each
         witness's sid; ``rest`` the pair of the arrays of their streams and of
         their payloads. All but the counts are MessagePack arrays, each sent
         packed, as bin, and the main process takes them as memoryviews: no copy,
         and the names unpacked only when it needs them (a client watches some).
         ``nums``, ``stream_nums``, ``fresh``, ``fresh_streams``: the owners and
         their streams as the worker numbers them (server/delivery/witnesses.py's
         ``LocalNumbers``), each number's name told once; ``checks`` the names
         at the few places the main process checks those numbers at. The main process
         numbers them and writes ``0x94 + sids + seqs + rest[1:]``: the record
         ``pack_batch((sids, seqs, streams, payloads))`` makes, byte for byte.
         ``ref``: nil, or where the worker wrote the payloads itself (a file of
         its own beside the witness log, server/durability/witside.py): ``sids``
         and ``rest`` are then empty, and the main process writes a record told
         per subscription that refers to them (``0x95 + owners + firsts + counts
         + streams + ref``, kind 4: nothing of it a witness); ``sizes``
         is then each payload's length (``Columns.sizes``), for reading only the watched ones.
         ``befores``: each owner's last seq before this batch as the worker numbered them
         (``LocalNumbers.last``; int32 bin where all fit, else int64, the machine's order),
         which the main process checks against its own.
  ``A``  a command's answer: pickle ``(number, ok, value)``.
  ``S``  a snapshot the worker's child wrote: pickle ``(ok, detail)``.
  ``W``  where its engine is while a batch has run a second or more (server/workers/worker.py's
         ``Watch``): pickle ``{"function": name or None, "at": "file:line, in name"}``, or None
         once the batch has ended.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import msgspec

from air.engine import Event
from air.engine.convert import STRINGS, event_columns, events_of
from server.delivery.encoding import Columns, LocalNumbers, pack_columns, pack_flat

BATCH, COMMAND, APPLY = b"B", b"C", b"P"
RESULT, ANSWER, SNAPSHOT, WHERE = b"R", b"A", b"S", b"W"
#: The parts of a worker's CPU time on batches (``counts``' answer, server/workers/worker.py's ``cpu_parts``):
#: making the batch's events, the engine's feed, the witnesses' and the result's encoding.
CPU_PARTS = ("decode", "engine", "witnesses")

_encode = msgspec.msgpack.Encoder().encode
_batch = msgspec.msgpack.Decoder(tuple[int, list, Union[str, list[str]], list[tuple], Optional[list[Any]], list[Any],
                                       Optional[dict[str, int]]])
#: the columns' ``owners``, ``streams`` (thousands of names), ``sids`` and ``rest`` (megabytes of
#: witnesses) are taken as memoryviews of the message: no copy until the witness log's record is made
#: of them, the names unpacked only when read. They cross as bin holding the packed arrays: the decoder
#: steps over each by its length (taken in place, as ``msgspec.Raw``, each of its thousands of items was
#: parsed to find the end: 81 us of a batch of 6,400 subscriptions, 4 as bin; BENCHMARKS.md, round 22).
#: ``counts`` as int32 bytes
_result = msgspec.msgpack.Decoder(tuple[(Any,) * 9 + (memoryview, bytes, memoryview, memoryview, memoryview)
                                       + (Any,) * 7 + (bytes,)])


def encode_batch(fed: int, recorded: list, events: list, per_stream: dict[str, int] | None = None) -> bytes:
    """A ``B`` message of ``events`` (:class:`air.engine.Event`), with their number per stream
    when the sender has counted them (the worker counts them itself otherwise)."""
    streams, values, t0s, t1s = event_columns(events)  # (t0s None: point events, each t0 its t1)
    return BATCH + _encode((fed, recorded, streams, values, t0s, t1s, per_stream))


def decode_batch(body: bytes, strings: dict = STRINGS) -> tuple[int, list, list[Event], dict[str, int] | None]:
    """A ``B`` message's fields, its events made (their short strings shared by ``strings``: the
    process's table, air/engine/convert.py's ``STRINGS``, kept across a worker's batches; ``events_of``)."""
    fed, recorded, streams, values, t0s, t1s, per_stream = _batch.decode(body)
    return fed, recorded, events_of(streams, values, t0s, t1s, strings), per_stream


def encode_result(events: int, encoded, stats: tuple, epoch, errors: list, check, recorded: list,
                  places: list = (), rows: set[str] | frozenset = frozenset(),
                  local: LocalNumbers | None = None, side: Callable | None = None) -> bytes:
    """An ``R`` message: the witnesses of ``rows`` (row-scaled subscriptions) as groups, the others as
    columns (numbered by ``local``: the worker's :class:`LocalNumbers`; their payloads written by
    ``side`` where given, server/delivery/encoding.py's ``pack_flat``)."""
    merged = [g for g in encoded.groups if g[0] in rows] if rows else []
    if encoded.flat is not None:  # (none of them row-scaled: the worker asks for it only then)
        cols = pack_flat(encoded.flat, local, side)
    else:
        cols = pack_columns([g for g in encoded.groups if g[0] not in rows] if rows else encoded.groups, local)
    groups = [(sid, streams, b"\n".join(payloads)) for sid, streams, payloads in merged]
    internal = [(sid, streams, b"\n".join(payloads)) for sid, streams, payloads in encoded.internal]
    return RESULT + _encode((events, groups, internal, stats, epoch, errors, check, recorded, places, *cols.packed()))


def decode_result(body: bytes) -> list:
    """A result's fields (see the module's docstring), the columns as one :class:`Columns`."""
    out = list(_result.decode(body))
    for part in (out[1], out[2]):
        for g in part:
            g[2] = g[2].split(b"\n")
    out[9:] = [Columns(*out[9:])]
    return out
