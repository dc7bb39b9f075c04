"""A batch's witnesses, encoded where the engine runs: on the engine thread, or in an
engine worker process (server/workers/), which imports this and not the rest of
the delivery room (no witness log, no hub, no numpy: a worker's start is part of
every server start, and the server waits for it).

:class:`WitnessEncoder` makes a batch's :class:`EncodedBatch` (the JSON lines of
the witness log's payloads and the clients' frames); a worker sends them as
:class:`Columns`, the witness log's batch record's columns, numbered by its
:class:`LocalNumbers`; witnesses.py numbers, logs and delivers them.
"""

from __future__ import annotations

from array import array
from collections import Counter
from itertools import accumulate, chain, repeat
from operator import itemgetter
from typing import Callable, NamedTuple, Union

import msgspec

from air.engine.convert import (
    SIZE_CODE, count_on, grouped_by_owner, number_names, numbered_runs, pack_lines, runs_of,
)
from air.formats import encode_emissions
from air.model import StreamSchema

_STREAM, _OWNER = itemgetter(0), itemgetter(3)  # of an Emission
#: the witness log's batch record's packer (server/durability/witrecords.py's ``pack_batch``: MessagePack)
_pack = msgspec.msgpack.Encoder().encode


class EncodedBatch(NamedTuple):
    """A batch's witnesses, encoded: per subscription (in the order they first
    emitted) ``(sid, streams, payloads)`` of its output witnesses, in the
    order the engine made them, and the same for the internal (RESUB) streams'
    witnesses a client watches (not numbered nor logged). ``flat``: instead of
    ``groups`` (then empty), the same witnesses as :func:`pack_flat` takes them
    (:meth:`WitnessEncoder.encode` with ``flat``; with ``local``, the subscriptions
    already numbered, a seventh item)."""
    groups: list
    internal: list
    flat: tuple | None = None


#: An ``array`` type code of a 32-bit signed int (:meth:`Columns.counts_packed`).
COUNT_CODE = next(code for code in "il" if array(code).itemsize == 4)
#: An ``array`` type code of a 64-bit signed int (:attr:`Columns.befores` past int32's range).
SEQ_CODE = next(code for code in "lq" if array(code).itemsize == 8)

#: How many places of a batch's subscriptions the names are checked at (witnesses.py's ``NumberMap.take``).
CHECKS = 8


def check_places(n: int) -> range:
    """The places of ``n`` subscriptions whose names witnesses.py's ``NumberMap`` checks its numbers against."""
    return range(0, n, max(n // CHECKS, 1))


class Columns:
    """A batch's witnesses as an engine worker sends them (server/workers/codec.py):
    the witness log's batch record's columns, ready to be numbered and written.
    Per subscription, in the order they first emitted, three parallel lists (no
    object per subscription): ``owners``, ``counts`` (its witnesses; from a worker's
    result int32 bytes, :meth:`counts_packed`, a list when first read) and
    ``streams`` (the stream they are on, or a list of each one's where not all
    are on one); ``sids`` each witness's sid as a packed MessagePack array,
    ``rest`` the packed pair of the arrays of their streams and of their payloads.
    Both are any bytes-like object: the main process takes them from a worker's
    result without a copy (a ``memoryview`` of it: they cross as bin, which the
    decoder steps over by its length, not item by item), and copies them once, into
    the record. ``owners`` and ``streams`` may come packed too (bytes-like): unpacked
    when first read, which the main process does only for a client that watches some,
    or when its numbers do not hold (:class:`NumberMap`): thousands of names a batch.

    ``nums``, ``stream_nums``: the owners' numbers and those of their streams (-1:
    several) in the packer's :class:`LocalNumbers`, as int32 arrays; ``fresh``,
    ``fresh_streams``: the numbers it gave in this batch (``[number, name, ...]``): the
    main process takes them as its own without a dict pass over the batch's ids
    (:class:`NumberMap`); ``checks``: ``[owner, stream]`` at :func:`check_places`, which
    it checks them by. Empty when packed without.

    ``ref``: where the worker wrote the payloads itself (server/durability/witside.py's
    ``Ref``; None: they are in ``rest``); ``sids`` and ``rest`` are then empty (each
    witness's sid and stream are its owner's, which the witness log's record tells per
    subscription: witrecords.py's kind 4), and the payloads are read by ``reader``
    (``SideReader.payloads``) when asked.
    ``sizes``: with ``ref``, each payload's length (uint32, the machine's order; empty
    otherwise): where they are in the file, so that the main process reads only those of the
    few subscriptions a client watches (witnesses.py's ``read_parts``).
    ``befores``: each owner's last seq before this batch as the worker numbered them (its first
    is the next), int32 where all fit, else int64 (told apart by the length), the machine's
    order; empty where nothing numbered them (:attr:`LocalNumbers.last`)."""

    __slots__ = ("_owners", "_counts", "_streams", "sids", "rest", "nums", "stream_nums", "fresh", "fresh_streams",
                 "checks", "ref", "sizes", "befores", "reader", "_unpacked")

    def __init__(self, owners: list | bytes | memoryview, counts: list | bytes, streams: list | bytes | memoryview,
                 sids: bytes | memoryview, rest: bytes | memoryview, nums: bytes = b"", stream_nums: bytes = b"",
                 fresh: list | tuple = (), fresh_streams: list | tuple = (), checks: list | tuple = (),
                 ref: tuple | list | None = None, sizes: bytes = b"", befores: bytes = b"") -> None:
        self._owners, self._counts, self._streams, self.sids, self.rest = owners, counts, streams, sids, rest
        self.nums, self.stream_nums, self.fresh, self.fresh_streams = nums, stream_nums, fresh, fresh_streams
        self.checks, self.ref, self.sizes, self.befores = checks, ref, sizes, befores
        self.reader: Callable | None = None
        self._unpacked: tuple | None = None

    @property
    def owners(self) -> list[str]:
        got = self._owners
        if type(got) is not list:  # (packed)
            got = self._owners = _owners(got)
        return got

    @property
    def counts(self) -> list[int]:
        got = self._counts
        if type(got) is not list:  # (as a worker's result sends them: int32, the machine's order)
            a = array(COUNT_CODE)
            a.frombytes(got)
            got = self._counts = a.tolist()
        return got

    def counts_packed(self) -> bytes:
        """``counts`` as int32 (the machine's order): one C-level read of the main process's
        (``numpy.frombuffer``), not a list of thousands of ints decoded and converted."""
        got = self._counts
        return array(COUNT_CODE, got).tobytes() if type(got) is list else bytes(got)

    def owner_count(self) -> int:
        got = self._counts
        return len(got) if type(got) is list else len(got) // 4

    @property
    def streams(self) -> list:
        got = self._streams
        if type(got) is not list:  # (packed)
            got = self._streams = _kinds(got)
        return got

    def owners_packed(self) -> bytes | memoryview:
        """``owners`` as a MessagePack array (as a worker's result holds them: not unpacked)."""
        got = self._owners
        return _pack(got) if type(got) is list else got

    def streams_packed(self) -> bytes | memoryview:
        """``streams`` as a MessagePack array (as a worker's result holds them: not unpacked)."""
        got = self._streams
        return _pack(got) if type(got) is list else got

    def packed(self) -> tuple:
        """Its fields as a worker's result sends them: the lists packed, as bin (server/workers/codec.py)."""
        return (self.owners_packed(), self.counts_packed(), self.streams_packed(), self.sids, self.rest, self.nums,
                self.stream_nums, self.fresh, self.fresh_streams, self.checks, self.ref, self.sizes, self.befores)

    def _replace(self, **changes) -> "Columns":
        fields = {name.lstrip("_"): getattr(self, name) for name in self.__slots__[:-2]}
        fields.update(changes)
        return Columns(**fields)

    def count(self) -> int:
        return sum(self.counts)

    def parts_at(self, places: list[int]) -> list[tuple[list[str], list[bytes]]]:
        """Unpacked, the streams and payloads of the witnesses of the owners at ``places`` (in order)."""
        if not places:
            return []
        streams, payloads = self._streams_and_payloads()
        ends = list(accumulate(self.counts))
        return [(streams[e - n:e], payloads[e - n:e]) for n, e in ((self.counts[i], ends[i]) for i in places)]

    def groups(self) -> list[tuple[str, list[str], list[bytes]]]:
        """Unpacked, per subscription: ``(sid, streams, payloads)`` (for a client that watches some, a
        batch made again after a restart, a preview)."""
        if not self.owners:
            return []
        streams, payloads = self._streams_and_payloads()
        out, at = [], 0
        for sid, n in zip(self.owners, self.counts):
            out.append((sid, streams[at:at + n], payloads[at:at + n]))
            at += n
        return out

    def _streams_and_payloads(self) -> tuple[list[str], list[bytes]]:
        if self.ref is None:
            return _rest(self.rest)
        if self._unpacked is None:
            if self.reader is None:
                raise ValueError(f"the payloads are in an engine worker's file ({self.ref[0]}) and nothing reads it")
            # (witrecords.runs_columns expands a record's streams so too, by numpy, which a worker does not import)
            streams = list(chain.from_iterable(repeat(kind, n) if type(kind) is str else kind
                                               for kind, n in zip(self.streams, self.counts)))
            self._unpacked = (streams, self.reader(self.ref))
        return self._unpacked


#: How a historical witness ends (WitnessEncoder.replay).
_REPLAY = b',"replay":true}\n'
_rest = msgspec.msgpack.Decoder(tuple[list[str], list[bytes]]).decode
_owners = msgspec.msgpack.Decoder(list[str]).decode
_kinds = msgspec.msgpack.Decoder(list[Union[str, list[str]]]).decode


def pack_columns(groups: list, local: "LocalNumbers | None" = None) -> Columns:
    """Per subscription ``(sid, streams, payloads)`` as :class:`Columns` (numbered by ``local`` when given)."""
    owners, counts, kinds, payloads = [], [], [], []
    for sid, sts, pls in groups:
        n = len(pls)
        first = sts[0]
        owners.append(sid)
        counts.append(n)
        kinds.append(first if sts.count(first) == n else sts)
        payloads += pls
    cols = _each_packed(owners, counts, kinds, None, None, _pack(payloads))
    return cols if local is None else local.number(cols)


def pack_flat(flat: tuple, local: "LocalNumbers | None" = None, side: Callable | None = None) -> Columns:
    """:func:`pack_columns` of witnesses given as :attr:`EncodedBatch.flat`: ``(owners, counts,
    kinds, sids, streams, payloads)``, per subscription and per witness, in one order: packed
    as they are, no pass per subscription. ``sids`` and ``streams`` (each witness's) may be
    None: the encoder leaves them out, and they are made from the rest only where packed (a
    batch whose payloads went to a file beside the log needs neither). ``payloads``: a list,
    or already packed with their sizes (:class:`PackedLines`, what :meth:`WitnessEncoder.encode`
    gives). ``side``: what writes the packed payloads to a file of the worker's own and says
    where (server/durability/witside.py's ``SideWriter.write``), for a batch of several
    subscriptions (one's batches are few witnesses); where it raises OSError (a full disk)
    they go in ``rest`` as without it. A seventh item of ``flat``: the owners' numbers in ``local``
    and those given now (``(nums, fresh)``: :meth:`WitnessEncoder.encode` numbered them as it grouped
    the batch)."""
    owners, counts, kinds, sids, streams, payloads, *numbered = flat
    if not isinstance(payloads, PackedLines):
        payloads = PackedLines(_pack(payloads), array(SIZE_CODE, map(len, payloads)).tobytes())
    packed = payloads.packed
    if side is not None and len(owners) > 1:
        try:
            ref = side(packed)
        except OSError:
            cols = _each_packed(owners, counts, kinds, sids, streams, packed)
        else:  # (each witness's sid and stream are the owners', counts' and kinds': the main process writes those)
            cols = Columns(owners, counts, kinds, b"", b"", ref=tuple(ref), sizes=payloads.sizes)
    elif len(owners) == 1 and type(kinds[0]) is str:  # (one subscription on one stream: its name n times)
        n = counts[0]
        cols = Columns(owners, counts, kinds, pack_repeated(owners[0], n),
                       b"\x92" + pack_repeated(kinds[0], n) + packed)
    else:
        cols = _each_packed(owners, counts, kinds, sids, streams, packed)
    return cols if local is None else local.number(cols, *numbered)


def _each_packed(owners: list, counts: list, kinds: list, sids: list | None, streams: list | None,
                 packed: bytes) -> Columns:
    """The columns with each witness's sid and stream packed (made from the owners, counts and
    kinds where the encoder left them out: None), the pair [streams, payloads] as msgspec
    packs it (an array of two, then each)."""
    if sids is None:
        sids = list(chain.from_iterable(map(repeat, owners, counts)))
        streams = list(chain.from_iterable(repeat(k, n) if type(k) is str else k for k, n in zip(kinds, counts)))
    return Columns(owners, counts, kinds, _pack(sids), b"\x92" + _pack(streams) + packed)


def pack_repeated(item, n: int) -> bytes:
    """``_pack([item] * n)``, byte for byte, made as the array's header and ``item`` packed
    once and repeated (a batch of one subscription's witnesses on one stream: its sid and
    stream, a witness each; packing the list looked at every item)."""
    if n < 16:  # (an array: fixarray, array 16, array 32)
        header = bytes((0x90 | n,))
    elif n < 0x10000:
        header = b"\xdc" + n.to_bytes(2, "big")
    else:
        header = b"\xdd" + n.to_bytes(4, "big")
    return header + _pack(item) * n


class PackedLines(NamedTuple):
    """A batch's witness payloads packed as the MessagePack array of bin (``packed``) and each
    one's length (``sizes``: :data:`SIZE_CODE` items): air/engine/convert.py's ``pack_lines``
    of their JSON lines, made without a bytes object a witness."""
    packed: bytes
    sizes: bytes


class LocalNumbers:
    """A number for each subscription and stream an engine worker has sent
    results of, each told to the main process once, with the batch it first
    appears in (:attr:`Columns.fresh`). A restarted worker numbers afresh and
    tells every number again before it uses it.

    It numbers the witnesses too: :attr:`last` holds the last seq of each
    subscription placed whole on the worker (the main process tells it where each
    stands, :meth:`seed`, before the batches that follow; one it was never told of
    starts at 0, as a new subscription does), and each batch's columns carry where each
    owner stood before it (:attr:`Columns.befores`), which the main process checks
    against its own (witnesses.py's ``Witnesses.deliver_columns``): the step before a
    worker writes its own subscriptions' witness log (docs/design/worker-witlog.md).
    Each numbered subscription's last seq is kept by its number (a list), those told of
    before their first batch by name until they have one."""

    def __init__(self) -> None:
        self.subs: dict[str, int] = {}
        self.streams: dict[str, int] = {}
        self._lasts: list[int] = []  # by the subscription's number
        self._waiting: dict[str, int] = {}  # seeded, not numbered yet

    @property
    def last(self) -> dict[str, int]:
        """Each subscription's last seq, by name (numbered or only told of)."""
        return {**{sid: self._lasts[k] for sid, k in self.subs.items()}, **self._waiting}

    def seed(self, seqs: dict[str, int]) -> None:
        """Where the main process says these subscriptions' numbering stands (their last seq)."""
        subs, lasts = self.subs, self._lasts
        for sid, seq in seqs.items():
            k = subs.get(sid)
            if k is None:
                self._waiting[sid] = seq
            else:
                lasts[k] = seq

    def forget(self, sid: str) -> None:
        """A subscription removed from the worker: placed again, it is seeded again (0 unless told)."""
        k = self.subs.get(sid)
        if k is None:
            self._waiting.pop(sid, None)
        else:
            self._lasts[k] = 0

    def runs(self, ems: list) -> tuple:
        """A batch's output witnesses grouped by subscription as :meth:`WitnessEncoder.encode` groups
        them, with their runs, each subscription numbered here as it is grouped (air/engine/convert.py's
        ``numbered_runs``): ``(grouped, owners, counts, kinds, (nums, told), others)``, ``told`` the
        numbers given now (``number, name``: :meth:`number` takes the pair as ``given``), ``others`` the
        emissions not ``OUT`` (RESUB), in the engine's order."""
        told: list = []
        grouped, owners, counts, kinds, nums, others = numbered_runs(ems, self.subs, told)
        self._numbered(told)
        return grouped, owners, counts, kinds, (nums, told), others

    def _numbered(self, told: list) -> None:
        """Subscriptions numbered now (``number, name``, in order): each one's last seq goes at its number."""
        if told:
            self._lasts += map(self._waiting.pop, told[1::2], repeat(0))

    def number(self, cols: Columns, given: tuple | None = None) -> Columns:
        """``cols`` with its owners' and streams' numbers (and those given now, to tell) and where
        each owner's numbering stood before it (:attr:`Columns.befores`): air/engine/convert.py's
        ``number_names`` and ``count_on`` (compiled, one pass each; plain Python, C-level passes).
        ``given``: the owners' numbers and those given now, where :meth:`runs` numbered them."""
        owners, kinds = cols.owners, cols.streams
        fresh_streams: list = []
        if given is None:
            fresh: list = []
            nums = number_names(self.subs, owners, fresh)
            self._numbered(fresh)
        else:
            nums, fresh = given
        stream_nums = number_names(self.streams, kinds, fresh_streams)
        checks = [x for i in check_places(len(owners)) for x in (owners[i], kinds[i])]
        befores = count_on(self._lasts, nums, cols.counts)  # (an owner comes once a batch)
        try:  # (from a list, not an iterator: an array takes it in one C step)
            told = array(COUNT_CODE, befores)
        except OverflowError:
            told = array(SEQ_CODE, befores)
        return cols._replace(nums=array("i", nums).tobytes(), stream_nums=array("i", stream_nums).tobytes(),
                             fresh=fresh, fresh_streams=fresh_streams, checks=checks, befores=told.tobytes())


class WitnessEncoder:
    """Turns a batch's emissions into an :class:`EncodedBatch`: one call of the
    batch encoder ``cayuga run`` uses per batch. It needs only the
    streams' schemas, so it runs where the engine runs: on the engine thread,
    or in an engine worker process (server/workers/). ``watched(owner,
    stream)``: whether a client watches that internal stream."""

    def __init__(self, schema: Callable[[str], StreamSchema | None], watched: Callable[[str, str], bool]) -> None:
        self._schema = schema
        self.watched = watched
        #: A backfill's engine: output witnesses marked ``"replay": true`` (one C pass over the batch's JSON).
        self.replay = False
        #: Each stream's record type, kept from batch to batch (air/formats.py's ``encode_emissions``):
        #: a batch of thousands of subscriptions made one a stream every batch.
        self._makers: dict = {}

    def encode(self, ems: list, flat: bool = False, local: "LocalNumbers | None" = None) -> EncodedBatch:
        """Per subscription (in the order they first emitted), its emissions in the
        order the engine made them. One call of the batch encoder for the whole
        batch's output witnesses, grouped by subscription (air/engine/convert.py's
        ``grouped_by_owner``: the engine's order kept within each), then cut per
        subscription: a batch has thousands of subscriptions with a few witnesses
        each, and a call per subscription cost more than the encoding. A Python
        loop runs only over RESUB emissions, and only in a batch that has some. ``flat``: the output
        witnesses as :attr:`EncodedBatch.flat`, not cut per subscription (what an
        engine worker packs: :func:`pack_flat`); with ``local`` (its :class:`LocalNumbers`), the batch's
        output witnesses are grouped by the numbers the subscriptions keep there, and numbered so
        (:meth:`LocalNumbers.runs`: no dict made a batch, nor a pass to number them), and its RESUB
        emissions, where it has some, grouped apart (the watched ones' groups in the order of each
        subscription's first RESUB emission)."""
        if not ems:
            return EncodedBatch([], [])
        if flat and local is not None:
            outs, owners, counts, kinds, numbered, others = local.runs(ems)
            internal = self._internal(grouped_by_owner(others)[1]) if others else []
            if not outs:
                return EncodedBatch([], internal)
            payloads = PackedLines(*pack_lines(self._json(outs, False)))
            return EncodedBatch([], internal, (owners, counts, kinds, None, None, payloads, numbered))
        ordered, owners, resub = grouped_by_owner(ems)
        outs = [em for em in ordered if em[2] == "OUT"] if resub else ordered
        if flat:
            return EncodedBatch([], self._internal(owners) if resub else [], self._flat(outs))
        out = []
        if outs:
            payloads, streams = self._encode(outs, False)
            spans, at = {}, 0
            # each one's output witnesses: its group's length where all are (no pass to count them)
            counted = Counter(map(_OWNER, outs)).items() if resub else ((o, len(g)) for o, g in owners.items())
            for owner, n in counted:  # (in the grouped order: first seen first)
                spans[owner] = (at, at + n)
                at += n
            for owner in owners:
                span = spans.get(owner)
                if span is not None:
                    out.append((owner, streams[span[0]:span[1]], payloads[span[0]:span[1]]))
        return EncodedBatch(out, self._internal(owners) if resub else [])

    def _internal(self, owners: dict) -> list:
        """The RESUB emissions a client watches, per subscription (``owners``: each one's emissions,
        ``grouped_by_owner``'s)."""
        internal = []
        watched = self.watched
        for owner, ems in owners.items():
            mine = [em for em in ems if em[2] != "OUT" and watched(owner, em[0])]
            if mine:
                payloads, streams = self._encode(mine, True)
                internal.append((owner, streams, payloads))
        return internal

    def _flat(self, outs: list) -> tuple | None:
        """``outs`` (grouped by subscription, in the order they first emitted) as
        :attr:`EncodedBatch.flat`; None when there are none."""
        if not outs:
            return None
        payloads = PackedLines(*pack_lines(self._json(outs, False)))
        owners, counts, kinds = runs_of(outs)
        return owners, counts, kinds, None, None, payloads  # (each witness's sid and stream: only if packed)

    def _json(self, emissions: list, include_resub: bool) -> bytes:
        """The witnesses of ``emissions`` (kind OUT, or all) as JSON lines, a newline after
        each, by the batch encoder ``cayuga run`` uses (one call)."""
        data, _n = encode_emissions(emissions, self._schema, include_resub, self._makers)
        if self.replay and not include_resub:  # (one JSON object a line, no raw newline inside)
            data = data.replace(b"}\n", _REPLAY)
        return data

    def _encode(self, emissions: list, include_resub: bool) -> tuple[list[bytes], list[str]]:
        """The witnesses of ``emissions`` (kind OUT, or all) as one JSON line
        each, by the batch encoder ``cayuga run`` uses (one call), and their streams."""
        payloads = self._json(emissions, include_resub).split(b"\n")
        payloads.pop()  # after the last newline
        if include_resub or len(payloads) == len(emissions):
            streams = list(map(_STREAM, emissions))
        else:
            streams = [em[0] for em in emissions if em[2] == "OUT"]
        return payloads, streams
