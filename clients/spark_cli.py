"""``cayuga spark ...``: the Spark connector's commands (a click group to mount on ``cayuga``).

- ``run``: distributed batch execution of queries inside Spark executors;
- ``source``: read events with Spark and stream them to a server's TCP port;
- ``sink``: write witnesses received over WebSocket as Parquet;
- ``bench``: events/s of the distributed run against the single engine;
- ``stream``: continuous CEP over files arriving in a directory (Structured Streaming).
"""

from __future__ import annotations

import sys

import click

from air.errors import CayugaError
from air.model import ModelError
from clients.options import make_client, tls_options, url_option
from clients.words import noun, plural, unreachable

_STREAM_HELP = 'A stream declaration, e.g. "Stock(Name string, Price float, Volume int)". Repeatable.'
_INPUT_FORMATS = ["jsonl", "cayuga", "csv", "parquet", "json"]
_INPUT_FORMAT_HELP = ("Format of the input. Default: from the file name (.parquet, .csv, .txt = cayuga lines; else JSON lines).")
_COLUMN_HELP = ("Column mapping ATTR=COLUMN (also stream=, t0=, t1=); repeatable. "
                "Unmapped attributes use the column of the same name.")


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"cayuga spark: {message}", err=True)
    sys.exit(code)


#: What ``cayuga spark ...`` says when pyspark is not installed.
NO_PYSPARK = ("the Spark connector needs pyspark, which is not installed here (the server does not need it, "
              "so a plain `pip install cayuga` leaves it out): pip install 'cayuga[spark]' (from a clone: "
              "pip install -e '.[spark]'); Spark also needs Java 17 or later (java -version)")


def _need_pyspark() -> None:
    """Exit 2 with :data:`NO_PYSPARK` when pyspark cannot be imported (before any work)."""
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        _fail(NO_PYSPARK)


def _schemas(streams, schema_files, config_path):
    from clients.offline import load_streams
    from server.config import ConfigError, load_settings

    try:
        schemas = load_streams(streams, schema_files)
        if config_path or not schemas:
            schemas = load_settings(config_path).stream_schemas() + schemas
    except (ModelError, CayugaError, ConfigError) as exc:
        _fail(str(exc))
    if not schemas:
        _fail("declare the input streams with --stream")
    return schemas


def _functions(config_path) -> dict[str, tuple[str, str]]:
    """User functions of the configuration file (shipped to executors by import path)."""
    from server.config import ConfigError, load_settings

    try:
        return load_settings(config_path).function_specs() if config_path else {}
    except ConfigError as exc:
        _fail(str(exc))


def _mapping(columns):
    from clients.spark.io import ColumnMapping, InputError

    try:
        return ColumnMapping.parse(columns)
    except InputError as exc:
        _fail(str(exc))


def _report_rejects(n: int, samples) -> None:
    for where, text, reason in samples:
        click.echo(f"{where}: rejected: {reason}", err=True)
    if n > len(samples):
        click.echo(f"... and {n - len(samples)} more rejected {noun(n - len(samples), 'record')}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def spark() -> None:
    """Spark connector: distributed runs, bulk event source, witness sink."""


def _common(f):
    f = click.option("--master", default="local[2]", show_default=True,
                     help="Spark master; 'none' leaves it to spark-submit.")(f)
    f = click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="Declare the streams (and user functions) of this configuration file.")(f)
    f = click.option("--schema", "schema_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
                     help="An original Cayuga <StreamType> XML schema file. Repeatable.")(f)
    f = click.option("--stream", "streams", multiple=True, help=_STREAM_HELP)(f)
    return f


class _Session:
    """The SparkSession of one command; stopped at the end only if this command
    created it (an embedding program's session is left running)."""

    def __init__(self, master: str, app: str) -> None:
        from pyspark.sql import SparkSession

        from clients.spark.session import get_session

        existing = SparkSession.getActiveSession()
        self.spark = get_session(None if master == "none" else master, app)
        self.owned = existing is None

    def stop(self) -> None:
        if self.owned:
            self.spark.stop()


def _session(master: str, app: str) -> _Session:
    return _Session(master, app)


@spark.command()
@_common
@click.option("--query", "queries", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="A query: AIR (.xml), CEL (.cel) or SASE (.sase). Repeatable; later queries may read earlier "
                   "outputs.")
@click.option("--input", "input_path", required=True, help="Events: a file or directory (JSON lines, CSV, Parquet).")
@click.option("--input-format", type=click.Choice(_INPUT_FORMATS), default=None,
              help=_INPUT_FORMAT_HELP)
@click.option("--column", "columns", multiple=True, help=_COLUMN_HELP)
@click.option("--output", "output", required=True, help="Where to write the witnesses.")
@click.option("--output-format", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True,
              help="jsonl: one file, as `cayuga run` writes it; parquet: a dataset per output stream, OUTPUT/<stream>.")
@click.option("--partitions", type=int, default=None, help="Partitions of a keyed stage (default: 2 x cores).")
@click.option("--include-resub", is_flag=True, help="Also write witnesses of internal (RESUB) streams.")
def run(streams, schema_files, config_path, master, queries, input_path, input_format, columns, output,
        output_format, partitions, include_resub) -> None:
    """Run queries over historical events inside Spark executors.

    The input is hash-partitioned by the key the queries' equality predicates
    imply (one engine per partition); without one the job runs in a single
    partition and says so. Exit code 0, 1 when input records were rejected,
    2 on a usage, schema or query error."""
    _need_pyspark()
    from air.engine import EngineError
    from clients.spark.io import InputError
    from clients.spark.run import run_distributed, write_jsonl, write_parquet

    schemas = _schemas(streams, schema_files, config_path)
    mapping = _mapping(columns)
    session = _session(master, "cayuga-spark-run")
    spark_session = session.spark
    try:
        try:
            res = run_distributed(spark_session, schemas, list(queries), input_path, input_format,
                                  mapping=mapping, partitions=partitions, include_resub=include_resub,
                                  functions=_functions(config_path),
                                  say=lambda m: click.echo(f"cayuga spark: {m}", err=True))
        except (CayugaError, EngineError, ModelError, InputError) as exc:
            _fail(str(exc))
        if output_format == "jsonl":
            write_jsonl(res, output)
        else:
            write_parquet(spark_session, res, output)
        _report_rejects(res.rejected, res.rejected_samples)
        eps = res.events / res.seconds if res.seconds else 0.0
        click.echo(f"cayuga spark: {plural(res.events, 'event')}, {plural(res.witnesses, 'witness')}, {res.rejected} rejected, "
                   f"{plural(len([p for p in res.partitions if p.stage == 1]), 'partition')} (skew {res.skew():.2f}), "
                   f"{res.seconds:.1f} s ({eps:,.0f} events/s)", err=True)
        res.release()
    finally:
        session.stop()
    sys.exit(1 if res.rejected else 0)


@spark.command()
@_common
@click.argument("input_path", metavar="INPUT")
@click.option("--input-format", type=click.Choice(_INPUT_FORMATS), default=None, help=_INPUT_FORMAT_HELP)
@click.option("--column", "columns", multiple=True, help=_COLUMN_HELP)
@url_option
@click.option("--port", "tcp_port", type=int, default=None, help="TCP event port (default: asked from /health).")
@click.option("--token", envvar="CAYUGA_TOKEN", default=None, help="API token (or CAYUGA_TOKEN).")
@click.option("--partitions", type=int, default=None, help="Partitions of the time-ordered sort.")
@tls_options
def source(streams, schema_files, config_path, master, input_path, input_format, columns, url, tcp_port,
           token, partitions, cacert, cert, key) -> None:
    """Stream the events of INPUT to a server, in detection-time order."""
    _need_pyspark()
    from clients.client import explain_tls
    from clients.spark.io import InputError
    from clients.spark.source import stream_to_server

    schemas = _schemas(streams, schema_files, config_path)
    mapping = _mapping(columns)
    with make_client(url, token=token, tcp_port=tcp_port, cacert=cacert, cert=cert, key=key) as client:
        try:
            host, port = client.tcp_address()
        except Exception as exc:  # noqa: BLE001 - any connection failure is reported the same way
            _fail(explain_tls(exc, url) or unreachable(url, exc))
        tcp_tls = client.tcp_ssl_context
    session = _session(master, "cayuga-spark-source")
    spark_session = session.spark
    try:
        try:
            res = stream_to_server(spark_session, input_path, schemas, host, port, input_format,
                                   mapping=mapping, partitions=partitions, token=token, ssl_context=tcp_tls)
        except (InputError, OSError) as exc:
            _fail(str(exc))
    finally:
        session.stop()
    _report_rejects(res.rejected_input, res.rejected_samples)
    for line in res.server_errors:
        click.echo(f"server: {line}", err=True)
    click.echo(f"cayuga spark: sent {plural(res.sent, 'event')} from {plural(res.partitions, 'partition')}; "
               f"{plural(res.rejected_input, 'input record')} rejected, {len(res.server_errors)} refused by the server",
               err=True)
    sys.exit(1 if res.rejected_input or res.server_errors else 0)


@spark.command()
@click.argument("subscription", required=False)
@click.option("--stream", default=None, help="Watch an output stream instead of a subscription.")
@click.option("--output", required=True, help="Parquet dataset to append the witnesses to.")
@url_option
@click.option("--token", envvar="CAYUGA_TOKEN", default=None, help="API token (or CAYUGA_TOKEN).")
@click.option("--count", type=int, default=None, help="Stop after this many witnesses.")
@click.option("--idle-timeout", type=float, default=10.0, show_default=True,
              help="Stop when no witness arrives for this many seconds.")
@click.option("--batch-size", type=int, default=10_000, show_default=True, help="Witnesses per Parquet append.")
@click.option("--master", default="local[2]", show_default=True,
              help="Spark master; 'none' leaves it to spark-submit.")
@tls_options
def sink(subscription, stream, output, url, token, count, idle_timeout, batch_size, master, cacert, cert,
         key) -> None:
    """Write the witnesses of SUBSCRIPTION (or --stream) as Parquet."""
    _need_pyspark()
    from clients.client import CayugaAPIError, explain_tls
    from clients.spark.sink import sink_to_parquet

    if not subscription and not stream:
        _fail("give a subscription id or --stream")
    client = make_client(url, token=token, cacert=cacert, cert=cert, key=key)  # TLS files checked before Spark starts
    session = _session(master, "cayuga-spark-sink")
    spark_session = session.spark
    try:
        with client:
            try:
                n = sink_to_parquet(spark_session, client, output, subscription, stream=stream, count=count,
                                    idle_timeout=idle_timeout, batch_size=batch_size)
            except (CayugaAPIError, KeyError, ValueError, OSError) as exc:
                _fail(explain_tls(exc, url) or str(exc))
    finally:
        session.stop()
    click.echo(f"cayuga spark: wrote {plural(n, 'witness')} to {output}", err=True)


@spark.command()
@click.option("--events", "n_events", type=int, default=2_000_000, show_default=True,
              help="Events of the generated input.")
@click.option("--symbols", type=int, default=1000, show_default=True, help="Distinct stock names in the input.")
@click.option("--skew", type=float, default=0.0, show_default=True,
              help="Share of all events that go to the single hottest symbol (0: uniform).")
@click.option("--masters", default="local[1],local[2]", show_default=True, help="Comma-separated Spark masters.")
@click.option("--query", "query", type=click.Path(exists=True, dir_okay=False), default=None,
              help="CEL query (default: ten consecutive increasing prices per symbol, "
                   "docs/design/workloads.md#increasing-prices).")
@click.option("--workdir", default="bench-spark", show_default=True, help="Where the input and outputs go.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the generated input.")
def bench(n_events, symbols, skew, masters, query, workdir, seed) -> None:
    """Events/s of `spark run` on 1..N cores next to the single engine."""
    _need_pyspark()
    from clients.spark.bench import run_bench

    run_bench(n_events=n_events, symbols=symbols, skew=skew, masters=masters.split(","), query=query,
              workdir=workdir, seed=seed, echo=lambda m: click.echo(m, err=True))


if __name__ == "__main__":
    spark()


@spark.command()
@_common
@click.option("--query", "queries", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="A query: AIR (.xml), CEL (.cel) or SASE (.sase). Repeatable; later queries may read earlier "
                   "outputs.")
@click.option("--input", "input_path", required=True,
              help="A directory that event files keep arriving in (JSON lines, Cayuga lines, CSV, Parquet). "
                   "Files are read whole; write each elsewhere and move it in.")
@click.option("--input-format", type=click.Choice(_INPUT_FORMATS), default=None,
              help="Format of the files. Default: parquet or csv when the directory holds such files, else JSON lines.")
@click.option("--column", "columns", multiple=True, help=_COLUMN_HELP)
@click.option("--output", "output", required=True,
              help="Output directory: OUTPUT/kind=witness (the witnesses), kind=late, kind=rejected (jsonl).")
@click.option("--output-format", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True,
              help="jsonl: a Spark file sink of the JSON lines `cayuga run` writes; parquet: OUTPUT/<stream> per "
                   "output stream, OUTPUT/_late and OUTPUT/_rejected as JSON lines.")
@click.option("--checkpoint", required=True,
              help="Checkpoint directory (offsets, commits, the engines' state). Restart with the same one.")
@click.option("--lateness", type=float, default=0.0, show_default=True,
              help="Seconds events wait for earlier ones (the event-time watermark's delay; the server's T-delay).")
@click.option("--trigger", type=float, default=None, help="Seconds between micro-batches (default: as soon as possible).")
@click.option("--available-now", is_flag=True, help="Process the files present now, then stop.")
@click.option("--flush-at-end", is_flag=True,
              help="With --available-now: the input has ended, so every held-back event is processed "
                   "(later events are late).")
@click.option("--max-files-per-trigger", type=int, default=None,
              help="At most this many new files per micro-batch (default: all that are there).")
@click.option("--partitions", type=int, default=None,
              help="Partitions of the stateful operator (default: 2 x cores, at most one per group). "
                   "Fixed at the first start.")
@click.option("--key-groups", type=int, default=None,
              help="Groups a key is hashed into (default 32). Fixed at the first start: the checkpoint keeps it.")
@click.option("--column-groups", type=int, default=None,
              help="Groups the unkeyed queries are dealt into (default: one per query, at most --key-groups). "
                   "Fixed at the first start.")
def stream(streams, schema_files, config_path, master, queries, input_path, input_format, columns, output,
           output_format, checkpoint, lateness, trigger, available_now, flush_at_end, max_files_per_trigger,
           partitions, key_groups, column_groups) -> None:
    """Run queries continuously over files arriving in a directory (Spark Structured Streaming).

    Prints the plan (keys, constant routes, column groups). Exactly once across
    failures: restart with the same command and checkpoint. Exit code 0; 1
    when late or rejected records have been written (see OUTPUT); 2 on a usage,
    schema, query or checkpoint error."""
    _need_pyspark()
    from pathlib import Path

    from air.engine import EngineError
    from clients.spark.io import InputError
    from clients.spark.stream import StreamError, file_source, read_output, start_stream

    schemas = _schemas(streams, schema_files, config_path)
    mapping = _mapping(columns)
    for name, value in (("--key-groups", key_groups), ("--column-groups", column_groups),
                        ("--max-files-per-trigger", max_files_per_trigger), ("--partitions", partitions)):
        if value is not None and value < 1:
            _fail(f"{name} must be 1 or more, not {value}")
    if input_format is None:
        p = Path(input_path)
        input_format = next((f for f in ("parquet", "csv") if p.is_dir() and any(p.glob(f"*.{f}"))), "jsonl")
    def say(m: str) -> None:
        click.echo(f"cayuga spark: {m}", err=True)

    session = _session(master, "cayuga-spark-stream")
    spark_session = session.spark
    try:
        try:
            df, lines = file_source(spark_session, input_path, input_format,
                                    max_files_per_trigger=max_files_per_trigger)
            job = start_stream(df, schemas, list(queries), output=output, checkpoint=checkpoint,
                               output_format=output_format, lines_format=lines, mapping=mapping, lateness=lateness,
                               trigger=trigger, available_now=available_now, flush_at_end=flush_at_end,
                               key_groups=key_groups, column_groups=column_groups, partitions=partitions,
                               functions=_functions(config_path), say=say)
        except (CayugaError, EngineError, ModelError, InputError, StreamError) as exc:
            _fail(str(exc))
        from pyspark.errors import StreamingQueryException

        try:
            job.query.awaitTermination()
        except KeyboardInterrupt:
            job.query.stop()
        except StreamingQueryException as exc:
            _fail(f"the streaming query failed: {exc.getMessage() if hasattr(exc, 'getMessage') else exc}; "
                  f"fix the cause and run the same command again: it resumes from {checkpoint}", 1)
        bad = {}
        if output_format == "jsonl":
            for kind in ("late", "rejected"):
                bad[kind] = len(read_output(spark_session, output, "jsonl", kind))
        else:
            for kind in ("late", "rejected"):
                d = Path(output) / f"_{kind}"
                bad[kind] = spark_session.read.text(str(d)).count() if d.exists() else 0
        say(f"stopped; {bad['late']} late and {bad['rejected']} rejected records so far (in {output})")
    finally:
        session.stop()
    sys.exit(1 if any(bad.values()) else 0)
