"""The witness log's format (server/durability/witlog.py has the whole
description): record bodies ``<u8 kind><u64 seq><u16 len(sid)><u16
len(stream)> sid stream payload`` in the one framing (framing.py), the kinds
(a single witness, a checkpoint, a batch), and what the writer and the readers
(witcursor.py) know of a segment. No I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from server.durability import framing
from server.durability.framing import BadRecord

NAMES = framing.SegmentNames("wit-", 12, ".log")
BODY = struct.Struct("<BQHH")  # kind, seq, len(sid), len(stream)
WITNESS, CHECKPOINT, BATCH = 0, 1, 2
pack = msgspec.msgpack.Encoder().encode
unpack = msgspec.msgpack.Decoder(tuple[list[str], list[int], list[str], list[bytes]]).decode
#: Records longer than this are taken for corruption when found (a witness is
#: at most a few MiB: max_value_bytes per attribute).
MAX_RECORD = 1 << 30

Record = tuple  # (sid, seq, stream, payload)


class Gone(Exception):
    """What a reader asked for has been deleted by retention."""

    def __init__(self, sid: str, wanted: int, first: int) -> None:
        self.sid, self.wanted, self.first = sid, wanted, first
        super().__init__(f"from {wanted} is no longer retained: the log of {sid} starts at {first}")


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

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(".idx")


def name(number: int) -> str:
    return NAMES.name(number)


def body(data: bytes | memoryview):
    """A record's body: (kind, seq, sid, stream, payload), or None when it is not one."""
    kind, seq, ls, lt = BODY.unpack_from(data, 0)
    o = BODY.size
    if kind not in (WITNESS, CHECKPOINT, BATCH) or o + ls + lt > len(data):
        return None
    try:
        sid = bytes(data[o:o + ls]).decode()
        stream = bytes(data[o + ls:o + ls + lt]).decode()
    except UnicodeDecodeError:
        return None
    return kind, seq, sid, stream, data[o + ls + lt:]


def parse(buf: bytes | memoryview, pos: int, end: int):
    """The record at ``pos``: (kind, seq, sid, stream, payload, next pos), or
    None when it is incomplete or corrupt."""
    try:
        data, nxt = framing.unframe(buf, pos, end, min_length=BODY.size, max_length=MAX_RECORD)
    except BadRecord:
        return None
    rec = body(data)
    return None if rec is None else (*rec, nxt)


def encode(kind: int, seq: int, sid: bytes, stream: bytes, payload: bytes) -> bytes:
    return framing.frame(BODY.pack(kind, seq, len(sid), len(stream)) + sid + stream + payload)
