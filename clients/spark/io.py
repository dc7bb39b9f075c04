"""Reading events into Spark: JSON lines, the Cayuga line format, CSV and Parquet.

The result is an RDD of event records ``(stream, values, t0, t1, seq)`` (see
:mod:`clients.spark.executors`), checked against the declared stream schemas;
bad records are counted and reported, never fatal.

Two paths:

- **text lines** (``jsonl`` without a column mapping, ``cayuga``): decoded by the
  very decoders ``cayuga run`` uses, so the events and the line numbers in
  error reports are the same;
- **DataFrame** (``parquet``, ``csv``, ``json`` with a mapping): Spark reads the
  columns; a :class:`ColumnMapping` says which column holds the stream name,
  t0, t1 and each attribute (by default the column of the same name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from air.model import StreamSchema
from clients.spark.executors import DecodeLines, DecodeRows, RejectsParam

INPUT_FORMATS = ("jsonl", "cayuga", "csv", "parquet", "json")


class InputError(ValueError):
    """The input cannot be read as asked (format, path, columns)."""


@dataclass(frozen=True)
class ColumnMapping:
    """Where a DataFrame keeps the parts of an event.

    ``stream_column``: the column naming each row's stream (absent columns are
    fine when there is a default stream); ``t0``/``t1``: time columns (numbers,
    ISO-8601 strings or Spark timestamps; t0 defaults to t1); ``attributes``:
    attribute -> column (unlisted attributes use the column of the same name)."""

    stream_column: str = "stream"
    t0: str = "t0"
    t1: str = "t1"
    attributes: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        return self == ColumnMapping()

    @classmethod
    def parse(cls, items: Sequence[str]) -> "ColumnMapping":
        """From ``["t1=ts", "Price=px", "stream=kind"]`` (CLI ``--column``)."""
        attrs: dict[str, str] = {}
        special: dict[str, str] = {}
        for it in items:
            name, sep, col = it.partition("=")
            name, col = name.strip(), col.strip()
            if not sep or not name or not col:
                raise InputError(f"bad column mapping {it!r}; expected ATTRIBUTE=COLUMN, e.g. t1=timestamp")
            if name in ("stream", "t0", "t1"):
                special[name] = col
            else:
                attrs[name] = col
        return cls(stream_column=special.get("stream", "stream"), t0=special.get("t0", "t0"),
                   t1=special.get("t1", "t1"), attributes=attrs)


def guess_format(path: str) -> str:
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".parquet" or (p.is_dir() and any(p.glob("*.parquet"))):
        return "parquet"
    if suffix == ".csv":
        return "csv"
    if suffix in (".txt", ".cayuga"):
        return "cayuga"
    return "jsonl"


@dataclass
class EventInput:
    """An RDD of event records plus the accumulators that count them."""

    rdd: object
    counter: object
    rejects: object
    prepared: "PreparedFrame | None" = None

    @property
    def events(self) -> int:
        return self.counter.value

    @property
    def rejected(self) -> tuple[int, list[tuple[str, str, str]]]:
        return self.rejects.value


def read_events(spark, path: str, schemas: Sequence[StreamSchema], fmt: str | None = None, *,
                mapping: ColumnMapping | None = None, default_stream: str | None = None,
                time_unit_ms: float = 1.0, min_partitions: int | None = None) -> EventInput:
    """Events of ``path`` as an RDD of records, decoded in the executors."""
    fmt = (fmt or guess_format(path)).lower()
    if fmt not in INPUT_FORMATS:
        raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(INPUT_FORMATS)}")
    mapping = mapping or ColumnMapping()
    if default_stream is None and len(schemas) == 1:
        default_stream = schemas[0].name
    sc = spark.sparkContext
    counter = sc.accumulator(0)
    rejects = sc.accumulator((0, []), RejectsParam())
    if not Path(path).exists() and "://" not in path:
        raise InputError(f"input {path} does not exist")
    if fmt == "cayuga" or (fmt == "jsonl" and mapping.is_default):
        lines = sc.textFile(path, minPartitions=min_partitions or sc.defaultParallelism)
        rdd = lines.zipWithIndex().mapPartitions(
            DecodeLines(fmt, schemas, rejects, counter, default_stream, time_unit_ms))
        return EventInput(rdd, counter, rejects)
    reader = spark.read
    if fmt == "parquet":
        df = reader.parquet(path)
    elif fmt == "csv":
        df = (reader.option("header", True).option("inferSchema", False)
              .option("ignoreLeadingWhiteSpace", True).option("ignoreTrailingWhiteSpace", True).csv(path))
    else:
        df = reader.json(path)
    return events_from_dataframe(df, schemas, mapping=mapping, default_stream=default_stream,
                                 time_unit_ms=time_unit_ms, counter=counter, rejects=rejects)


@dataclass
class PreparedFrame:
    """A DataFrame reduced to the event columns, renamed ``c0..cN`` in the order
    :class:`~clients.spark.executors.DecodeRows` expects, and how to decode it."""

    df: object
    positions: dict[str, list[int]]
    stream_col: bool
    has_t0: bool
    default_stream: str | None
    columns: list[str]  # original column of each c<i>

    @property
    def t1_index(self) -> int:
        return int(self.stream_col) + int(self.has_t0)

    def decoder(self, schemas, rejects, counter, time_unit_ms: float = 1.0, seq_last: bool = False):
        return DecodeRows(schemas, self.positions, self.stream_col, self.has_t0, self.default_stream,
                          rejects, counter, time_unit_ms, seq_last=seq_last)


def prepare_dataframe(df, schemas: Sequence[StreamSchema], mapping: ColumnMapping | None = None,
                      default_stream: str | None = None) -> PreparedFrame:
    """Select and order the columns that make events (raises InputError when some are missing)."""
    from pyspark.sql import functions as F

    mapping = mapping or ColumnMapping()
    if default_stream is None and len(schemas) == 1:
        default_stream = schemas[0].name
    cols = list(df.columns)
    selected: list[str] = []
    stream_col = mapping.stream_column in cols
    if stream_col:
        selected.append(mapping.stream_column)
    elif default_stream is None:
        raise InputError(f"the input has no column {mapping.stream_column!r} naming each event's stream; "
                         "map one with stream=COLUMN or give a default stream")
    has_t0 = mapping.t0 in cols
    has_t1 = mapping.t1 in cols
    if not has_t0 and not has_t1:
        raise InputError(f"the input has no time column ({mapping.t0!r} or {mapping.t1!r}); its columns are "
                         f"{', '.join(cols)}; map one with t1=COLUMN")
    if has_t0:
        selected.append(mapping.t0)
        selected.append(mapping.t1 if has_t1 else mapping.t0)
    else:
        selected.append(mapping.t1)
    prefix = len(selected)
    attr_cols: list[str] = []
    attr_pos: dict[str, list[int]] = {}
    for s in schemas:
        pos = []
        for a in s.attributes:
            col = mapping.attributes.get(a.name, a.name)
            if col not in cols:
                pos.append(-1)
                continue
            if col not in attr_cols:
                attr_cols.append(col)
            pos.append(prefix + attr_cols.index(col))
        attr_pos[s.name] = pos
    selected.extend(attr_cols)
    if default_stream is not None and not stream_col:
        missing = [a.name for a, p in zip(_schema(schemas, default_stream).attributes, attr_pos[default_stream])
                   if p < 0]
        if missing:
            raise InputError(f"the input has no column for attribute(s) {', '.join(missing)} of stream "
                             f"{default_stream}; its columns are {', '.join(cols)}; map them with ATTR=COLUMN")
    sel = df.select(*[F.col(f"`{c}`").alias(f"c{i}") for i, c in enumerate(selected)])
    return PreparedFrame(sel, attr_pos, stream_col, has_t0, default_stream, selected)


def events_from_dataframe(df, schemas: Sequence[StreamSchema], *, mapping: ColumnMapping | None = None,
                          default_stream: str | None = None, time_unit_ms: float = 1.0,
                          counter=None, rejects=None) -> EventInput:
    """Event records from any DataFrame, through a column mapping."""
    sc = df.sparkSession.sparkContext
    counter = counter or sc.accumulator(0)
    rejects = rejects or sc.accumulator((0, []), RejectsParam())
    prep = prepare_dataframe(df, schemas, mapping, default_stream)
    rdd = prep.df.rdd.mapPartitionsWithIndex(prep.decoder(schemas, rejects, counter, time_unit_ms))
    return EventInput(rdd, counter, rejects, prep)


def _schema(schemas: Sequence[StreamSchema], name: str) -> StreamSchema:
    for s in schemas:
        if s.name == name:
            return s
    raise InputError(f"unknown stream {name!r}; declare it with --stream")
