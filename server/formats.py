"""Event line formats: JSON lines, the original Cayuga line format, CSV with a header.

Decoders turn one text line into an :class:`~server.engine.Event` checked
against the declared stream schemas, or raise :class:`LineError` saying what is
wrong with that line. They do no I/O: the TCP receivers and the offline runner
feed them lines and decide what to do with errors.

- ``jsonl``: ``{"stream": "Stock", "t0": 0, "t1": 0, "Name": "IBM", ...}``
- ``cayuga``: ``IBM, 74.75, 100, Stock, 0, 0`` (values in schema order, then
  stream name, t0, t1; the timestamps may be omitted together)
- ``csv``: a header line naming ``stream`` (optional when a default stream is
  given), optional ``t0``/``t1`` and the attributes; then one event per line.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import datetime, timezone
from typing import Callable, Mapping

from air.model import StreamSchema
from server.engine import Event

FORMATS = ("jsonl", "cayuga", "csv")

Catalog = Callable[[str], "StreamSchema | None"]


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
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
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
            if isinstance(raw, int):
                return raw
            if isinstance(raw, float) and raw.is_integer():
                return int(raw)
            if isinstance(raw, str):
                return int(raw.strip())
        elif type_ == "float":
            if isinstance(raw, bool):
                raise ValueError
            if isinstance(raw, (int, float)):
                return float(raw)
            if isinstance(raw, str):
                return float(raw.strip())
        elif type_ == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, (int, str)):
                low = str(raw).strip().lower()
                if low in ("1", "true", "t", "yes"):
                    return True
                if low in ("0", "false", "f", "no"):
                    return False
    except ValueError:
        pass
    raise LineError(f"attribute {attr!r} must be {type_}, got {raw!r}")


class Decoder:
    """Base decoder. ``clock`` supplies point timestamps for events without any."""

    format = ""

    def __init__(self, catalog, *, clock: Callable[[], float] | None = None,
                 default_stream: str | None = None, time_unit_ms: float = 1.0) -> None:
        self.catalog = _lookup(catalog)
        self.clock = clock
        self.default_stream = default_stream
        self.time_unit_ms = time_unit_ms

    def decode(self, line: str) -> Event | None:
        """The event on ``line``, or None for a blank line. Raises LineError."""
        raise NotImplementedError

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
                raise LineError("missing timestamps t0/t1 (required here: there is no server clock)")
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


class JsonDecoder(Decoder):
    format = "jsonl"

    def decode(self, line: str) -> Event | None:
        if not line.strip():
            return None
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LineError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
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


class CayugaDecoder(Decoder):
    """``v1,...,vn,StreamName,t0,t1`` (or ``v1,...,vn,StreamName`` with clock time)."""

    format = "cayuga"

    def decode(self, line: str) -> Event | None:
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

    def decode(self, line: str) -> Event | None:
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
    return cls(catalog, **kwargs)


def witness_dict(stream: str, event: Event, schema: StreamSchema) -> dict:
    """A witness as the JSON object clients receive: stream, t0, t1, attributes."""
    out = {"stream": stream, "t0": event.t0, "t1": event.t1}
    for a, v in zip(schema.attributes, event.values):
        out[a.name] = v
    return out


def encode_json(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))
