"""Distributed batch execution: the engine inside Spark executors (docs/design/semantics.md#distribution).

1. The queries are loaded and checked exactly as ``cayuga run`` loads them
   (one owner per query file, later files may read earlier outputs).
2. :func:`~air.partitioning.plan_stages` finds a partition key (one
   attribute per input stream) or cuts the queries into stages.
3. For each stage the input is hash-partitioned by the key (a process-stable
   hash), each partition sorted by ``(t1, input position)`` — the stable sort of
   ``cayuga run`` — and one :class:`~air.engine.Engine` runs per partition
   (``mapPartitions``). Without a key the stage runs in one partition.
4. Witnesses of all partitions are unioned; streams that a later stage reads
   are fed to it as events.

The witnesses equal ``cayuga run``'s as a multiset (their order differs).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from air.engine import Engine
from air.engine.functions import import_functions
from air.model import StreamSchema
from air.names import name_problem, shown
from clients.offline import load_engine
from clients.spark.io import ColumnMapping, read_events
from air.partitioning import Owned, Plan, plan_stages
from clients.spark import executors as X

log = logging.getLogger("cayuga.spark")


@dataclass
class PartitionStats:
    stage: int
    partition: int
    events: int
    witnesses: int
    seconds: float


@dataclass
class DistributedResult:
    plan: Plan
    events: int = 0
    witnesses: int = 0
    rejected: int = 0
    rejected_samples: list[tuple[str, str, str]] = field(default_factory=list)
    partitions: list[PartitionStats] = field(default_factory=list)
    seconds: float = 0.0
    output_streams: dict[str, StreamSchema] = field(default_factory=dict)
    float_time_streams: set[str] = field(default_factory=set)
    witness_rdd: object = None  # witness records selected for output (persisted)

    def skew(self, stage: int = 1) -> float:
        """Largest partition / mean partition, by events, of a stage (1.0 = even)."""
        sizes = [p.events for p in self.partitions if p.stage == stage]
        if not sizes or not sum(sizes):
            return 1.0
        return max(sizes) / (sum(sizes) / len(sizes))

    def collect(self) -> list[dict]:
        """The witnesses as the dicts ``cayuga run`` writes (on the driver)."""
        return self.witness_rdd.map(X.WitnessDict(list(self.output_streams.values()))).collect()

    def release(self) -> None:
        for rdd in getattr(self, "_persisted", []):
            rdd.unpersist()


def load_queries(streams: Sequence[StreamSchema], queries: Sequence[str | Path],
                 functions: dict[str, tuple[str, str]] | None = None) -> tuple[list[Owned], Engine]:
    """Load ``queries`` as ``cayuga run`` does (raises QueryError naming the file).
    ``functions`` are user functions as NAME -> (module:attribute, return type)."""
    engine, loaded = load_engine(streams, queries, import_functions(functions or {}))
    return [Owned(owner, tuple(autos)) for owner, autos in loaded], engine


def run_distributed(spark, streams: Sequence[StreamSchema], queries: Sequence[str | Path], input_path: str,
                    fmt: str | None = None, *, mapping: ColumnMapping | None = None,
                    partitions: int | None = None, include_resub: bool = False,
                    time_unit_ms: float = 1.0, say: Callable[[str], None] | None = None,
                    functions: dict[str, tuple[str, str]] | None = None) -> DistributedResult:
    """Run ``queries`` over the events at ``input_path`` in Spark executors.

    Returns a result whose ``witness_rdd`` holds the output witness records
    (persisted; write them with :func:`write_jsonl` / :func:`write_parquet`,
    or :meth:`DistributedResult.collect`). ``partitions`` defaults to twice the
    default parallelism (more, smaller partitions soften key skew). User
    ``functions`` (NAME -> (module:attribute, return type)) are imported in
    every executor, so their modules must be installed there."""
    say = say or log.info
    started = time.perf_counter()
    owned, loader = load_queries(streams, queries, functions)
    declared = {s.name: s for s in streams}
    plan = plan_stages(owned, declared)
    for line in plan.describe().splitlines():
        say(line)
    sc = spark.sparkContext
    n_parts = partitions or max(2, 2 * sc.defaultParallelism)
    inp = read_events(spark, input_path, list(streams), fmt, mapping=mapping, time_unit_ms=time_unit_ms)

    all_schemas = dict(loader.streams)
    persisted = []
    if sum(1 for st in plan.stages if any(s in declared for s in st.inputs)) > 1:
        inp.rdd.persist(_storage_level())  # read once, and count once, for several stages
        persisted.append(inp.rdd)
    kinds = ("OUT", "RESUB") if include_resub else ("OUT",)
    out_rdds = []
    carried = None  # event records of streams materialised by earlier stages
    later_inputs = [set(st.inputs) for st in plan.stages]
    stage_stats = []
    for i, stage in enumerate(plan.stages, 1):
        base_in = [s for s in stage.inputs if s in declared]
        src = inp.rdd.filter(X.InStreams(base_in))
        if carried is not None:
            derived = [s for s in stage.inputs if s not in declared]
            src = src.union(carried.filter(X.InStreams(derived)))
        if stage.key:
            key_index = {s: all_schemas[s].index(a) for s, a in stage.key.attributes}
            n = n_parts
        else:
            key_index, n = None, 1
        inputs_schemas = [all_schemas[s] for s in stage.inputs]
        queries_spec = [(q.owner, q.automata) for q in stage.queries]
        runner = X.RunEngine(i, inputs_schemas, queries_spec, functions or {})
        if len(plan.stages) == 1 and inp.prepared is not None:
            result = _run_in_jvm_order(inp, list(streams), stage, runner, n, time_unit_ms)
        else:
            result = (src.map(X.ToKeyed(key_index, n))
                      .repartitionAndSortWithinPartitions(n, partitionFunc=X.partition_of)
                      .mapPartitionsWithIndex(runner))
        result.persist(_storage_level())
        persisted.append(result)
        stage_stats.append(result.filter(X.is_stats))
        out_rdds.append(result.filter(X.SelectWitnesses(None, kinds)))
        needed = set().union(*later_inputs[i:]) if i < len(plan.stages) else set()
        produced = set(stage.outputs) & needed
        if produced:
            nxt = result.filter(X.SelectWitnesses(produced)).map(X.witness_to_event)
            carried = nxt if carried is None else carried.union(nxt)

    witnesses = out_rdds[0] if len(out_rdds) == 1 else sc.union(out_rdds)
    res = DistributedResult(plan=plan, witness_rdd=witnesses)
    res._persisted = persisted  # type: ignore[attr-defined]
    for rdd in stage_stats:  # each stage runs once: its result is persisted
        for _, st, pid, nev, nw, secs, floats in rdd.collect():
            res.partitions.append(PartitionStats(st, pid, nev, nw, secs))
            res.float_time_streams.update(floats)
    res.events = inp.events
    res.rejected, res.rejected_samples = inp.rejected
    res.witnesses = witnesses.count()
    outs = {o.name for st in plan.stages for a in st.automata for _, o in a.outputs if o.type in kinds}
    res.output_streams = {name: all_schemas[name] for name in sorted(outs)}
    res.seconds = time.perf_counter() - started
    return res


def _run_in_jvm_order(inp, schemas: list[StreamSchema], stage, runner, n: int, time_unit_ms: float):
    """DataFrame input, one stage: partition and sort in the JVM, decode and run
    the engines on Arrow batches (no Python shuffle, no Python row objects)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    prep = inp.prepared
    df = prep.df.withColumn("_seq", F.monotonically_increasing_id())
    if stage.key:
        by_stream = {s.name: s for s in schemas}
        exprs = []
        for stream, attr in stage.key.attributes:
            p = prep.positions[stream][by_stream[stream].index(attr)]
            if p < 0:
                continue  # every row of this stream is rejected anyway
            typ = by_stream[stream].type_of(attr)
            col = F.col(f"c{p}")
            # Values equal under the engine's '=' must hash alike: numbers as doubles.
            col = col.cast("double") if typ in ("int", "float") else (
                col.cast("boolean").cast("double") if typ == "bool" else col.cast("string"))
            exprs.append(F.when(F.col("c0") == stream, col) if prep.stream_col else col)
        key = F.coalesce(*exprs) if len(exprs) > 1 else (exprs[0] if exprs else F.lit(0))
        df = df.repartition(n, key)
    else:
        df = df.repartition(1)
    t1_type = df.schema[f"c{prep.t1_index}"].dataType
    jvm_sort = isinstance(t1_type, (T.NumericType, T.TimestampType, T.DateType))
    if jvm_sort:
        df = df.sortWithinPartitions(f"c{prep.t1_index}", "_seq")
    decoder = prep.decoder(schemas, inp.rejects, inp.counter, time_unit_ms, seq_last=True)
    out = df.mapInArrow(X.RunEngineArrow(runner, decoder, python_sort=not jvm_sort), "rec binary")
    return out.rdd.map(X.unpickle_rec)


def _storage_level():
    from pyspark import StorageLevel

    return StorageLevel.MEMORY_AND_DISK


def write_jsonl(result: DistributedResult, path: str | Path) -> int:
    """Write the witnesses to one JSON-lines file, as ``cayuga run --output`` does."""
    n = 0
    to_json = X.WitnessJson(list(result.output_streams.values()))
    with open(path, "w", encoding="utf-8") as fh:
        for line in result.witness_rdd.map(to_json).toLocalIterator():
            fh.write(line + "\n")
            n += 1
    return n


_SPARK_TYPES = {"int": "LongType", "float": "DoubleType", "string": "StringType", "bool": "BooleanType"}


def witness_struct(schema: StreamSchema, float_times: bool):
    """The Spark schema of a witness stream: stream, t0, t1, then the attributes."""
    from pyspark.sql import types as T

    tt = T.DoubleType() if float_times else T.LongType()
    fields = [T.StructField("stream", T.StringType(), False), T.StructField("t0", tt, False),
              T.StructField("t1", tt, False)]
    fields += [T.StructField(a.name, getattr(T, _SPARK_TYPES[a.type])(), True) for a in schema.attributes]
    return T.StructType(fields)


def witness_frames(spark, result: DistributedResult) -> dict:
    """One DataFrame per output stream (their schemas differ)."""
    frames = {}
    for name, schema in result.output_streams.items():
        floats = name in result.float_time_streams
        rows = result.witness_rdd.filter(X.SelectWitnesses([name])).map(X.WitnessRow(floats))
        frames[name] = spark.createDataFrame(rows, witness_struct(schema, floats))
    return frames


def dataset_path(root: str | Path, stream: str) -> Path:
    """``root/<stream>``, the Parquet dataset of an output stream, refused
    unless ``stream`` is a valid name (air/names.py) and the path, resolved,
    lies inside ``root``: a stream name never writes (or, with mode
    "overwrite", deletes) anything outside the output directory."""
    problem = name_problem(stream, what="output stream name")
    if problem is not None:
        raise ValueError(f"cannot write the Parquet dataset of this stream: {problem}")
    base = Path(root).resolve()
    target = (base / stream).resolve()
    if target.parent != base:
        raise ValueError(f"the Parquet dataset of stream {shown(stream)} would be {target}, outside the output "
                         f"directory {base}; nothing was written")
    return target


def write_parquet(spark, result: DistributedResult, path: str | Path, mode: str = "overwrite") -> list[str]:
    """Write each output stream's witnesses as a Parquet dataset ``PATH/<stream>``."""
    frames = witness_frames(spark, result)
    targets = {name: str(dataset_path(path, name)) for name in frames}  # every one checked before any is written
    written = []
    for name, df in frames.items():
        target = targets[name]
        df.write.mode(mode).parquet(target)
        written.append(target)
    return written
