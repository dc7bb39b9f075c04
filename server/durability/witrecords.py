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
streams, payloads]``; 3 a batch whose payloads an engine worker wrote to a file of
its own (witside.py): ``[sids, seqs, streams, [file, offset, length]]`` (a segment
that may hold these is of framing version 3); 4 such a batch told per subscription, not per
witness: ``[owners, firsts, counts, streams, [file, offset, length]]``, each subscription's
witnesses numbered ``first`` on, ``count`` of them, on ``stream`` (or a list of each one's),
in the order of the payloads (:func:`runs_columns` makes the columns of a kind 3 of it; a
segment that may hold these is of framing version 4). What the main process writes of an
engine worker's batch of thousands of subscriptions: its numbers and names, never a sid,
seq or stream a witness.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import NamedTuple, Sequence, Union

import msgspec
import numpy as np

from server.durability import framing
from server.durability.framing import BadRecord
from server.durability.seqmap import grown

NAMES = framing.SegmentNames("wit-", 12, ".log")
BODY = struct.Struct("<BQHH")  # kind, seq, len(sid), len(stream)
WITNESS, CHECKPOINT, BATCH, SIDE, RUNS = 0, 1, 2, 3, 4
#: The ``seq`` of a checkpoint record that marks a gap (0: a segment's first checkpoint).
GAP_MARK = 1
pack_batch = msgspec.msgpack.Encoder().encode
#: A seq as MessagePack's uint32 (``0xce`` and 4 bytes, big-endian), or uint64 (``0xcf``) beyond.
_UINT32 = np.dtype([("tag", "u1"), ("value", ">u4")])
_UINT64 = np.dtype([("tag", "u1"), ("value", ">u8")])
unpack_batch = msgspec.msgpack.Decoder(tuple[list[str], list[int], list[str], list[bytes]]).decode
#: a kind 3 record's payload: the payloads' place in a worker's file (witside.py's ``Ref``) instead of them
unpack_side = msgspec.msgpack.Decoder(tuple[list[str], list[int], list[str], tuple[str, int, int]]).decode
#: a kind 4 record's payload: per subscription its first seq, its number of witnesses and their stream(s)
unpack_runs = msgspec.msgpack.Decoder(tuple[list[str], list[int], list[int], list[Union[str, list[str]]],
                                            tuple[str, int, int]]).decode
#: The JSON ``json.dumps(..., separators=(",", ":"))`` writes (letters beyond ASCII as UTF-8,
#: not escaped: ``json.loads`` reads both), ten times as fast: a sealed segment's index and each
#: segment's checkpoint name every subscription, and with 10,000 of them ``json`` held the
#: engine thread 5-6 ms a roll, this 0.5 ms.
dump_json = msgspec.json.Encoder().encode
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


@dataclass(eq=False)  # (one is itself: its lock and arrays compare as nothing else)
class Segment:
    number: int
    path: Path
    size: int = 0  # bytes readers may read (whole records only)
    records: int = 0  # witness records
    newest: float = 0.0  # clock time of its newest record
    _subs: dict[str, Sub] = field(default_factory=dict)
    _streams: dict[str, set[str]] = field(default_factory=dict)
    sealed: bool = False
    # offset of its first record, 0 in a segment of the older framing (version 1): known once it was
    # scanned or its checkpoint read (a sealed segment's index gives offsets of its own)
    start: int = framing.HEADER.size
    #: the gap marks it holds (above): per subscription, (first, last) of each gap
    gaps: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    #: batch records written and not yet in ``subs``/``streams`` (see :meth:`take_batch`)
    pending: list = field(default_factory=list)
    #: the engine workers' payload files its records refer to: the bytes of each they refer to, and
    #: where in each the last they refer to ends
    side: dict[str, int] = field(default_factory=dict)
    side_end: dict[str, int] = field(default_factory=dict)
    _stream_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # see _fold
    _folding: threading.Lock = field(default_factory=threading.Lock)

    @property
    def subs(self) -> dict[str, Sub]:
        """Per subscription its first seq, the offset of its first record, its last seq."""
        self._fold()
        return self._subs

    @subs.setter
    def subs(self, value: dict[str, Sub]) -> None:
        self._subs = value

    @property
    def streams(self) -> dict[str, set[str]]:
        """Per stream the subscriptions that published on it here."""
        self._fold()
        return self._streams

    @streams.setter
    def streams(self, value: dict[str, set[str]]) -> None:
        self._streams = value

    def take_batch(self, off: int, size: int, n: int, numbers, nums: np.ndarray, starts: np.ndarray,
                   ends: np.ndarray, pair_nums: np.ndarray, pair_streams: np.ndarray, now: float) -> None:
        """Note a batch record of ``n`` witnesses written at ``off`` (``size`` bytes): the
        subscriptions numbered ``nums`` (:class:`~server.durability.seqmap.Numbers`, each
        once) with their first and last seqs in it, and ``pair_nums[i]`` published on the
        stream numbered ``pair_streams[i]`` (``numbers`` gives both ids). Kept as it is and
        taken into ``subs`` and ``streams`` once they are read (a reader, or the index written
        when the segment is sealed): a batch has thousands of subscriptions, and a dict's
        pass over them cost more than the write."""
        with self._folding:
            self.pending.append((off, nums, starts, ends, pair_nums, pair_streams, numbers))
        self.records += n
        self.size = off + size
        self.newest = now

    def seal(self) -> None:
        """No record comes any more. The records not yet folded become one, by array steps (each
        subscription's first seq and the offset of its first record, its last seq; each pair of a
        subscription and a stream once), folded when a reader asks: :meth:`index_bytes` writes
        the index of a segment no reader has asked of from that record alone, with no object
        per subscription (10,000 subscriptions: folding and the index 7.7 -> 3.2 ms alone; a
        roll's CPU on the engine thread, every 64 MiB of witnesses, 21 -> 17 ms in the server:
        BENCHMARKS.md, "Engine workers, round 9")."""
        with self._folding:
            if self.pending:
                self.pending = [_merged(self.pending)]
            self.sealed = True
            self._stream_of = np.zeros(0, np.int64)

    def _fold(self) -> None:
        """Take the pending records into ``subs`` and ``streams``: merged into one by array steps
        (:func:`_merged`), then a Python step per subscription it touched, and per (subscription,
        stream) pair whose stream is not the last one seen of its subscription here. Whoever
        reads waits for a fold another thread is doing."""
        with self._folding:
            pending, self.pending = self.pending, []
            if not pending:
                return
            offs, touched, firsts, lasts, pair_nums, pair_streams, numbers = _merged(pending, sort=False)
            names, stream_names = numbers[0].names, numbers[1].names
            # per subscription number: 1 + the stream last seen of it here (0: none)
            seen = self._stream_of = grown(self._stream_of, len(names))
            tagged = pair_streams + 1
            other = seen[pair_nums] != tagged
            if other.any():
                index = self._streams
                for num, stream in zip(pair_nums[other].tolist(), pair_streams[other].tolist()):
                    index.setdefault(stream_names[stream], set()).add(names[num])
                seen[pair_nums] = tagged  # (a pair each stream of one on several: any of them will do)
            subs = self._subs
            for num, fs, fo, ls in zip(touched.tolist(), firsts.tolist(), offs.tolist(), lasts.tolist()):
                sid = names[num]
                sub = subs.get(sid)
                if sub is None:
                    subs[sid] = Sub(fs, fo, ls)
                else:
                    sub.last_seq = ls
            if self.sealed:  # (its one merged record, folded: nothing more comes to tell apart)
                self._stream_of = np.zeros(0, np.int64)

    @property
    def weight(self) -> int:
        """Its bytes, with those of the payloads its records refer to in workers' files."""
        return self.size + sum(self.side.values())

    def refer(self, name: str, offset: int, length: int) -> None:
        """A record of it refers to ``length`` bytes at ``offset`` of the payload file ``name``."""
        self.side[name] = self.side.get(name, 0) + length
        self.side_end[name] = max(self.side_end.get(name, 0), offset + length)

    def refers_past(self, sizes: dict[str, int]) -> bool:
        """Whether a record of it refers beyond the end of a payload file (``sizes``: each one's
        size): a power cut kept the record and not what the worker wrote."""
        return any(end > sizes.get(name, 0) for name, end in self.side_end.items())

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(".idx")

    def index_bytes(self) -> bytes:
        """Its index (a sealed segment's ``.idx``: opening the log then reads no record), as
        MessagePack columns (:func:`load_index` reads it, and the JSON of the Cayuga before):
        ``sids``, and per sid its ``first`` seq, the offset ``off`` of its first record and its
        ``last`` seq (int64 arrays, little-endian); ``streams``, and the pairs of a stream and a
        sid that published on it (``pair_streams``, ``pair_sids``: int32 places in the two
        lists); ``gaps``, ``side``, ``side_end`` as :meth:`take_index` takes them. Of a segment
        no reader asked of, made from its one merged record by array steps, with no object per
        subscription: a dict and a sorted list a stream, then JSON, had cost 4.3 ms of the
        engine thread's 10 ms roll with 10,000 subscriptions (BENCHMARKS.md, round 29)."""
        with self._folding:
            unread = self.sealed and len(self.pending) == 1 and not self._subs and not self._streams
            if unread:  # (a sealed segment no reader asked of: its one merged record, as it is)
                columns = _columns_of(self.pending[0])
        if not unread:
            subs, streams = self.subs, self.streams
            sids = list(subs)
            at = {sid: i for i, sid in enumerate(sids)}
            kinds = list(streams)
            pairs = [(k, at[sid]) for k, stream in enumerate(kinds) for sid in streams[stream]]
            columns = (sids, [v.first_seq for v in subs.values()], [v.first_off for v in subs.values()],
                       [v.last_seq for v in subs.values()], kinds, [k for k, _ in pairs], [i for _, i in pairs])
        sids, firsts, offs, lasts, kinds, pair_streams, pair_sids = columns
        return _pack_index({"size": self.size, "records": self.records, "sids": sids, "first": _int64s(firsts),
                            "off": _int64s(offs), "last": _int64s(lasts), "streams": kinds,
                            "pair_streams": _int32s(pair_streams), "pair_sids": _int32s(pair_sids),
                            "gaps": {s: [list(g) for g in v] for s, v in self.gaps.items()}, "side": self.side,
                            "side_end": self.side_end})

    def take_index(self, data: dict) -> None:
        """What :meth:`index_bytes` wrote, read back by :func:`load_index` (KeyError, TypeError,
        ValueError: not an index)."""
        self.size, self.records = data["size"], data["records"]
        if "sids" in data:  # (the columns)
            sids, kinds = data["sids"], data["streams"]
            firsts, offs, lasts = (np.frombuffer(data[k], "<i8").tolist() for k in ("first", "off", "last"))
            if not len(sids) == len(firsts) == len(offs) == len(lasts):
                raise ValueError("an index's columns differ in length")
            self.subs = dict(zip(sids, map(Sub, firsts, offs, lasts)))
            streams: dict[str, set[str]] = {}
            for k, i in zip(np.frombuffer(data["pair_streams"], "<i4").tolist(),
                            np.frombuffer(data["pair_sids"], "<i4").tolist()):
                streams.setdefault(kinds[k], set()).add(sids[i])
            self.streams = streams
        else:  # (JSON: {sid: [first, off, last]}, {stream: [sid, ...]})
            self.subs = {s: Sub(*v) for s, v in data["subs"].items()}
            self.streams = {s: set(v) for s, v in data["streams"].items()}
        self.gaps = {s: [tuple(g) for g in v] for s, v in data.get("gaps", {}).items()}
        self.side = {str(k): int(v) for k, v in data.get("side", {}).items()}
        self.side_end = {str(k): int(v) for k, v in data.get("side_end", {}).items()}


_pack_index = msgspec.msgpack.Encoder().encode
_unpack_index = msgspec.msgpack.Decoder(dict).decode


def _int64s(values) -> bytes:
    return np.asarray(values, "<i8").tobytes()


def _int32s(values) -> bytes:
    return np.asarray(values, "<i4").tobytes()


def load_index(raw: bytes) -> dict:
    """A sealed segment's ``.idx`` as :meth:`Segment.take_index` takes it: the MessagePack columns
    :meth:`Segment.index_bytes` writes, or the JSON of the Cayuga before (ValueError: neither)."""
    return msgspec.json.decode(raw) if raw[:1] == b"{" else _unpack_index(raw)  # (msgspec.DecodeError: a ValueError)


def pack_seqs(seqs: np.ndarray, bounds: tuple[int, int] | None = None) -> bytes:
    """The MessagePack array of ``seqs`` (non-negative ints) that ``pack_batch(seqs.tolist())``
    would read back as, each packed as a uint32 (uint64 past it) by one array pass: a batch of a
    worker's has thousands of witnesses, and a list of their seqs and its packing cost the engine
    thread more than the rest of their numbering (BENCHMARKS.md, "Engine workers, round 22").
    ``bounds``: their least and greatest where the caller knows them (a range: no pass to find them)."""
    n = len(seqs)
    if n < 16:
        head = bytes((0x90 | n,))
    elif n < 1 << 16:
        head = b"\xdc" + n.to_bytes(2, "big")
    else:
        head = b"\xdd" + n.to_bytes(4, "big")
    if not n:
        return head
    low, high = bounds if bounds is not None else (int(seqs.min()), int(seqs.max()))
    if low < 0:
        raise ValueError("a seq is never negative")
    wide = high > 0xFFFFFFFF
    out = np.empty(n, _UINT64 if wide else _UINT32)
    out["tag"] = 0xCF if wide else 0xCE
    out["value"] = seqs
    return head + out.tobytes()


def _merged(pending: list, sort: bool = True) -> tuple:
    """Batch records noted by :meth:`Segment.take_batch` as one, whose ``off`` is an array (each
    subscription's first record's) and whose pairs are each once, sorted by stream (unless not
    ``sort``: then in their order, and one may come again after another of its subscription's)."""
    numbers = pending[-1][6]
    size = len(numbers[0].names)
    first, first_off, last = np.zeros(size, np.int64), np.zeros(size, np.int64), np.zeros(size, np.int64)
    seen = np.full(size, -1, np.int64)  # per subscription, the stream last seen of it in these records
    kept_nums, kept_streams = [], []
    for off, nums, starts, ends, pair_nums, pair_streams, _numbers in pending:
        new = first[nums] == 0
        first[nums[new]] = starts[new]
        first_off[nums[new]] = off if type(off) is int else off[new]
        last[nums] = ends
        other = seen[pair_nums] != pair_streams
        if other.any():
            kept_nums.append(pair_nums[other])
            kept_streams.append(pair_streams[other])
            seen[pair_nums] = pair_streams
    touched = np.flatnonzero(last)
    if not kept_nums:
        pair_nums = pair_streams = np.zeros(0, np.int64)
    elif sort:
        # each pair once, by sorting (np.unique imports numpy.ma at its first call: 10 ms on the
        # engine thread at a run's first roll)
        pairs = np.sort(np.concatenate(kept_streams).astype(np.int64) * size + np.concatenate(kept_nums))
        pairs = pairs[np.concatenate(([True], pairs[1:] != pairs[:-1]))]
        pair_nums, pair_streams = pairs % size, pairs // size
    else:
        pair_nums, pair_streams = np.concatenate(kept_nums), np.concatenate(kept_streams)
    return (first_off[touched], touched, first[touched], last[touched], pair_nums, pair_streams, numbers)


def _columns_of(record: tuple) -> tuple:
    """An index's columns (:meth:`Segment.index_bytes`) from a merged batch record (:func:`_merged`:
    its pairs sorted by stream), by array steps: the sids and their seqs and offsets, the streams
    and each pair's places in the two."""
    off, nums, starts, ends, pair_nums, pair_streams, numbers = record
    names, stream_names = numbers[0].names, numbers[1].names
    sids = list(map(names.__getitem__, nums.tolist()))  # (nums ascending: the pairs' sids found by searchsorted)
    new = np.concatenate(([True], pair_streams[1:] != pair_streams[:-1])) if len(pair_streams) else pair_streams
    kinds = pair_streams[new]  # (not np.unique: it imports numpy.ma at its first call, on the engine thread)
    places = np.cumsum(new) - 1
    return (sids, starts, off, ends, list(map(stream_names.__getitem__, kinds.tolist())), places,
            np.searchsorted(nums, pair_nums))


def runs_columns(runs: tuple) -> tuple[list[str], list[int], list[str], tuple]:
    """A kind 4 record's payload (:data:`unpack_runs`) as a kind 3's: ``(sids, seqs, streams,
    ref)``, an entry a witness. Raises ValueError where they are not whole (:func:`runs_checked`)."""
    runs_checked(runs)
    owners, firsts, counts, kinds, ref = runs
    if not owners:
        return [], [], [], ref
    # array passes (thousands of subscriptions a record: a Python loop over them cost five times the decoding)
    n = np.asarray(counts, np.int64)
    ends = np.cumsum(n)
    sids = np.repeat(_objects(owners), n).tolist()
    seqs = (np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(np.asarray(firsts, np.int64) - (ends - n), n)).tolist()
    if list not in set(map(type, kinds)):
        streams = np.repeat(_objects(kinds), n).tolist()
    else:
        streams = []
        for k, kind in zip(counts, kinds):
            streams += repeat(kind, k) if type(kind) is str else kind
    return sids, seqs, streams, ref


def runs_checked(runs: tuple) -> None:
    """Raises ValueError where a kind 4 record's columns (:data:`unpack_runs`) are not whole: of
    different lengths, a count not positive, or a subscription's list of streams not as long as
    its count (not a record this module wrote)."""
    owners, firsts, counts, kinds, _ref = runs
    if not len(owners) == len(firsts) == len(counts) == len(kinds):
        raise ValueError("a runs record's columns differ in length")
    if owners and min(counts) <= 0:
        raise ValueError("a runs record's count is not positive")
    if list in set(map(type, kinds)):
        for sid, k, kind in zip(owners, counts, kinds):
            if type(kind) is not str and len(kind) != k:
                raise ValueError(f"a runs record's streams of {sid} are not as many as its witnesses")


def _objects(items: list) -> np.ndarray:
    """``items`` as an array of the objects themselves (``np.array`` would make strings of them)."""
    out = np.empty(len(items), object)
    out[:] = items
    return out


def body_of(body: bytes | memoryview):
    """A record's body: (kind, seq, sid, stream, payload), or None when it is not one."""
    kind, seq, ls, lt = BODY.unpack_from(body, 0)
    o = BODY.size
    if kind not in (WITNESS, CHECKPOINT, BATCH, SIDE, RUNS) or o + ls + lt > len(body):
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


def encode_parts(kind: int, seq: int, payload: Sequence[bytes | memoryview]) -> bytes:
    """:func:`encode` with no sid or stream, of a payload given in parts (a batch's: megabytes,
    copied once, into the record)."""
    return framing.frame_parts((BODY.pack(kind, seq, 0, 0), *payload))
