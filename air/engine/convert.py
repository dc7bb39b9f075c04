"""Bulk conversions at the engine's edge, one loop each: decoded records into
events, and the engine's emissions into witness records. No I/O, no format:
:mod:`air.formats` hands in its record types and gets events and records back.

Plain Python, and compiled with the engine (``build.py``'s ``MODULES``; typed
by ``convert.pxd``). Compiled, a record's fields are read straight from its
slots (a msgspec struct keeps them where member descriptors say), an event is
made without calling ``Event.__init__`` and is taken out of the cyclic
collector at once (as :func:`air.engine.untrack_events` would: an event holds a
name, a tuple of atomic values and two times), and a witness record is made by
one vectorcall. An event's short strings are shared with the equal ones
decoded before it (:func:`shared_values`). Both builds give the same events
and records (``tests/server/test_formats.py``, ``tests/test_cli_run.py``).
"""

from __future__ import annotations

import re
import types
from array import array
from collections import Counter, deque
from itertools import chain, repeat
from operator import attrgetter, itemgetter, le
from typing import Callable

import msgspec

from air.engine.runtime import Event

try:
    import cython

    #: Whether this module runs compiled; Cython makes it a constant.
    COMPILED = cython.compiled
except ImportError:  # plain Python without Cython installed
    COMPILED = False


class Layout:
    """How to read one record type: the stream its records are events of, how
    many attributes they hold, and its fields (the attributes in schema order,
    then t0 and t1) as a getter, and compiled, as slot offsets (None where a
    field is not a plain slot: the getter reads those records then), and the
    table its events' strings are shared by (:func:`shared_values`)."""

    __slots__ = ("stream", "n", "getter", "offsets", "strings")

    def __init__(self, cls: type, stream: str, fields: tuple) -> None:
        self.stream = stream
        self.n = len(fields) - 2
        self.getter = attrgetter(*fields)  # two or more names: always a tuple
        self.offsets = None
        self.strings = STRINGS  # the table its events' short strings are shared by (:func:`shared_values`)
        if COMPILED:
            offsets = []
            for name in fields:
                descr = None
                for klass in cls.__mro__:
                    if name in klass.__dict__:
                        descr = klass.__dict__[name]
                        break
                if type(descr) is not types.MemberDescriptorType:
                    return
                offsets.append(_slot_offset(descr))  # noqa: F821 - C only (convert.pxd)
            self.offsets = tuple(offsets)


def records_to_events(records: list, layouts: dict, times: Callable) -> list:
    """One event per record, in order. ``layouts``: record type -> :class:`Layout`.
    Times that are not both integers in order (or t1 alone) go through
    ``times(t0, t1)``, which returns them converted or raises. Each event's short
    strings are the equal ones decoded before it (its layout's table, the process's
    :data:`STRINGS`: :func:`shared_values`)."""
    out = []
    last = None
    layout = None
    longest, most = SHARED_MAX_LENGTH, SHARED_MAX_STRINGS
    for r in records:
        cls = type(r)
        if cls is not last:
            layout = layouts[cls]
            last = cls
        n = layout.n
        if COMPILED and layout.offsets is not None:
            values = _slots(r, layout.offsets, n)  # noqa: F821 - C only (convert.pxd)
            _share_items(values, layout.strings, longest, most)  # noqa: F821 - (a tuple made here: shared in place)
            t0 = _slot(r, layout.offsets, n)  # noqa: F821
            t1 = _slot(r, layout.offsets, n + 1)  # noqa: F821
        else:
            v = layout.getter(r)
            values = shared_values(v[:n], layout.strings)
            t0 = v[n]
            t1 = v[n + 1]
        if type(t1) is not int or (t0 is not None and (type(t0) is not int or t0 > t1)):
            t0, t1 = times(t0, t1)
        elif t0 is None:
            t0 = t1
        out.append(_event(layout.stream, values, t0, t1))
    return out


#: A string value of more characters than this is not shared by :func:`shared_values`: text, not a name.
SHARED_MAX_LENGTH = 64
#: The strings a table of :func:`shared_values` holds at most: one that holds as many is emptied
#: before the next is added (a field of ids never seen twice costs a lookup a value, never memory past it).
SHARED_MAX_STRINGS = 1 << 16
#: The process's table: every :class:`Layout`'s (each decoder's, each stream's), and an engine worker's
#: (server/workers/worker.py), so that however many connections and streams a server has, the strings it
#: keeps for sharing are at most :data:`SHARED_MAX_STRINGS` (9.3 MB at most, each string of 64 ASCII characters).
#: Its lookups and additions run under the interpreter's lock (compiled, one C call a tuple; plain, a
#: race only loses a sharing, never a value).
STRINGS: dict = {}


def shared_values(values: tuple, strings: dict) -> tuple:
    """``values`` with each string of at most :data:`SHARED_MAX_LENGTH` characters (an exact str) replaced by
    the equal one ``strings`` holds, or added to it. An event's values are decoded afresh, each name a new
    object; shared, the events of one symbol, sensor or host hold one: the engine compares and hashes
    them by identity first, and the instances it keeps hold one string a name, not one an event
    (BENCHMARKS.md, "Engine workers, round 32"). A new tuple, of values equal to ``values``'. Compiled,
    :func:`records_to_events` and :func:`events_of` share the tuples only they hold in place instead."""
    out = []
    for v in values:
        if type(v) is str and len(v) <= SHARED_MAX_LENGTH:
            got = strings.get(v)
            if got is None:
                if len(strings) >= SHARED_MAX_STRINGS:
                    strings.clear()
                strings[v] = got = v
            v = got
        out.append(v)
    return tuple(out)


def events_of(streams, values: list, t0s, t1s: list, strings: dict) -> list:
    """The events of an engine worker's batch (server/workers/codec.py, :func:`event_columns`'
    columns decoded): ``streams`` one name or a list, ``t0s`` None for points (each t0 its t1),
    their values' short strings shared by ``strings`` (:func:`shared_values`). Compiled, each
    decoded tuple that only ``values`` holds is shared in place, and the events are made bare."""
    n = len(values)
    if not COMPILED:
        names = repeat(streams, n) if isinstance(streams, str) else streams
        return list(map(Event, names, [shared_values(v, strings) for v in values],
                        t1s if t0s is None else t0s, t1s))
    one = isinstance(streams, str)
    longest, most = SHARED_MAX_LENGTH, SHARED_MAX_STRINGS
    out = []
    for i in range(n):
        if _sole_tuple(values, i):  # noqa: F821 - C only (convert.pxd): a tuple only ``values`` holds
            v = values[i]
            _share_items(v, strings, longest, most)  # noqa: F821
        else:
            v = shared_values(values[i], strings)
        t1 = t1s[i]
        out.append(_event(streams if one else streams[i], v, t1 if t0s is None else t0s[i], t1))
    return out


def events_of_rows(rows: list, strings: dict | None = None) -> list:
    """The events of rows ``(stream, values, t0, t1)`` (a journal record's, server/durability/journal.py,
    decoded), their streams' names and their values' short strings shared by ``strings`` (the process's
    table by default: :func:`shared_values`), so that a recovery's replay or a backfill's history gives
    the engine what the live path gives it (BENCHMARKS.md, "Engine workers, round 33"). Compiled, a
    values tuple that only its row holds is shared in place, and the events are made bare."""
    if strings is None:
        strings = STRINGS
    if not COMPILED:
        return [Event(_shared_name(s, strings), shared_values(v, strings), t0, t1) for s, v, t0, t1 in rows]
    longest, most = SHARED_MAX_LENGTH, SHARED_MAX_STRINGS
    out = []
    for row in rows:
        stream = _shared_name(row[0], strings)  # (first, as the plain build does)
        if _sole_item(row, 1):  # noqa: F821 - C only (convert.pxd): a tuple only its row holds
            v = row[1]
            _share_items(v, strings, longest, most)  # noqa: F821
        else:
            v = shared_values(row[1], strings)
        out.append(_event(stream, v, row[2], row[3]))
    return out


def _shared_name(name, strings: dict):
    """``name`` as :func:`shared_values` shares a value (a stream's name: short)."""
    if type(name) is not str or len(name) > SHARED_MAX_LENGTH:
        return name
    got = strings.get(name)
    if got is None:
        if len(strings) >= SHARED_MAX_STRINGS:
            strings.clear()
        strings[name] = got = name
    return got


def _event(stream, values, t0, t1):
    """``Event(stream, values, t0, t1)``; compiled, a bare one, untracked."""
    if COMPILED:
        ev = Event.__new__(Event)
        ev.stream = stream
        ev.values = values
        ev.t0 = t0
        ev.t1 = t1
        _untrack(ev, values)  # noqa: F821 - C only (convert.pxd)
        return ev
    return Event(stream, values, t0, t1)


def times_given(records: list) -> int:
    """How many times (t0 and t1) ``records`` (air/formats.py's typed records) name, those
    that are not None: what a block's text names beside their attributes (air/jsontext.py's
    ``keys_as_decoded``). One loop, compiled a C loop."""
    count = 0
    for r in records:
        count += (r.ta is not None) + (r.tb is not None)
    return count


_STREAM_OF, _VALUES_OF, _T0_OF = attrgetter("stream"), attrgetter("values"), attrgetter("t0")


def t1_span(events: list) -> tuple:
    """The least and the greatest t1 of ``events`` (as ``min`` and ``max`` find them:
    the first of equals), or ``(None, None)`` for none."""
    if not events:
        return None, None
    if not COMPILED:
        ts = list(map(_t1, events))
        return min(ts), max(ts)
    lo = hi = None
    for ev in events:
        t1 = ev.t1
        if lo is None:
            lo = hi = t1
            continue
        if t1 < lo:
            lo = t1
        if t1 > hi:
            hi = t1
    return lo, hi


def t1_ordered(events: list) -> bool:
    """Whether ``events`` are in non-decreasing t1 order (each t1 ``<=`` the next)."""
    if not COMPILED:
        ts = list(map(_t1, events))
        return all(map(le, ts, ts[1:]))
    prev = None
    for ev in events:
        t1 = ev.t1
        if prev is not None and not prev <= t1:
            return False
        prev = t1
    return True


def stream_counts(events: list) -> dict:
    """How many of ``events`` each stream has, in the order each first came (what
    ``collections.Counter`` of their streams holds). Compiled, one pass that looks a
    stream up only where it differs from the one before (a batch's events come in
    runs of one stream's, or are all of one)."""
    if not COMPILED:
        return dict(Counter(map(_STREAM_OF, events)))
    counts = {}
    last = None
    run = 0
    for ev in events:
        stream = ev.stream
        if stream is not last:
            if run:
                counts[last] = counts.get(last, 0) + run
            last = stream
            run = 0
        run += 1
    if run:
        counts[last] = counts.get(last, 0) + run
    return counts


def _point(t0, t1) -> bool:
    """Whether an event of times ``t0``, ``t1`` is a point: the same object, or equal ints (a
    decoded line gives each its own; an int and an equal float are two types, kept apart)."""
    return t0 is t1 or (type(t0) is int and type(t1) is int and t0 == t1)


def event_columns(events: list) -> tuple:
    """``events`` as the columns of :class:`Event`'s arguments, an engine worker's batch
    (server/workers/codec.py): their streams (the one name, where every one's equals the
    first's; a list otherwise, and for none), their values, their t0 (None where each is
    a point's: its t1, the same object or an equal int, so that an int t0 beside an equal
    float t1 is kept) and their t1. Compiled, one pass reading each event's fields from its
    struct; plain Python, a C-level pass a column."""
    if not COMPILED:
        streams = list(map(_STREAM_OF, events))
        t0s, t1s = list(map(_T0_OF, events)), list(map(_t1, events))
        if all(map(_point, t0s, t1s)):
            t0s = None
        if streams and streams.count(streams[0]) == len(streams):
            streams = streams[0]
        return streams, list(map(_VALUES_OF, events)), t0s, t1s
    values = []
    t1s = []
    t0s = None
    first = streams = None
    same = True
    i = 0
    for ev in events:
        stream = ev.stream
        if i == 0:
            first = stream
        elif same and stream is not first and stream != first:
            same = False
            streams = [first] * i
        if not same:
            streams.append(stream)
        values.append(ev.values)
        t1 = ev.t1
        t1s.append(t1)
        t0 = ev.t0
        if t0s is None and t0 is not t1 and not (type(t0) is int and type(t1) is int and t0 == t1):
            t0s = t1s[:i]  # (each one before: its t0 was its t1, or equal to it)
        if t0s is not None:
            t0s.append(t0)
        i += 1
    if i == 0:
        return [], values, None, t1s
    return (first if same else streams), values, t0s, t1s


def emissions_to_records(emissions: list, makers: dict, maker: Callable, include_resub: bool,
                         schema_of: Callable | None = None) -> list:
    """The witness records of ``emissions`` (the engine's ``(stream, event,
    kind, owner)`` tuples) of kind ``OUT``, or all with ``include_resub``, in
    order. ``makers``: stream -> ``(cls, fallback, schema)``; a record is ``cls(stream,
    t0, t1, *values)``, or where ``cls`` is None, ``fallback(stream, event)``.
    A stream not in ``makers`` is added as ``maker(stream)`` gives it. With
    ``schema_of`` (the streams' schemas now), ``makers`` may be kept from call to call:
    one whose schema is no longer the stream's (``is``: one lookup where the stream
    differs from the emission's before) is made again."""
    out = []
    last = None
    cls = fallback = None
    for em in emissions:
        if COMPILED:  # (an emission is a named tuple: its items read straight, not by the generic protocol)
            stream = _item(em, 0)  # noqa: F821 - C only (convert.pxd)
            kind = _item(em, 2)  # noqa: F821
        else:
            stream = em[0]
            kind = em[2]
        if not include_resub and kind != "OUT":
            continue
        if stream is not last:
            got = makers.get(stream)
            if got is None or schema_of is not None and schema_of(stream) is not got[2]:
                got = makers[stream] = maker(stream)
            cls = got[0]
            fallback = got[1]
            last = stream
        ev = _item(em, 1) if COMPILED else em[1]  # noqa: F821 - C only (convert.pxd)
        if cls is None:
            out.append(fallback(stream, ev))
        elif COMPILED:
            out.append(_witness(cls, stream, ev))  # noqa: F821 - C only (convert.pxd)
        else:
            out.append(cls(stream, ev.t0, ev.t1, *ev.values))
    return out


_OWNER, _KIND, _STREAM = itemgetter(3), itemgetter(2), itemgetter(0)  # of an engine's emission
_OUT = "OUT"


def grouped_by_owner(emissions: list) -> tuple:
    """``(grouped, owners, other)``: ``emissions`` (the engine's ``(stream, event, kind, owner)``
    tuples) grouped by subscription, each one's in the engine's order; the subscriptions in the
    order they first emitted (a dict's keys, each one's emissions its value); and whether any
    emission is of a kind other than ``OUT``. Compiled, one pass that looks an owner up only
    where it differs from the one before and compares each kind with ``OUT`` by identity first
    (two passes, one finding the subscriptions and one grouping, took 60% longer for a batch of
    thousands of subscriptions: BENCHMARKS.md, round 34); plain Python, C-level passes (``map``
    of ``list.append``: a stable sort by each one's place cost a third more)."""
    if not COMPILED:
        groups = {owner: [] for owner in map(_OWNER, emissions)}
        deque(map(list.append, map(groups.__getitem__, map(_OWNER, emissions)), emissions), 0)
        return list(chain.from_iterable(groups.values())), groups, bool(set(map(_KIND, emissions)) - {_OUT})
    groups = {}
    last = None
    mine = None
    other = False
    out = _OUT  # (a local: compiled, no lookup an emission)
    for em in emissions:
        owner = _item(em, 3)  # noqa: F821 - C only (convert.pxd)
        if owner is not last:
            mine = groups.get(owner)
            if mine is None:
                mine = groups[owner] = []
            last = owner
        mine.append(em)
        if not other:
            kind = _item(em, 2)  # noqa: F821
            other = kind is not out and kind != out
    grouped = []
    for mine in groups.values():
        grouped += mine
    return grouped, groups, other


def runs_of(emissions: list) -> tuple:
    """Of ``emissions`` grouped by subscription (:func:`grouped_by_owner`): each subscription,
    its number of emissions and their stream (one name where all are on one, else the
    list of each one's), in order. Compiled, one pass comparing each owner and stream
    with the one before, by identity first; plain Python, C-level passes (two where all
    are of one subscription: a heavy query's batch)."""
    if not COMPILED:
        sids = list(map(_OWNER, emissions))
        streams = list(map(_STREAM, emissions))
        if sids and sids.count(sids[0]) == len(sids):
            first = streams[0]
            return [sids[0]], [len(sids)], [first if streams.count(first) == len(streams) else streams]
        counted = Counter(sids)  # (in the order first seen: the subscriptions' order)
        pairs = dict.fromkeys(zip(sids, streams))
        if len(pairs) == len(counted):  # each on one stream
            return list(counted), list(counted.values()), [stream for _sid, stream in pairs]
        kinds, at = [], 0
        for k in counted.values():
            sts = streams[at:at + k]
            kinds.append(sts[0] if sts.count(sts[0]) == k else sts)
            at += k
        return list(counted), list(counted.values()), kinds
    owners = []
    counts = []
    kinds = []
    n = len(emissions)
    start = 0
    while start < n:
        em = emissions[start]
        owner = _item(em, 3)  # noqa: F821 - C only (convert.pxd)
        stream = _item(em, 0)  # noqa: F821
        one = True
        end = start + 1
        while end < n:
            em = emissions[end]
            other = _item(em, 3)  # noqa: F821
            if other is not owner and other != owner:
                break
            if one:
                other = _item(em, 0)  # noqa: F821
                one = other is stream or other == stream
            end += 1
        owners.append(owner)
        counts.append(end - start)
        kinds.append(stream if one else [_item(emissions[i], 0) for i in range(start, end)])  # noqa: F821
        start = end
    return owners, counts, kinds


def numbered_runs(emissions: list, numbers: dict, told: list) -> tuple:
    """What :func:`grouped_by_owner`, :func:`runs_of` and :func:`number_names` of the owners make
    of a batch's ``OUT`` emissions (an engine worker's, server/delivery/encoding.py):
    ``(grouped, owners, counts, kinds, nums, others)``, each subscription with output witnesses (in
    the order they first emitted, of any kind) numbered in ``numbers`` (a new one given the next number, and
    told: ``number, name`` appended to ``told``); ``others`` the emissions of other kinds (RESUB), in
    the engine's order (the caller groups them: few batches have any). Compiled, a counting sort by
    the subscriptions' kept numbers (convert.pxd's ``_runs_by_numbers``: two passes over C arrays, no
    list made a subscription, of the thousands a batch: BENCHMARKS.md round 37);
    plain Python, the three functions."""
    if COMPILED:
        got = _runs_by_numbers(emissions, numbers, told, _OUT)  # noqa: F821 - C only (convert.pxd)
        if got is not None:
            return got
    grouped, _groups, other = grouped_by_owner(emissions)
    others = [em for em in emissions if em[2] != _OUT] if other else []
    if other:
        grouped = [em for em in grouped if em[2] == _OUT]
    owners, counts, kinds = runs_of(grouped)
    return grouped, owners, counts, kinds, number_names(numbers, owners, told), others


def number_names(numbers: dict, names: list, told: list) -> list:
    """The number of each of ``names`` in ``numbers`` (-1 for one that is not a name: a
    list of streams), the next (``len(numbers)``) given now to one that has none and told
    (``number, name`` appended to ``told``; a name twice in ``names`` is given one). Compiled,
    one pass, looking a name up only where it is not the one before; plain Python, a C-level
    pass of lookups, and a Python one only where one has no number or is not a name."""
    if not COMPILED:
        try:
            nums = list(map(numbers.get, names))  # (a list among them, a subscription on several streams, raises)
        except TypeError:
            nums = [numbers.get(name, None) if type(name) is str else -1 for name in names]
        if None in nums:
            nums = [_new(numbers, name, told) if k is None else k for name, k in zip(names, nums)]
        return nums
    out = []
    last = None
    k = -1
    for name in names:
        if name is last:  # (a stream that several subscriptions in a row publish: no lookup)
            out.append(k)
            continue
        if type(name) is not str:
            out.append(-1)
            continue
        k = numbers.get(name)
        if k is None:
            k = len(numbers)
            numbers[name] = k
            told.append(k)
            told.append(name)
        out.append(k)
        last = name
    return out


def _new(numbers: dict, name: str, told: list) -> int:
    """``name``'s number, given now if it has none (a name may come twice)."""
    k = numbers.get(name)
    if k is None:
        k = numbers[name] = len(numbers)
        told += (k, name)
    return k


def count_on(lasts: list, nums: list, counts: list) -> list:
    """Where each of the subscriptions numbered ``nums`` stood in ``lasts`` (by number), each
    moved on by its count. Compiled, one pass of list reads and writes (no lookup by name: a
    dict's get and set were a third of a worker's numbering of a batch); plain Python, a
    C-level pass and a loop. (A number comes once.)"""
    if not COMPILED:
        befores = list(map(lasts.__getitem__, nums))
        for k, before, n in zip(nums, befores, counts):
            lasts[k] = before + n
        return befores
    out = []
    for i in range(len(nums)):
        k = nums[i]
        before = lasts[k]
        lasts[k] = before + counts[i]
        out.append(before)
    return out


def pack_lines(data: bytes) -> tuple:
    """The lines of ``data`` (each ended by a newline, which is not part of it) as the
    MessagePack array of bin that ``msgspec.msgpack.encode`` makes of the list of them,
    byte for byte, and their lengths (4 bytes each, unsigned, the machine's order: an
    ``array`` of them as bytes). A batch's witnesses as JSON lines, packed for the main
    process and the witness log without a bytes object a line. Compiled, one pass that
    measures and one that copies; plain Python, ``split`` and msgspec."""
    if COMPILED:
        return _pack_lines(data)  # noqa: F821 - C only (convert.pxd)
    lines = data.split(b"\n")
    lines.pop()  # (after the last newline)
    return _msgpack(lines), array(SIZE_CODE, map(len, lines)).tobytes()


_msgpack = msgspec.msgpack.Encoder().encode
#: an ``array`` type code of a 4-byte unsigned int (the lengths :func:`pack_lines` gives)
SIZE_CODE = next(code for code in "IL" if array(code).itemsize == 4)


def numbered_lines(prefix: bytes, seqs, payloads: list) -> list:
    """Each of ``payloads`` after ``prefix``, its seq (``seqs``: a range or a list of ints,
    in step with them) and a space: the witnesses as a WebSocket client that asked for
    their seqs sees them (server/delivery/hub.py's ``Chunk.lines``). Compiled, each line
    made at its length and copied into; plain Python, ``%``-formatting."""
    if not COMPILED:
        return list(map((prefix.replace(b"%", b"%%") + b"%d %s").__mod__, zip(seqs, payloads)))
    out = []
    for seq, payload in zip(seqs, payloads):
        if type(payload) is bytes and type(seq) is int:
            out.append(_numbered(prefix, seq, payload))  # noqa: F821 - C only (convert.pxd)
        else:
            out.append(prefix + b"%d %s" % (seq, payload))
    return out


_NONBLANK = re.compile(rb"^[ \t\r]*[^ \t\r\n]", re.M)
_BLANK_INSIDE = re.compile(rb"\n[ \t\r]*\n")
_BLANK_FIRST = re.compile(rb"[ \t\r]*(\n|$)")


def nonblank_lines(data: bytes) -> int:
    """How many lines of ``data`` (ended by newlines; the last one may not be)
    hold more than blanks (spaces, tabs, carriage returns). Compiled, one pass
    from newline to newline; plain Python counts newlines, unless a blank line
    is somewhere (rare: then a regular expression counts)."""
    if COMPILED:
        return _count_nonblank(data)  # noqa: F821 - C only (convert.pxd)
    tail = data.rfind(b"\n") + 1
    if (_BLANK_INSIDE.search(data) or _BLANK_FIRST.match(data)
            or (tail < len(data) and not data[tail:].strip(b" \t\r"))):
        return len(_NONBLANK.findall(data))
    return data.count(b"\n") + (tail < len(data))


_t1 = attrgetter("t1")


def sort_by_t1(events: list) -> None:
    """Sort ``events`` by detection time, stably (simultaneous events keep
    their order). Compiled, one pass first finds most files already in order
    and leaves them be."""
    if COMPILED:
        prev = None
        for ev in events:
            t1 = _t1_of(ev)  # noqa: F821 - C only (convert.pxd)
            if prev is not None and prev > t1:
                break
            prev = t1
        else:
            return
    events.sort(key=_t1)
