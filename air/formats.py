"""Event line formats: JSON lines, the original Cayuga line format, CSV with a header.

Decoders turn text lines into :class:`~air.engine.Event` objects checked
against the declared stream schemas, one line (:meth:`Decoder.decode`) or a
block of lines at a time (:meth:`Decoder.decode_batch`); a line that cannot be
an event raises (or is reported as) a :class:`LineError` saying what is wrong
with it. They do no I/O: the TCP receivers, ``POST /events``, the offline
runner and the Spark executors feed them and decide what to do with errors.

- ``jsonl``: ``{"stream": "Stock", "t0": 0, "t1": 0, "Name": "IBM", ...}``
- ``cayuga``: ``IBM, 74.75, 100, Stock, 0, 0`` (values in schema order, then
  stream name, t0, t1; the timestamps may be omitted together)
- ``csv``: a header line naming ``stream`` (optional when a default stream is
  given), optional ``t0``/``t1`` and the attributes; then one event per line.

JSON is decoded by msgspec. Well-typed lines (the usual case) are decoded and
type-checked straight into one typed record per declared stream, a block at a
time, and the records into events in one loop (:mod:`air.engine.convert`,
compiled with the engine); a block with any other line is decoded line by line, where the few
conversions JSON does not make (a number in a string, ``"true"`` for a bool)
are applied and every error gets its own precise message. Both paths accept
and refuse exactly the same lines (``tests/server/test_formats.py``).

Values follow docs/design/semantics.md#data-model: ``int`` is 64-bit, ``float`` is finite (``NaN`` and
``Infinity`` are not JSON and are refused, as are numbers out of range),
strings are valid UTF-8, and timestamps are numbers or ISO-8601 times. A JSON
event names each key once: a line with a duplicate key (``"Price": 1, "Price": 2``)
is refused, not read as its last value (msgspec and the standard library both
keep the last one silently). The typed path checks this cheaply: a block with
no more colons (or key ends) than its records hold keys has no duplicate
(``keys_as_decoded``); any other block takes the precise path, which finds
the duplicates (``first_duplicate``). Both, and the splitting of a list into
items, are air/jsontext.py's: JSON text read without decoding it.
"""

from __future__ import annotations

import csv
import io
import math
import re
from datetime import datetime, timezone
from functools import lru_cache
from typing import Annotated, Callable, Iterable, Mapping, Union

import msgspec

from air.engine import Event
from air.engine.convert import Layout, emissions_to_records, nonblank_lines, records_to_events
from air.jsontext import (
    at_most_keys, duplicate_reason, duplicates_per_item, first_duplicate, item_spans, json_reason, keys_as_decoded,
)
from air.model import StreamSchema

FORMATS = ("jsonl", "cayuga", "csv")

Catalog = Callable[[str], "StreamSchema | None"]

INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
_FLOAT_MAX = 1.7976931348623157e308


class LineError(ValueError):
    """One input line that cannot become an event; the message says why."""


def _lookup(catalog: Catalog | Mapping[str, StreamSchema]) -> Catalog:
    return catalog.get if isinstance(catalog, Mapping) else catalog


def parse_time(value, unit_ms: float = 1.0):
    """A timestamp: a number (already in the stream time unit) or an ISO-8601
    string (converted to ``unit_ms``-millisecond units since the Unix epoch)."""
    if isinstance(value, bool):
        raise LineError(f"timestamp {value!r} is not a number or ISO-8601 time")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise LineError(f"timestamp {value!r} is not finite")
        if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            raise LineError(f"timestamp {value} does not fit in a 64-bit integer")
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return parse_time(int(text), unit_ms)
        except ValueError:
            pass
        try:
            return float(text) if math.isfinite(float(text)) else _bad_time(value)
        except ValueError:
            pass
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            _bad_time(value)
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        ms = dt.timestamp() * 1000.0 / unit_ms
        return int(ms) if float(ms).is_integer() else ms
    _bad_time(value)


def _bad_time(value):
    raise LineError(f"timestamp {value!r} is not a number or an ISO-8601 time")


def convert_value(raw, type_: str, attr: str):
    """Check/convert one attribute value (from JSON or text) to the schema type."""
    try:
        if type_ == "string":
            if isinstance(raw, str):
                return raw
            if isinstance(raw, (int, float)) and not isinstance(raw, bool):
                return str(raw)
        elif type_ == "int":
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, float) and raw.is_integer():
                raw = int(raw)
            elif isinstance(raw, str):
                raw = int(raw.strip())
            if isinstance(raw, int):
                if not INT_MIN <= raw <= INT_MAX:
                    raise LineError(f"attribute {attr!r} must be int (64-bit), got {raw} which does not fit")
                return raw
        elif type_ == "float":
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, (int, float)):
                value = float(raw)
            elif isinstance(raw, str):
                value = float(raw.strip())
            else:
                raise ValueError
            if not math.isfinite(value):
                raise LineError(f"attribute {attr!r} must be a finite float, got {raw!r}")
            return value
        elif type_ == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, (int, str)):
                low = str(raw).strip().lower()
                if low in ("1", "true", "t", "yes"):
                    return True
                if low in ("0", "false", "f", "no"):
                    return False
    except (ValueError, OverflowError) as exc:
        if isinstance(exc, LineError):
            raise
    raise LineError(f"attribute {attr!r} must be {type_}, got {raw!r}")


def _text(line: str | bytes) -> str:
    if isinstance(line, str):
        return line
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        raise LineError(_utf8_error(line, "line") or "not valid UTF-8") from None


def _utf8_error(data: bytes, what: str) -> str | None:
    """Where ``data`` stops being UTF-8 (msgspec's error counts within a string value, or, from
    0.23 on, says only that it is not); None when it is UTF-8."""
    try:
        bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8: byte {exc.start + 1} of the {what}"
    return None


def _split(data: bytes | str) -> list:
    """The lines of a block (a trailing newline ends the last line, it does not start another)."""
    lines = data.split(b"\n" if isinstance(data, bytes) else "\n")
    if lines and not lines[-1]:
        lines.pop()
    return lines


class Batch:
    """What a block of lines decoded to: the events in line order, and
    ``(line_number, reason)`` for each line that could not be one.
    :meth:`line_of` gives the line number of an event (to report it later,
    e.g. as late)."""

    __slots__ = ("events", "errors", "_numbers", "_data", "_first")

    def __init__(self, events: list[Event], errors: list[tuple[int, str]], numbers: list[int] | None = None,
                 data: bytes | None = None, first: int = 1) -> None:
        self.events = events
        self.errors = errors
        self._numbers = numbers
        self._data = data  # the typed path's block: its line numbers are found only when asked for
        self._first = first

    @property
    def typed(self) -> bool:
        """Whether the block took the typed path: every non-blank line became an
        event, in order, and no line was decoded on its own."""
        return self._data is not None

    def line_of(self, i: int) -> int:
        if self._numbers is None:  # fast path: every non-blank line became an event, in order
            self._numbers = [self._first + n for n, line in enumerate(_split(self._data or b""))
                             if _NONBLANK.match(line)]
        return self._numbers[i]


class Decoder:
    """Base decoder. ``clock`` supplies point timestamps for events without any."""

    format = ""

    def __init__(self, catalog, *, clock: Callable[[], float] | None = None,
                 default_stream: str | None = None, time_unit_ms: float = 1.0) -> None:
        self.catalog = _lookup(catalog)
        self.clock = clock
        self.default_stream = default_stream
        self.time_unit_ms = time_unit_ms

    def decode(self, line: str | bytes) -> Event | None:
        """The event on ``line``, or None for a blank (or header) line. Raises LineError."""
        raise NotImplementedError

    def decode_batch(self, data: bytes | str, first_line: int = 1) -> Batch:
        """Every line of ``data`` (lines ending in newlines; the last newline
        may be missing); line numbers in errors count from ``first_line``."""
        events, errors, numbers = [], [], []
        for n, line in enumerate(_split(data), first_line):
            try:
                ev = self.decode(line.rstrip(b"\r" if isinstance(line, bytes) else "\r"))
            except LineError as exc:
                errors.append((n, str(exc)))
                continue
            if ev is not None:
                events.append(ev)
                numbers.append(n)
        return Batch(events, errors, numbers)

    def _schema(self, name) -> StreamSchema:
        if not isinstance(name, str) or not name:
            raise LineError("missing stream name")
        schema = self.catalog(name)
        if schema is None:
            raise LineError(f"unknown stream {name!r}; declare it first")
        return schema

    def _times(self, t0, t1) -> tuple:
        if t0 is None and t1 is None:
            if self.clock is None:
                raise LineError("missing timestamps t0/t1 (required here: no clock stamps events in offline runs "
                                "or with the server's time: event setting)")
            now = self.clock()
            return now, now
        t0 = parse_time(t0, self.time_unit_ms) if t0 is not None else None
        t1 = parse_time(t1, self.time_unit_ms) if t1 is not None else None
        if t0 is None:
            t0 = t1
        if t1 is None:
            t1 = t0
        if t0 > t1:
            raise LineError(f"t0 ({t0}) is after t1 ({t1}); an event needs t0 <= t1")
        return t0, t1


# --------------------------------------------------------------------------- JSON lines

_Int = Annotated[int, msgspec.Meta(ge=INT_MIN, le=INT_MAX)]
_Float = Annotated[float, msgspec.Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]
_Time = Union[_Int, _Float, str, None]
_TYPED = {"string": str, "int": _Int, "float": _Float, "bool": bool}


@lru_cache(maxsize=4096)
def _record_type(schema: StreamSchema) -> type | None:
    """The typed record of one stream: its attributes in schema order, then t0
    and t1, tagged by ``"stream"``; None if the schema cannot be one (an
    attribute named like a timestamp), and such lines take the line-by-line path."""
    fields = [(f"f{i}", _TYPED[a.type]) for i, a in enumerate(schema.attributes)]
    rename = {f"f{i}": a.name for i, a in enumerate(schema.attributes)}
    rename.update(ta="t0", tb="t1")
    try:
        cls = msgspec.defstruct(f"Event_{schema.name}", fields + [("ta", _Time, None), ("tb", _Time, None)],
                                rename=rename, tag_field="stream", tag=schema.name, forbid_unknown_fields=True,
                                gc=False)
        msgspec.json.Decoder(cls)  # a clash of names shows here
    except (ValueError, TypeError):
        return None
    return cls


@lru_cache(maxsize=1024)
def _block_decoder(types: tuple) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(Union[types])  # type: ignore[valid-type]


@lru_cache(maxsize=1024)
def _document_decoder(types: tuple) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(list[Union[types]])  # type: ignore[valid-type]


_UNKNOWN_TAG = re.compile(r"^Invalid value '(.+)' - at `\$\[\d+\]\.stream`$")


class JsonDecoder(Decoder):
    format = "jsonl"

    def __init__(self, *args, streams: Iterable[str] = (), **kwargs) -> None:
        """``streams``: names to prepare typed records for at once; others are
        added when first seen."""
        super().__init__(*args, **kwargs)
        self._known: dict[str, StreamSchema] = {}  # streams with a typed record
        self._by_type: dict[type, Layout] = {}  # record type -> how to read its records
        self._block: msgspec.json.Decoder | None = None
        for name in streams:
            self._learn(name)

    @property
    def typed_streams(self) -> frozenset[str]:
        """The streams this decoder has a typed record for (those given as
        ``streams``, and those met since, while declared as they were)."""
        return frozenset(self._known)

    # -- one line: the precise path
    def decode(self, line: str | bytes) -> Event | None:
        if not line.strip():
            return None
        obj = _loads(line, "line")
        if isinstance(obj, dict) and not at_most_keys(line, len(obj)):  # a duplicate key, or nested objects' keys
            dup = first_duplicate(line)
            if dup is not None:
                raise LineError(duplicate_reason(dup))
        return self.from_mapping(obj)

    def from_mapping(self, obj) -> Event:
        if not isinstance(obj, dict):
            raise LineError("a JSON event must be an object like {\"stream\": ..., \"t1\": ..., attributes}")
        name = obj.get("stream", self.default_stream)
        schema = self._schema(name)
        values = []
        for a in schema.attributes:
            if a.name not in obj:
                raise LineError(f"stream {schema.name}: missing attribute {a.name!r}")
            values.append(convert_value(obj[a.name], a.type, a.name))
        extra = [k for k in obj if k not in ("stream", "t0", "t1") and not schema.has(k)]
        if extra:
            raise LineError(f"stream {schema.name} has no attribute {', '.join(map(repr, extra))} "
                            f"(its schema: {schema})")
        t0, t1 = self._times(obj.get("t0"), obj.get("t1"))
        return Event(schema.name, tuple(values), t0, t1)

    # -- a block of lines: the typed path
    def decode_batch(self, data: bytes | str, first_line: int = 1) -> Batch:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        for _ in range(8):  # at most a few new streams per block
            self._revalidate()
            if self._block is None:
                break
            try:
                records = self._block.decode_lines(data)
            except msgspec.ValidationError as exc:
                m = _UNKNOWN_TAG.match(str(exc))
                if m and m.group(1) not in self._known and self._learn(m.group(1)):
                    continue  # a stream this decoder had not seen yet: retry with it
                break
            except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
                break
            if len(records) != nonblank_lines(data):
                break  # a line held more than one object: the precise path refuses it
            if not keys_as_decoded(data, records, self._by_type):
                break  # maybe a duplicate key (msgspec keeps the last): the precise path finds it
            try:
                return Batch(self._events(records), [], None, data, first_line)
            except LineError:
                break  # a bad timestamp: the precise path reports it
        batch = super().decode_batch(data, first_line)
        self._learn_from(batch.events)
        return batch

    def decode_document(self, body: bytes) -> tuple[list[Event], list[tuple[int, str]]]:
        """A JSON document holding one event object, a list of them, or
        ``{"events": [...]}``: the events, and ``(index, reason)`` for each
        item that is not one. Raises LineError when ``body`` is not JSON."""
        self._revalidate()
        if self._block is not None:
            try:
                records = _document_decoder(tuple(self._by_type)).decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
                pass
            else:
                if keys_as_decoded(body, records, self._by_type):  # else maybe a duplicate key: item by item
                    try:
                        return self._events(records), []
                    except LineError:
                        pass  # a bad timestamp: the item-by-item path says which
        doc = _loads(body, "body")
        wrapped = isinstance(doc, dict) and "events" in doc and "stream" not in doc
        items = doc["events"] if wrapped else doc
        items = items if isinstance(items, list) else [items]
        dups: list[str | None] = [None] * len(items)
        if not at_most_keys(body, sum(len(o) for o in items if isinstance(o, dict)) + (1 if wrapped else 0)):
            dups = duplicates_per_item(body, wrapped, len(items))  # a duplicate key, or nested objects' keys
        events, errors = [], []
        for i, obj in enumerate(items):
            try:
                if dups[i] is not None:
                    raise LineError(duplicate_reason(dups[i]))
                events.append(self.from_mapping(obj))
            except LineError as exc:
                errors.append((i, str(exc)))
        self._learn_from(events)
        return events, errors

    def decode_items(self, body: bytes) -> tuple[list[Event], list[tuple[int, str]]]:
        """A list of events (``[...]`` or ``{"events": [...]}``) that is not JSON
        as a whole: each item decoded on its own, as TCP decodes each line, so
        an item that is not JSON (``NaN``, ``Infinity``, a number out of range)
        is reported with its index and reason and the others are taken.
        Raises LineError when the body is not such a list whose items can be
        told apart (an unbalanced bracket, a string never closed, an empty
        item): the caller reports the whole body's error then."""
        spans = item_spans(body)
        if spans is None:
            raise LineError("not a list of items")
        events, errors = [], []
        for i, (start, end) in enumerate(spans):
            item = body[start:end].strip()  # columns in errors count from the item's first character
            try:
                obj = _loads(item, "item")
                if isinstance(obj, dict) and not at_most_keys(item, len(obj)):
                    dup = first_duplicate(item)
                    if dup is not None:
                        raise LineError(duplicate_reason(dup))
                events.append(self.from_mapping(obj))
            except LineError as exc:
                errors.append((i, str(exc)))
        self._learn_from(events)
        return events, errors

    def _events(self, records: list) -> list[Event]:
        return records_to_events(records, self._by_type, self._times)

    def _learn(self, name: str) -> bool:
        schema = self.catalog(name) if isinstance(name, str) else None
        if schema is None or _record_type(schema) is None:
            return False
        self._known[name] = schema
        self._rebuild()
        return True

    def _learn_from(self, events: list[Event]) -> None:
        """Streams met on the precise path get a typed record for the next block."""
        for name in {ev.stream for ev in events} - self._known.keys():
            self._learn(name)

    def _revalidate(self) -> None:
        """Forget streams whose declaration changed or went away (a published
        stream of a removed subscription); checked once per block."""
        stale = [n for n, s in self._known.items() if self.catalog(n) is not s]
        for n in stale:
            del self._known[n]
            self._learn(n)
        if stale:
            self._rebuild()

    def _rebuild(self) -> None:
        types = tuple(_record_type(s) for s in self._known.values())
        self._by_type = {t: Layout(t, s.name, t.__struct_fields__) for t, s in zip(types, self._known.values())}
        self._block = _block_decoder(types) if types else None


def _loads(data: str | bytes, what: str):
    """Untyped JSON, every failure as a LineError saying what and where."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        bad = None if isinstance(data, str) else _utf8_error(data, what)
        raise LineError(bad or f"invalid JSON: {json_reason(exc, data)}") from None
    except msgspec.ValidationError:  # without a type, only "Number out of range"
        raise LineError("invalid JSON: a number is out of range (beyond a 64-bit float)") from None
    except UnicodeDecodeError:
        raise LineError(_utf8_error(data, what) or "not valid UTF-8") from None
    except RecursionError:
        raise LineError("invalid JSON: nested too deeply") from None


_NONBLANK = re.compile(rb"^[ \t\r]*[^ \t\r\n]", re.M)


# --------------------------------------------------------------------------- text formats


class CayugaDecoder(Decoder):
    """``v1,...,vn,StreamName,t0,t1`` (or ``v1,...,vn,StreamName`` with clock time)."""

    format = "cayuga"

    def decode(self, line: str | bytes) -> Event | None:
        line = _text(line)
        if not line.strip() or line.lstrip().startswith("#"):
            return None
        try:
            fields = [f.strip() for f in next(csv.reader([line], skipinitialspace=True))]
        except csv.Error as exc:
            raise LineError(f"cannot split the line into fields: {exc}") from None
        while fields and fields[-1] == "":
            fields.pop()  # the original wrote a trailing comma
        for n_time in (2, 0):
            if len(fields) > n_time:
                name = fields[-1 - n_time]
                schema = self.catalog(name)
                if schema is not None and len(fields) == len(schema.attributes) + 1 + n_time:
                    vals = fields[: len(schema.attributes)]
                    values = tuple(convert_value(v, a.type, a.name) for v, a in zip(vals, schema.attributes))
                    t0, t1 = self._times(*(fields[-2:] if n_time else (None, None)))
                    return Event(schema.name, values, t0, t1)
        if len(fields) >= 3 and self.catalog(fields[-3]) is not None:
            schema = self.catalog(fields[-3])
            raise LineError(f"stream {schema.name} has {len(schema.attributes)} attributes "
                            f"({', '.join(schema.names)}) but the line has {len(fields) - 3} values")
        raise LineError("expected 'v1,...,vn,StreamName,t0,t1' with a declared stream name "
                        f"third from the end; got {len(fields)} fields")


class CsvDecoder(Decoder):
    """CSV whose first line is a header; later lines are events."""

    format = "csv"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header: list[str] | None = None

    def decode(self, line: str | bytes) -> Event | None:
        line = _text(line)
        if not line.strip():
            return None
        try:
            row = next(csv.reader(io.StringIO(line)))
        except (csv.Error, StopIteration) as exc:
            raise LineError(f"cannot parse CSV: {exc}") from None
        row = [c.strip() for c in row]
        if self.header is None:
            if len(set(row)) != len(row):
                raise LineError("the CSV header names a column twice")
            if "stream" not in row and self.default_stream is None:
                raise LineError("the CSV header needs a 'stream' column (or give a default stream)")
            self.header = row
            return None
        if len(row) != len(self.header):
            raise LineError(f"expected {len(self.header)} fields as in the header, got {len(row)}")
        obj = dict(zip(self.header, row))
        name = obj.pop("stream", None) or self.default_stream
        schema = self._schema(name)
        values = []
        for a in schema.attributes:
            if a.name not in obj:
                raise LineError(f"stream {schema.name}: the header has no column {a.name!r}")
            values.append(convert_value(obj[a.name], a.type, a.name))
        t0, t1 = self._times(obj.get("t0") or None, obj.get("t1") or None)
        return Event(schema.name, tuple(values), t0, t1)


_DECODERS = {"jsonl": JsonDecoder, "json": JsonDecoder, "cayuga": CayugaDecoder, "csv": CsvDecoder}


def make_decoder(fmt: str, catalog, **kwargs) -> Decoder:
    try:
        cls = _DECODERS[fmt.lower()]
    except KeyError:
        raise ValueError(f"unknown event format {fmt!r}; use one of {', '.join(FORMATS)}") from None
    if cls is not JsonDecoder:
        kwargs.pop("streams", None)
    return cls(catalog, **kwargs)


# --------------------------------------------------------------------------- witnesses


def witness_dict(stream: str, event: Event, schema: StreamSchema) -> dict:
    """A witness as the JSON object clients receive: stream, t0, t1, attributes."""
    out = {"stream": stream, "t0": event.t0, "t1": event.t1}
    for a, v in zip(schema.attributes, event.values):
        out[a.name] = v
    return out


_encode = msgspec.json.Encoder().encode


def encode_json(obj: dict) -> str:
    """One JSON object as compact text (non-finite floats become null)."""
    return _encode(obj).decode()


_WITNESS_TYPES: dict[int, tuple[StreamSchema, type | None]] = {}


def _witness_type(schema: StreamSchema) -> type | None:
    """The record type that encodes witnesses of ``schema``, cached by the
    schema's identity (hashing a schema costs more than encoding a witness)."""
    hit = _WITNESS_TYPES.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    names = ("stream", "t0", "t1") + schema.names
    if len(set(names)) != len(names):
        cls = None  # an attribute named stream, t0 or t1: witness_dict's order of precedence applies
    else:
        fields = [("s", str), ("ta", object), ("tb", object)] + [(f"f{i}", object) for i in range(len(schema.names))]
        # (not tracked by the collector, as the decoders' records: made and dropped within one encoding, holding
        # only the event's scalar values, a record is in no cycle; made and freed 7-15% faster: BENCHMARKS.md, round 35)
        cls = msgspec.defstruct(f"Witness_{schema.name}", fields, rename=dict(zip((f for f, _ in fields), names)),
                                gc=False)
    if len(_WITNESS_TYPES) > 100_000:
        _WITNESS_TYPES.clear()
    _WITNESS_TYPES[id(schema)] = (schema, cls)
    return cls


def witness_record(stream: str, event: Event, schema: StreamSchema):
    """A witness ready for :func:`encode_witnesses` (the object of
    :func:`witness_dict`, without building a dict)."""
    cls = _witness_type(schema)
    if cls is None:
        return witness_dict(stream, event, schema)
    return cls(stream, event.t0, event.t1, *event.values)


def witness_bytes(stream: str, event: Event, schema: StreamSchema) -> bytes:
    """The JSON of :func:`witness_dict` (compact, UTF-8)."""
    return _encode(witness_record(stream, event, schema))


#: Witness records as JSON lines, newline after each.
encode_witnesses = msgspec.json.Encoder().encode_lines


def encode_emissions(emissions: list, schema_of: Callable[[str], StreamSchema],
                     include_resub: bool = False, makers: dict | None = None) -> tuple[bytes, int]:
    """The witnesses among ``emissions`` (the engine's ``(stream, event, kind,
    owner)`` tuples) as :func:`encode_witnesses` writes them, and how many:
    those of kind ``OUT``, or all with ``include_resub``. One loop, in order
    (compiled with the engine: :mod:`air.engine.convert`), the record type
    looked up once per stream. ``makers``: a dict the caller keeps from call to
    call (for one ``schema_of``): each stream's record type is made once, not once
    a call, and made again when the stream's schema changes. Without, once a call."""

    def maker(stream: str) -> tuple:
        schema = schema_of(stream)
        return _witness_type(schema), lambda s, ev: witness_dict(s, ev, schema), schema

    if makers is None:
        records = emissions_to_records(emissions, {}, maker, include_resub)
    else:
        if len(makers) > MAX_KEPT_MAKERS:  # (the streams of subscriptions long gone)
            makers.clear()
        records = emissions_to_records(emissions, makers, maker, include_resub, schema_of)
    return encode_witnesses(records), len(records)


#: The streams a kept ``makers`` of :func:`encode_emissions` holds at most before it is emptied:
#: those of subscriptions long removed go then (each stream's is a few hundred bytes).
MAX_KEPT_MAKERS = 100_000
