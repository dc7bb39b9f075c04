"""Continuous CEP on Spark Structured Streaming (``cayuga spark stream``, issue 20).

The plan (driver, :func:`~clients.spark.streamplan.plan_stream`) cuts the query
set into *units*, reusing the planner of ``spark run``
(:mod:`air.partitioning`):

- queries are first split into components that resubscription ties together
  (a query reading what another publishes runs in the same engine);
- a component with a key (:func:`~air.partitioning.plan_stages` finds
  one stage with a key) is **row-scaled**: its events are hash-partitioned by
  the key into ``key_groups`` groups; components with the same key share them;
- a component whose every state asks for one constant (``Name = 'IBM'``,
  :func:`~air.partitioning.constant_route`) is **routed by the
  constant**: it lives in the key group of its constant, and an event goes
  only to the key group of its own value;
- every other component is **column-scaled**: the components are dealt into
  ``column_groups`` groups, and every event of a stream a group reads goes to it.

Every unit's group is one grouping key of a ``transformWithStateInPandas``
operator (:class:`CepProcessor`), whose state (in Spark's state store, RocksDB
provider) is the group's engine state (:func:`air.engine.state.export_state`),
its frontier and the events held back until the watermark passes them. Each
Python worker keeps one engine per engine specification and reuses it for every
group and micro-batch: :func:`air.engine.state.clear_state`, then
``import_state``, feed, ``export_state``.

Event order within a group is ``(t1, input position)`` as in ``cayuga run``;
the input position of a file source is ``(file path, block, line)``, so the
files of a directory read in name order are one input. An event whose ``t1`` is
below the group's frontier (the watermark at which the group last released
events) cannot be placed in that order any more: it is written to the late
output with the reason, never dropped.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from air.engine import Engine, Event
from air.formats import make_decoder, witness_bytes
from air.model import StreamSchema
from clients.spark import executors as X
from clients.spark.io import ColumnMapping, InputError, prepare_dataframe
from clients.spark.streamplan import EngineSpec, StreamPlan, Unit, plan_stream  # noqa: F401 - also exported here

log = logging.getLogger("cayuga.spark")

#: The state store every ``spark stream`` job uses.
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: What the job keeps in its checkpoint directory beside Spark's own files.
PLAN_FILE = "cayuga-stream.json"
CONTROL_DIR = "_control"
#: Key groups when none are given at the first start (as Flink's default maximum parallelism: small).
DEFAULT_KEY_GROUPS = 32
#: The time of a flush marker: later than any event (year 9999, in ms).
END_OF_TIME = 253402214400000.0
#: Row kinds between the router and the stateful operator.
EVENT, FLUSH, REJECT = 0, 1, 2
ROUTED_SCHEMA = "g int, m int, t1 double, ord string, rec binary"
OUTPUT_SCHEMA = "kind string, stream string, line string, rec binary"
OUTPUT_KINDS = ("witness", "late", "rejected")


class StreamError(ValueError):
    """The job cannot start as asked (checkpoint, options)."""


# --------------------------------------------------------------------------- executors: routing


class _Collect:
    """Stands in for an accumulator: rejected records are rows of the output here."""

    def __init__(self) -> None:
        self.items: list = []

    def add(self, value) -> None:
        self.items.append(value)


def _routes(units: Sequence[Unit], key_groups: int):
    by_stream: dict[str, list] = {}
    for u in units:
        ki = dict(u.key_index)
        for s in u.inputs:
            by_stream.setdefault(s, []).append((u.kind, u.base, u.size, ki.get(s, -1), u.constants))
    return by_stream


def route(by_stream, stream: str, values: tuple) -> list[int]:
    """The groups an event of ``stream`` goes to."""
    out = []
    for kind, base, size, ki, consts in by_stream.get(stream, ()):
        if kind == "column":
            out.append(base)
        else:
            v = values[ki]
            if kind == "constant" and X.normalize_key(v) not in consts:
                continue
            out.append(base + X.stable_hash(v) % size)
    return out


class Router:
    """Input rows -> routed rows ``(g, m, t1, ord, rec)`` (``mapInArrow``).

    ``lines``: the input is text lines (column 0) decoded by ``cayuga run``'s
    decoder of format ``fmt``; else the columns are those of a
    :class:`~clients.spark.io.PreparedFrame` (decoded by
    :class:`~clients.spark.executors.DecodeRows`). The last two columns are the
    file path and block start (the input position, with the row's place in
    its block); ``None`` when the source has no files."""

    def __init__(self, plan: StreamPlan, fmt: str | None, decoder: X.DecodeRows | None, time_unit_ms: float) -> None:
        self.by_stream = _routes(plan.units, plan.key_groups)
        self.schemas = list(plan.input_schemas)
        self.fmt = fmt
        self.decoder = decoder
        self.time_unit_ms = time_unit_ms

    def __call__(self, batches):
        import pyarrow as pa

        counters: dict[tuple, int] = {}
        out = {"g": [], "m": [], "t1": [], "ord": [], "rec": []}
        schema = pa.schema([("g", pa.int32()), ("m", pa.int32()), ("t1", pa.float64()), ("ord", pa.string()),
                            ("rec", pa.binary())])

        def place(file, block) -> str:
            k = (file, block)
            i = counters.get(k, 0)
            counters[k] = i + 1
            return f"{file or ''}\x00{block or 0:020d}\x00{i:012d}"

        def emit(stream, values, t0, t1, ord_) -> None:
            rec = None
            for g in route(self.by_stream, stream, values):
                if rec is None:
                    rec = pickle.dumps((stream, values, t0, t1), protocol=pickle.HIGHEST_PROTOCOL)
                out["g"].append(g)
                out["m"].append(EVENT)
                out["t1"].append(float(t1))
                out["ord"].append(ord_)
                out["rec"].append(rec)

        def reject(where, text, reason) -> None:
            out["g"].append(-1)
            out["m"].append(REJECT)
            out["t1"].append(0.0)
            out["ord"].append(where)
            out["rec"].append(pickle.dumps((where, text, reason)))

        dec = None
        if self.decoder is None:
            names = {s.name: s for s in self.schemas}
            dec = make_decoder(self.fmt, names, default_stream=self.schemas[0].name if len(self.schemas) == 1 else None,
                               time_unit_ms=self.time_unit_ms, streams=list(names))
        for b in batches:
            cols = [c.to_pylist() for c in b.columns]
            files, blocks = cols[-2], cols[-1]
            places = [place(f, k) for f, k in zip(files, blocks)]
            if dec is not None:
                lines = [(v or "").rstrip("\r\n") for v in cols[0]]
                batch = dec.decode_batch("\n".join(lines) + "\n", 0)
                for pos, reason in batch.errors:
                    reject(_where(files[pos], places[pos]), lines[pos], reason)
                for i, ev in enumerate(batch.events):
                    emit(ev.stream, ev.values, ev.t0, ev.t1, places[batch.line_of(i)])
            else:
                rows = [(*r[:-2], p) for r, p in zip(zip(*cols), places)]
                rejects = _Collect()
                self.decoder.rejects = rejects
                self.decoder.counter = _Collect()
                for stream, values, t0, t1, ord_ in self.decoder(0, rows):
                    emit(stream, values, t0, t1, ord_)
                for _n, samples in rejects.items:
                    for _where_, text, reason in samples:
                        reject("input", text, reason)
            if out["g"]:
                yield pa.RecordBatch.from_pydict(out, schema=schema)
                for v in out.values():
                    v.clear()


def _where(file, place: str) -> str:
    line = int(place.rsplit("\x00", 1)[1]) + 1
    return f"{file or 'input'}, line {line} of its block"


class FlushRouter:
    """Control lines -> one flush marker per group."""

    def __init__(self, groups: int) -> None:
        self.groups = groups

    def __call__(self, batches):
        import pyarrow as pa

        schema = pa.schema([("g", pa.int32()), ("m", pa.int32()), ("t1", pa.float64()), ("ord", pa.string()),
                            ("rec", pa.binary())])
        for b in batches:
            if b.num_rows:
                n = self.groups
                yield pa.RecordBatch.from_pydict({"g": list(range(n)), "m": [FLUSH] * n, "t1": [END_OF_TIME] * n,
                                                  "ord": [""] * n, "rec": [b""] * n}, schema=schema)


# --------------------------------------------------------------------------- executors: the engines

#: (plan token, spec index) -> (engine, its emission list): one engine per spec in each Python worker.
_ENGINES: dict[tuple[str, int], tuple[Engine, list]] = {}


def engine_for(token: str, index: int, spec: EngineSpec, functions: dict) -> tuple[Engine, list]:
    got = _ENGINES.get((token, index))
    if got is None:
        from air.engine.functions import import_functions

        eng = Engine(functions=import_functions(functions))
        for s in spec.schemas:
            eng.declare(s)
        for owner, autos in spec.queries:
            eng.add(list(autos), owner=owner)
        emitted: list = []
        wanted = {s.name for s in spec.outputs}

        def on_emit(em) -> None:
            if em.kind == "OUT" and em.stream in wanted:
                emitted.append(em)

        eng.on_emit = on_emit
        got = _ENGINES[(token, index)] = (eng, emitted)
    return got


def _pystate_schema():
    from pyspark.sql.types import BinaryType, StructField, StructType

    return StructType([StructField("blob", BinaryType(), True)])


try:
    from pyspark.sql.streaming import StatefulProcessor as _Base
except ImportError:  # pragma: no cover - pyspark is an optional extra
    _Base = object


class CepProcessor(_Base):
    """The stateful operator: one grouping key per group (see the module docstring)."""

    def __init__(self, plan: StreamPlan, functions: dict | None, time_unit_ms: float, lateness_ms: float) -> None:
        self.token = plan.token()
        self.specs = plan.specs
        self.spec_of = plan.spec_of_group()
        self.outputs = dict(plan.output_streams)
        self.inputs = {s.name: s for s in plan.input_schemas}
        self.functions = dict(functions or {})
        self.time_unit_ms = time_unit_ms
        self.lateness_ms = lateness_ms

    def init(self, handle) -> None:
        self.handle = handle
        self.state = handle.getValueState("cayuga", _pystate_schema())

    def handleInputRows(self, key, rows, timerValues):
        g = int(key[0])
        if g < 0:
            yield from self._rejected(rows)
            return
        yield from self._advance(g, rows, timerValues.getCurrentWatermarkInMs())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield from self._advance(int(key[0]), (), timerValues.getCurrentWatermarkInMs())

    def close(self) -> None:
        pass

    # ---------------------------------------------------------------- the work

    def _rejected(self, rows):
        import pandas as pd

        for pdf in rows:
            lines = []
            for rec in pdf["rec"]:
                where, text, reason = pickle.loads(rec)
                lines.append(json.dumps({"reason": reason, "where": where, "input": text}))
            yield pd.DataFrame({"kind": ["rejected"] * len(lines), "stream": [None] * len(lines), "line": lines,
                                "rec": [None] * len(lines)})

    def _late_reason(self, t1, frontier: float, g: int) -> str:
        if math.isinf(frontier):
            return (f"t1={t1} came after the input had ended (--flush-at-end ran every held-back event of "
                    f"group {g}); nothing can be placed before it any more")
        return (f"t1={t1} is before {frontier:g}, the watermark (latest t1 seen minus {self.lateness_ms / 1000:g} s "
                f"of lateness) up to which group {g} had already run its events; raise --lateness to wait longer")

    def _advance(self, g: int, rows, wm_ms: int):
        import pandas as pd

        saved = self.state.get() if self.state.exists() else None
        st = pickle.loads(saved[0]) if saved else {"engine": None, "frontier": -math.inf, "buffer": []}
        frontier = st["frontier"]
        buffer = st["buffer"]
        kinds, streams, lines, recs = [], [], [], []
        flush = False
        for pdf in rows:
            for m, t1, ord_, rec in zip(pdf["m"], pdf["t1"], pdf["ord"], pdf["rec"]):
                if m == FLUSH:
                    flush = True
                elif t1 < frontier:
                    stream, values, t0, et1 = pickle.loads(rec)
                    ev = json.loads(witness_bytes(stream, Event(stream, values, t0, et1), self.inputs[stream]))
                    kinds.append("late")
                    streams.append(stream)
                    lines.append(json.dumps({"reason": self._late_reason(et1, frontier, g), "group": g, "event": ev}))
                    recs.append(None)
                else:
                    buffer.append((float(t1), ord_, bytes(rec)))
        limit = math.inf if flush else wm_ms / self.time_unit_ms
        ready = sorted((e for e in buffer if e[0] < limit), key=lambda e: (e[0], e[1]))
        if ready:
            buffer = [e for e in buffer if e[0] >= limit]
            si = self.spec_of[g]
            eng, emitted = engine_for(self.token, si, self.specs[si], self.functions)
            from air.engine.state import clear_state

            clear_state(eng)
            if st["engine"] is not None:
                eng.import_state(st["engine"])
            emitted.clear()
            for _t1, _ord, rec in ready:
                stream, values, t0, t1 = pickle.loads(rec)
                eng.feed(Event(stream, values, t0, t1))
            if flush:
                eng.flush()
            st["engine"] = eng.export_state()
            for em in emitted:
                ev = em.event
                kinds.append("witness")
                streams.append(em.stream)
                lines.append(witness_bytes(em.stream, ev, self.outputs[em.stream]).decode())
                recs.append(pickle.dumps((em.stream, ev.values, ev.t0, ev.t1), protocol=pickle.HIGHEST_PROTOCOL))
            emitted.clear()
            clear_state(eng)
        frontier = max(frontier, limit)
        st["frontier"] = frontier
        st["buffer"] = buffer
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        if buffer:
            first = min(e[0] for e in buffer)
            self.handle.registerTimer(math.ceil(first * self.time_unit_ms))
        self.state.update((pickle.dumps(st, protocol=pickle.HIGHEST_PROTOCOL),))
        if kinds:
            yield pd.DataFrame({"kind": kinds, "stream": streams, "line": lines, "rec": recs})


# --------------------------------------------------------------------------- the driver


@dataclass
class StreamJob:
    """A started ``spark stream`` query and its plan."""

    query: object
    plan: StreamPlan
    output: str
    output_format: str
    checkpoint: str
    messages: list[str] = field(default_factory=list)


def _load_plan_file(checkpoint: Path, key_groups: int | None, column_groups: int | None,
                    owners: list[str]) -> tuple[int, int | None]:
    path = checkpoint / PLAN_FILE
    if not path.exists():
        return key_groups or DEFAULT_KEY_GROUPS, column_groups
    saved = json.loads(path.read_text(encoding="utf-8"))
    if saved.get("owners") != owners:
        raise StreamError(f"the checkpoint {checkpoint} belongs to a job with the queries {saved.get('owners')}, "
                          f"not {owners}; give the same queries in the same order, or a new --checkpoint")
    for name, given in (("key_groups", key_groups), ("column_groups", column_groups)):
        if given is not None and given != saved.get(name):
            raise StreamError(f"{name.replace('_', ' ')} are fixed at the first start: the checkpoint {checkpoint} "
                              f"has {saved.get(name)}, not {given}; leave the option out or use a new --checkpoint")
    return saved["key_groups"], saved.get("column_groups")


def start_stream(df, streams: Sequence[StreamSchema], queries: Sequence[str | Path], *, output: str, checkpoint: str,
                 output_format: str = "jsonl", lines_format: str | None = None,
                 mapping: ColumnMapping | None = None, lateness: float = 0.0, trigger: float | None = None,
                 available_now: bool = False, flush_at_end: bool = False, key_groups: int | None = None,
                 column_groups: int | None = None, partitions: int | None = None,
                 functions: dict | None = None, time_unit_ms: float = 1.0,
                 say: Callable[[str], None] | None = None) -> StreamJob:
    """Start continuous CEP over the streaming DataFrame ``df`` (any source:
    files, Kafka, Delta, rate...).

    ``lines_format`` (``jsonl`` or ``cayuga``): ``df``'s first column holds
    text lines to decode as ``cayuga run`` does; None: its columns hold the
    events' fields, mapped by ``mapping``. Columns ``__file`` and ``__block``,
    when present, give each row's input position (ties at equal t1 go by it);
    otherwise ties go in the order the rows arrive. ``lateness`` (seconds) is
    the event-time watermark's delay. ``partitions``: the stateful
    operator's partitions at the first start (default: the session's
    ``spark.sql.shuffle.partitions`` if set, else twice the parallelism, at
    most one per group); Spark keeps them in the checkpoint. Returns the :class:`StreamJob`; its
    ``query`` runs until stopped (or, with ``available_now``, until the
    input present at the start is processed). ``flush_at_end`` (with
    ``available_now``): the input has ended; this call waits for the input's
    run to end, then starts (and returns) a run that processes every event
    still held back; later events are late."""
    from pyspark.sql import functions as F

    from clients.spark.run import load_queries

    say = say or log.info
    spark = df.sparkSession
    if output_format not in ("jsonl", "parquet"):
        raise StreamError(f"unknown output format {output_format!r}; use jsonl or parquet")
    if flush_at_end and not available_now:
        raise StreamError("--flush-at-end needs --available-now: it says the input has ended")
    if lateness < 0:
        raise StreamError(f"--lateness must be 0 or more seconds, not {lateness}")
    owned, loader = load_queries(streams, queries, functions)
    declared = {s.name: s for s in streams}
    ck = Path(checkpoint)
    k, c = _load_plan_file(ck, key_groups, column_groups, [q.owner for q in owned])
    plan = plan_stream(owned, declared, dict(loader.streams), k, c)
    ck.mkdir(parents=True, exist_ok=True)
    (ck / CONTROL_DIR).mkdir(exist_ok=True)
    plan_path = ck / PLAN_FILE
    if not plan_path.exists():
        tmp = ck / (PLAN_FILE + ".tmp")
        tmp.write_text(json.dumps({"key_groups": plan.key_groups, "column_groups": plan.column_groups,
                                   "owners": plan.owners}), encoding="utf-8")
        tmp.replace(plan_path)
    messages = plan.describe().splitlines()
    for line in messages:
        say(line)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    if not (ck / "query" / "offsets").exists():
        # the stateful operator's partitions are fixed at the first start (Spark keeps them in the
        # checkpoint); more than there are groups would only be empty state stores
        if partitions:
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        elif spark.conf.get("spark.sql.shuffle.partitions") == "200":  # Spark's default, untouched
            par = spark.sparkContext.defaultParallelism
            spark.conf.set("spark.sql.shuffle.partitions", str(max(1, min(plan.groups, 2 * par))))

    cols = list(df.columns)
    has_pos = "__file" in cols and "__block" in cols
    pos = [F.col("__file"), F.col("__block")] if has_pos else [F.lit(None).cast("string").alias("__file"),
                                                                 F.lit(None).cast("long").alias("__block")]
    if lines_format:
        src = df.select(F.col(f"`{cols[0]}`").cast("string").alias("value"), *pos)
        router = Router(plan, lines_format, None, time_unit_ms)
    else:
        prep = prepare_dataframe(df, list(streams), mapping)
        src = df.select(*[F.col(f"`{c}`").alias(f"c{i}") for i, c in enumerate(prep.columns)], *pos)
        router = Router(plan, None, prep.decoder(list(streams), None, None, time_unit_ms, seq_last=True),
                        time_unit_ms)
    routed = src.mapInArrow(router, ROUTED_SCHEMA)
    control = spark.readStream.text(str(ck / CONTROL_DIR)).mapInArrow(FlushRouter(plan.groups), ROUTED_SCHEMA)
    lateness_ms = float(lateness) * 1000.0
    timed = (routed.unionByName(control)
             .withColumn("ts", F.timestamp_millis(F.least(F.col("t1") * F.lit(time_unit_ms),
                                                           F.lit(END_OF_TIME)).cast("long")))
             .withWatermark("ts", f"{round(lateness_ms)} milliseconds")
             # the watermark column is not passed on, so Spark drops no late row: the processor
             # writes late events out instead
             .select("g", "m", "t1", "ord", "rec"))
    out = timed.groupBy("g").transformWithStateInPandas(
        CepProcessor(plan, functions, time_unit_ms, lateness_ms), OUTPUT_SCHEMA, "Append", "EventTime")
    writer = out.writeStream.option("checkpointLocation", str(ck / "query")).queryName(f"cayuga-{plan.token()}")
    if output_format == "jsonl":
        writer = (out.select("kind", F.col("line").alias("value")).writeStream.format("text").partitionBy("kind")
                  .option("path", output).option("checkpointLocation", str(ck / "query")))
    else:
        writer = writer.foreachBatch(ParquetBatches(output, plan.output_streams))
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif trigger:
        writer = writer.trigger(processingTime=f"{float(trigger)} seconds")
    query = writer.start()
    if flush_at_end:
        # The input first, to its end; then the flush marker alone, in a run of its own (the
        # control source would otherwise hand it to the first micro-batch, before later files).
        from pyspark.errors import StreamingQueryException

        try:
            query.awaitTermination()
        except StreamingQueryException:
            pass  # query.exception() says why; the caller sees it on its own awaitTermination
        if query.exception() is None:
            flag = ck / CONTROL_DIR / "flush.txt"
            if not flag.exists():
                tmp = ck / CONTROL_DIR / ".flush.tmp"
                tmp.write_text("flush\n", encoding="utf-8")
                tmp.replace(flag)
            query = writer.start()
    return StreamJob(query, plan, output, output_format, str(ck), messages)


class ParquetBatches:
    """``foreachBatch`` for ``--output-format parquet``: each micro-batch's
    witnesses of stream S go to ``OUTPUT/S/batch=<id>``, late and rejected
    records as JSON lines to ``OUTPUT/_late/batch=<id>`` and
    ``OUTPUT/_rejected/batch=<id>``. A batch that runs again after a failure
    overwrites its own directories, so the output holds it once."""

    def __init__(self, output: str, streams: Mapping[str, StreamSchema]) -> None:
        from clients.spark.run import dataset_path

        self.output = output
        self.streams = dict(streams)
        self.targets = {name: str(dataset_path(output, name)) for name in self.streams}  # checked before any write

    def __call__(self, batch_df, batch_id: int) -> None:
        from pyspark.sql import functions as F

        from clients.spark.run import witness_struct

        batch_df = batch_df.persist()
        try:
            spark = batch_df.sparkSession
            for name, schema in self.streams.items():
                rows = (batch_df.where((F.col("kind") == "witness") & (F.col("stream") == name)).select("rec")
                        .rdd.map(_witness_row))
                frame = spark.createDataFrame(rows, witness_struct(schema, True))
                frame.write.mode("overwrite").parquet(f"{self.targets[name]}/batch={batch_id}")
            for kind, sub in (("late", "_late"), ("rejected", "_rejected")):
                part = batch_df.where(F.col("kind") == kind).select(F.col("line").alias("value"))
                if not part.isEmpty():
                    part.write.mode("overwrite").text(f"{self.output}/{sub}/batch={batch_id}")
        finally:
            batch_df.unpersist()


def _witness_row(row) -> tuple:
    stream, values, t0, t1 = pickle.loads(row[0])
    return (stream, float(t0), float(t1), *values)


def file_source(spark, path: str, fmt: str, *, max_files_per_trigger: int | None = None):
    """A streaming DataFrame over the files that keep arriving in ``path``,
    with each row's input position (``__file``, ``__block``); returns it and
    the ``lines_format`` for :func:`start_stream` (None for column formats)."""
    from pyspark.sql import functions as F

    p = Path(path)
    if "://" not in path and not p.is_dir():
        raise InputError(f"--input {path} is not a directory; a stream reads the files that arrive in one")
    reader = spark.readStream
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    if fmt in ("jsonl", "cayuga"):
        df, lines = reader.text(path), fmt
    elif fmt in ("csv", "parquet", "json"):
        batch = spark.read
        try:
            if fmt == "csv":
                schema = batch.option("header", True).option("inferSchema", False).csv(path).schema
                df = (reader.schema(schema).option("header", True).option("ignoreLeadingWhiteSpace", True)
                      .option("ignoreTrailingWhiteSpace", True).csv(path))
            elif fmt == "parquet":
                df = reader.schema(batch.parquet(path).schema).parquet(path)
            else:
                df = reader.schema(batch.json(path).schema).json(path)
        except Exception as exc:  # Spark's AnalysisException: no file to learn columns from
            if "UNABLE_TO_INFER_SCHEMA" in str(exc) or "Unable to infer schema" in str(exc):
                raise InputError(f"--input {path} has no {fmt} file yet: a stream of {fmt} files learns its columns "
                                 "from the files present at the first start; put one in first") from None
            raise
        lines = None
    else:
        raise InputError(f"unknown input format {fmt!r}; use jsonl, cayuga, csv, parquet or json")
    df = df.select("*", F.col("_metadata.file_path").alias("__file"),
                   F.col("_metadata.file_block_start").alias("__block"))
    return df, lines


def read_output(spark, output: str, output_format: str = "jsonl", kind: str = "witness"):
    """The records of one kind (witness, late, rejected) a job wrote, read
    through Spark (for jsonl, the file sink's log: each committed batch once)."""
    from pyspark.sql import functions as F

    if output_format == "jsonl":
        if not (Path(output) / "_spark_metadata").exists() and "://" not in output:
            return []
        df = spark.read.text(output)
        if "kind" not in df.columns:  # nothing written yet: no kind=... directory
            return []
        return [r.value for r in df.where(F.col("kind") == kind).select("value").collect()]
    raise StreamError("read_output reads jsonl output; read OUTPUT/<stream> with spark.read.parquet")
