"""Functions that run inside Spark executors.

Everything shipped to executors lives here, at module level, so Python workers
import it from the installed ``cayuga`` package instead of unpickling driver
closures. The objects are small, picklable callables holding plain data
(stream schemas, automata: frozen dataclasses).

Event records between stages are plain tuples ``(stream, values, t0, t1, seq)``:
``seq`` is the record's position in the input (a global line number for text
inputs, ``partition << 40 | row`` for DataFrame inputs) and breaks ties between
simultaneous events stably, as ``cayuga run``'s stable sort does.
"""

from __future__ import annotations

import itertools

import math
import time
import zlib
from datetime import date, datetime, timezone
from typing import Iterable, Iterator, Mapping, Sequence

from pyspark.accumulators import AccumulatorParam

from air.engine import Engine, Event
from air.formats import LineError, convert_value, make_decoder, parse_time, witness_bytes, witness_dict
from air.model import Automaton, StreamSchema

#: Rejected input records kept for the report (the count is exact, the list is not).
MAX_REJECTS_KEPT = 50
#: A DataFrame partition's row number lives in the low bits of ``seq``.
ROW_BITS = 40


class RejectsParam(AccumulatorParam):
    """Accumulates ``(count, [(where, text, reason), ...])`` with a capped list."""

    def zero(self, value):
        return (0, [])

    def addInPlace(self, a, b):
        return (a[0] + b[0], (a[1] + b[1])[:MAX_REJECTS_KEPT])


# --------------------------------------------------------------------------- decoding


#: Lines decoded as one block by :class:`DecodeLines`.
BLOCK_LINES = 4096


class DecodeLines:
    """``(line, index)`` pairs (from ``zipWithIndex``) -> event records, with the
    same decoders as ``cayuga run`` (formats ``jsonl`` and ``cayuga``)."""

    def __init__(self, fmt: str, schemas: Sequence[StreamSchema], rejects, counter,
                 default_stream: str | None = None, time_unit_ms: float = 1.0) -> None:
        self.fmt = fmt
        self.schemas = {s.name: s for s in schemas}
        self.rejects = rejects
        self.counter = counter
        self.default_stream = default_stream
        self.time_unit_ms = time_unit_ms

    def __call__(self, pairs: Iterable[tuple[str, int]]) -> Iterator[tuple]:
        dec = make_decoder(self.fmt, self.schemas, default_stream=self.default_stream,
                           time_unit_ms=self.time_unit_ms, streams=list(self.schemas))
        bad: list = []
        n_bad = n = 0
        it = iter(pairs)
        while chunk := list(itertools.islice(it, BLOCK_LINES)):  # decoded a block at a time
            lines = [line.rstrip("\r\n") for line, _idx in chunk]
            batch = dec.decode_batch("\n".join(lines) + "\n", 0)
            for pos, reason in batch.errors:
                n_bad += 1
                if len(bad) < MAX_REJECTS_KEPT:
                    bad.append((f"line {chunk[pos][1] + 1}", lines[pos], reason))
            for i, ev in enumerate(batch.events):
                n += 1
                yield (ev.stream, ev.values, ev.t0, ev.t1, chunk[batch.line_of(i)][1])
        self.counter.add(n)
        if n_bad:
            self.rejects.add((n_bad, bad))


def to_time(value, unit_ms: float = 1.0):
    """A timestamp from a DataFrame cell: number, ISO string, or Spark date/timestamp."""
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        ms = dt.timestamp() * 1000.0 / unit_ms
        return int(ms) if float(ms).is_integer() else ms
    if isinstance(value, date):
        return to_time(datetime(value.year, value.month, value.day, tzinfo=timezone.utc), unit_ms)
    return parse_time(value, unit_ms)


class DecodeRows:
    """Rows of a selected DataFrame -> event records.

    The DataFrame's columns are, in order: the stream column (when
    ``stream_col``), t0 (when ``has_t0``), t1, then for each stream in
    ``schemas`` the columns of its attributes as listed in ``columns[stream]``
    (column positions; -1 when the DataFrame lacks one)."""

    def __init__(self, schemas: Sequence[StreamSchema], positions: Mapping[str, Sequence[int]],
                 stream_col: bool, has_t0: bool, default_stream: str | None, rejects, counter,
                 time_unit_ms: float = 1.0, seq_last: bool = False) -> None:
        self.seq_last = seq_last
        self.schemas = {s.name: s for s in schemas}
        self.positions = dict(positions)
        self.stream_col = stream_col
        self.has_t0 = has_t0
        self.default_stream = default_stream
        self.rejects = rejects
        self.counter = counter
        self.time_unit_ms = time_unit_ms

    def __call__(self, pidx: int, rows: Iterable) -> Iterator[tuple]:
        base = pidx << ROW_BITS
        bad: list = []
        n_bad = n = 0
        i_t1 = int(self.stream_col) + int(self.has_t0)
        for i, row in enumerate(rows):
            try:
                name = row[0] if self.stream_col and row[0] is not None else self.default_stream
                schema = self.schemas.get(name) if name else None
                if schema is None:
                    raise LineError(f"unknown stream {name!r}; declare it first" if name else "missing stream name")
                pos = self.positions[schema.name]
                values = []
                for a, p in zip(schema.attributes, pos):
                    raw = row[p] if p >= 0 else None
                    if raw is None:
                        raise LineError(f"stream {schema.name}: missing attribute {a.name!r}")
                    values.append(convert_value(raw, a.type, a.name))
                t1_raw = row[i_t1]
                t0_raw = row[i_t1 - 1] if self.has_t0 else None
                if t1_raw is None and t0_raw is None:
                    raise LineError("missing timestamps t0/t1")
                t1 = to_time(t1_raw if t1_raw is not None else t0_raw, self.time_unit_ms)
                t0 = to_time(t0_raw, self.time_unit_ms) if t0_raw is not None else t1
                if isinstance(t1, float) and not math.isfinite(t1):
                    raise LineError(f"timestamp {t1!r} is not finite")
                if t0 > t1:
                    raise LineError(f"t0 ({t0}) is after t1 ({t1}); an event needs t0 <= t1")
            except LineError as exc:
                n_bad += 1
                if len(bad) < MAX_REJECTS_KEPT:
                    bad.append((f"input partition {pidx}, row {i + 1}", repr(tuple(row)), str(exc)))
                continue
            n += 1
            yield (schema.name, tuple(values), t0, t1, row[-1] if self.seq_last else base | i)
        self.counter.add(n)
        if n_bad:
            self.rejects.add((n_bad, bad))


# --------------------------------------------------------------------------- partitioning


def normalize_key(value):
    """Values equal under the engine's ``=`` map to one hashable form (1 == 1.0 == True)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def stable_hash(value) -> int:
    """A hash that is the same in every process (unlike ``hash`` of a str)."""
    v = normalize_key(value)
    if isinstance(v, str):
        data = b"s" + v.encode("utf-8", "surrogatepass")
    elif isinstance(v, int):
        data = b"i" + str(v).encode()
    else:
        data = b"r" + repr(v).encode()
    return zlib.crc32(data)


class InStreams:
    """Keeps event records of the given streams."""

    def __init__(self, streams: Iterable[str]) -> None:
        self.streams = frozenset(streams)

    def __call__(self, rec: tuple) -> bool:
        return rec[0] in self.streams


class ToKeyed:
    """Event record -> ``((partition, t1, seq), (stream, values, t0))``."""

    def __init__(self, key_index: Mapping[str, int] | None, partitions: int) -> None:
        self.key_index = dict(key_index) if key_index else None
        self.partitions = partitions

    def __call__(self, rec: tuple) -> tuple:
        stream, values, t0, t1, seq = rec
        if self.key_index is None:
            pid = 0
        else:
            pid = stable_hash(values[self.key_index[stream]]) % self.partitions
        return (pid, t1, seq), (stream, values, t0)


def partition_of(key: tuple) -> int:
    return key[0]


def event_order(rec: tuple) -> tuple:
    return (rec[3], rec[4])


# --------------------------------------------------------------------------- the engine


class RunEngine:
    """One engine over one sorted partition of ``((pid, t1, seq), (stream, values, t0))``.

    Yields ``("W", stream, kind, values, t0, t1)`` for every witness and, last,
    ``("S", stage, partition, events, witnesses, seconds, float_time_streams)``."""

    def __init__(self, stage: int, schemas: Sequence[StreamSchema],
                 queries: Sequence[tuple[str, Sequence[Automaton]]],
                 functions: dict[str, tuple[str, str]] | None = None) -> None:
        self.stage = stage
        self.schemas = list(schemas)
        self.queries = [(o, list(a)) for o, a in queries]
        self.functions = dict(functions or {})

    def __call__(self, pidx: int, records: Iterable[tuple]) -> Iterator[tuple]:
        from air.engine.functions import import_functions

        started = time.perf_counter()
        engine = Engine(functions=import_functions(self.functions))
        for s in self.schemas:
            engine.declare(s)
        for owner, autos in self.queries:
            engine.add(autos, owner=owner)
        out: list[tuple] = []
        float_times: set[str] = set()

        def emit(em) -> None:
            ev = em.event
            if not (type(ev.t0) is int and type(ev.t1) is int):
                float_times.add(em.stream)
            out.append(("W", em.stream, em.kind, ev.values, ev.t0, ev.t1))

        engine.on_emit = emit
        n = w = 0
        for stream, values, t0, t1 in self.events(records):
            engine.feed(Event(stream, values, t0, t1))
            n += 1
            if out:
                w += len(out)
                yield from out
                out.clear()
        engine.flush()
        w += len(out)
        yield from out
        yield ("S", self.stage, pidx, n, w, time.perf_counter() - started, tuple(sorted(float_times)))

    def events(self, records):
        for (_, t1, _), (stream, values, t0) in records:
            yield stream, values, t0, t1


class RunEngineArrow:
    """The fast path for DataFrame input: Spark hash-partitioned the rows by the
    key and sorted them by ``(t1, seq)`` in the JVM; Arrow batches come here
    (``mapInArrow``), are decoded as :class:`DecodeRows` does and run through
    one engine. Output: one binary column ``rec`` of pickled records, the same
    records :class:`RunEngine` yields. ``python_sort``: the time column was not
    numeric in the JVM (e.g. CSV strings), so the partition is sorted here."""

    def __init__(self, engine: RunEngine, decoder: DecodeRows, python_sort: bool) -> None:
        self.engine = engine
        self.decoder = decoder
        self.python_sort = python_sort

    def __call__(self, batches):
        import pickle

        import pyarrow as pa
        from pyspark import TaskContext

        pidx = TaskContext.get().partitionId()

        def rows():
            for b in batches:
                yield from zip(*[c.to_pylist() for c in b.columns])

        events = self.decoder(pidx, rows())
        if self.python_sort:
            events = sorted(events, key=event_order)
        keyed = (((0, t1, seq), (stream, values, t0)) for stream, values, t0, t1, seq in events)
        buf: list[bytes] = []
        for rec in self.engine(pidx, keyed):
            buf.append(pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL))
            if len(buf) >= 4096:
                yield pa.RecordBatch.from_pydict({"rec": buf}, schema=pa.schema([("rec", pa.binary())]))
                buf = []
        if buf:
            yield pa.RecordBatch.from_pydict({"rec": buf}, schema=pa.schema([("rec", pa.binary())]))


def unpickle_rec(row) -> tuple:
    import pickle

    return pickle.loads(row[0])


def is_witness(rec: tuple) -> bool:
    return rec[0] == "W"


def is_stats(rec: tuple) -> bool:
    return rec[0] == "S"


class SelectWitnesses:
    """Witness records of ``streams`` (all when None) whose kind is in ``kinds``."""

    def __init__(self, streams: Iterable[str] | None, kinds: Iterable[str] = ("OUT", "RESUB")) -> None:
        self.streams = frozenset(streams) if streams is not None else None
        self.kinds = frozenset(kinds)

    def __call__(self, rec: tuple) -> bool:
        return rec[0] == "W" and rec[2] in self.kinds and (self.streams is None or rec[1] in self.streams)


def witness_to_event(rec: tuple) -> tuple:
    """A witness record as an event record for a later stage (seq 0: simultaneous
    events may come in any order, the result does not depend on it)."""
    _, stream, _, values, t0, t1 = rec
    return (stream, values, t0, t1, 0)


class WitnessJson:
    """Witness record -> the JSON line ``cayuga run`` writes."""

    def __init__(self, schemas: Sequence[StreamSchema]) -> None:
        self.schemas = {s.name: s for s in schemas}

    def __call__(self, rec: tuple) -> str:
        _, stream, _, values, t0, t1 = rec
        return witness_bytes(stream, Event(stream, values, t0, t1), self.schemas[stream]).decode()


class WitnessDict(WitnessJson):
    def __call__(self, rec: tuple) -> dict:
        _, stream, _, values, t0, t1 = rec
        return witness_dict(stream, Event(stream, values, t0, t1), self.schemas[stream])


class WitnessRow:
    """Witness record -> a row tuple ``(stream, t0, t1, *values)`` for a Parquet
    writer; times become floats when the stream's column type is double."""

    def __init__(self, float_times: bool) -> None:
        self.float_times = float_times

    def __call__(self, rec: tuple) -> tuple:
        _, stream, _, values, t0, t1 = rec
        if self.float_times:
            t0, t1 = float(t0), float(t1)
        return (stream, t0, t1, *values)


class EventJson:
    """Event record -> a JSON line for the server's TCP port."""

    def __init__(self, schemas: Sequence[StreamSchema]) -> None:
        self.schemas = {s.name: s for s in schemas}

    def __call__(self, rec: tuple) -> str:
        stream, values, t0, t1, _ = rec
        return witness_bytes(stream, Event(stream, values, t0, t1), self.schemas[stream]).decode()
