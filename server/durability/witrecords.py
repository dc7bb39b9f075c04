"""The witness log's records on disk (witlog.py says what the log is), shared by
its writer (:class:`~server.durability.witlog.WitnessLog`) and its readers
(:class:`~server.durability.witcursor.Cursor`), and what both know of a
segment (:class:`Segment`). No I/O.

A record's body is ``<u8 kind><u64 seq><u16 len(sid)><u16 len(stream)> sid
stream payload`` (little-endian), framed by :mod:`server.durability.framing`.
Kinds: 0 a single witness; 1 a checkpoint, whose payload is JSON ``{sid: last
seq}``: the first record of every segment (its ``seq`` 0: the last seq of every
subscription so far), or, with ``seq`` :data:`GAP_MARK`, a *gap mark* anywhere
in a segment: the numbering of those subscriptions went on to that seq although
the log holds none of the witnesses between (recovery found them lost and could
not rebuild them: server/durability/witgaps.py). A reader of an older version
takes a gap mark for a checkpoint, which is what it is for numbering; 2 a batch,
whose payload is the batch's witnesses as msgpack, four arrays ``[sids, seqs,
streams, payloads]``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from itertools import compress
from operator import ne
from pathlib import Path
from typing import NamedTuple

import msgspec

from server.durability import framing
from server.durability.framing import BadRecord

NAMES = framing.SegmentNames("wit-", 12, ".log")
BODY = struct.Struct("<BQHH")  # kind, seq, len(sid), len(stream)
WITNESS, CHECKPOINT, BATCH = 0, 1, 2
#: The ``seq`` of a checkpoint record that marks a gap (0: a segment's first checkpoint).
GAP_MARK = 1
pack_batch = msgspec.msgpack.Encoder().encode
unpack_batch = msgspec.msgpack.Decoder(tuple[list[str], list[int], list[str], list[bytes]]).decode
#: Records longer than this are taken for corruption when found (a witness is
#: at most a few MiB: max_value_bytes per attribute).
MAX_RECORD = 1 << 30

Record = tuple  # (sid, seq, stream, payload)


class Gone(Exception):
    """What a reader asked for has been deleted by retention."""

    def __init__(self, sid: str, wanted: int, first: int) -> None:
        self.sid, self.wanted, self.first = sid, wanted, first
        super().__init__(f"from {wanted} is no longer retained: the log of {sid} starts at {first}")


class Gap(NamedTuple):
    """Witnesses ``first`` to ``last`` of a subscription that the log does not
    hold though they were numbered (lost: a cut or damaged log that recovery
    could not rebuild). A cursor hands one on in place of a payload, as
    ``(sid, last, Gap(first, last))``, where the missing witnesses would be."""

    first: int
    last: int


@dataclass
class Sub:
    first_seq: int
    first_off: int
    last_seq: int


@dataclass
class Segment:
    number: int
    path: Path
    size: int = 0  # bytes readers may read (whole records only)
    records: int = 0  # witness records
    newest: float = 0.0  # clock time of its newest record
    subs: dict[str, Sub] = field(default_factory=dict)
    streams: dict[str, set[str]] = field(default_factory=dict)
    sealed: bool = False
    # offset of its first record, 0 in a segment of the older framing (version 1): known once it was
    # scanned or its checkpoint read (a sealed segment's index gives offsets of its own)
    start: int = framing.HEADER.size
    #: the gap marks it holds (above): per subscription, (first, last) of each gap
    gaps: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    #: per subscription, the stream it last published on here: one ``streams`` holds it under
    #: (a writer's shortcut: not stored in the index)
    stream_of: dict[str, str] = field(default_factory=dict)

    def take_batch(self, off: int, size: int, n: int, firsts: dict[str, int], lasts: dict[str, int],
                   sids, streams, now: float) -> None:
        """Index a batch record of ``n`` witnesses written at ``off`` (``size`` bytes): per
        subscription its first and last seq, and which published on which stream (``sids[i]``
        on ``streams[i]``). Set operations and C-level passes: a batch has thousands of
        subscriptions, most seen before; only the pairs whose stream is not the one last seen
        of their subscription here are looked at (hashing every pair of a batch cost more than
        the write)."""
        subs, index, hint = self.subs, self.streams, self.stream_of
        fresh = firsts.keys() - subs.keys()
        for sid in fresh:
            subs[sid] = Sub(firsts[sid], off, lasts[sid])
        if len(fresh) < len(lasts):
            for sid, seq in lasts.items():
                subs[sid].last_seq = seq
        for sid, stream in compress(zip(sids, streams), map(ne, map(hint.get, sids), streams)):
            pubs = index.get(stream)
            if pubs is None:
                index[stream] = {sid}
            else:
                pubs.add(sid)
        hint.update(zip(sids, streams))
        self.records += n
        self.size = off + size
        self.newest = now

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(".idx")

    def index_bytes(self) -> bytes:
        """Its index (a sealed segment's ``.idx``: opening the log then reads no record)."""
        return json.dumps({"size": self.size, "records": self.records,
                           "subs": {s: [v.first_seq, v.first_off, v.last_seq] for s, v in self.subs.items()},
                           "streams": {s: sorted(v) for s, v in self.streams.items()},
                           "gaps": {s: [list(g) for g in v] for s, v in self.gaps.items()}},
                          separators=(",", ":")).encode()

    def take_index(self, data: dict) -> None:
        """What :meth:`index_bytes` wrote, read back (KeyError, TypeError: not an index)."""
        self.size, self.records = data["size"], data["records"]
        self.subs = {s: Sub(*v) for s, v in data["subs"].items()}
        self.streams = {s: set(v) for s, v in data["streams"].items()}
        self.gaps = {s: [tuple(g) for g in v] for s, v in data.get("gaps", {}).items()}


def body_of(body: bytes | memoryview):
    """A record's body: (kind, seq, sid, stream, payload), or None when it is not one."""
    kind, seq, ls, lt = BODY.unpack_from(body, 0)
    o = BODY.size
    if kind not in (WITNESS, CHECKPOINT, BATCH) or o + ls + lt > len(body):
        return None
    try:
        sid = bytes(body[o:o + ls]).decode()
        stream = bytes(body[o + ls:o + ls + lt]).decode()
    except UnicodeDecodeError:
        return None
    return kind, seq, sid, stream, body[o + ls + lt:]


def parse(buf: bytes | memoryview, pos: int, end: int):
    """The record at ``pos``: (kind, seq, sid, stream, payload, next pos), or
    None when it is incomplete or corrupt."""
    try:
        body, nxt = framing.unframe(buf, pos, end, min_length=BODY.size, max_length=MAX_RECORD)
    except BadRecord:
        return None
    rec = body_of(body)
    return None if rec is None else (*rec, nxt)


def encode(kind: int, seq: int, sid: bytes, stream: bytes, payload: bytes) -> bytes:
    return framing.frame(BODY.pack(kind, seq, len(sid), len(stream)) + sid + stream + payload)
