"""The ``cayuga`` command line."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from air.errors import CayugaError
from air.model import ModelError, StreamSchema


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"cayuga: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cayuga")
def main() -> None:
    """Cayuga for Python: a complex-event-processing engine and server."""


_STREAM_HELP = 'A stream declaration, e.g. "Stock(Name string, Price float, Volume int)". Repeatable.'


@main.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Declare the streams of this configuration file (default: the bundled config.yaml "
                   "when no --stream or --schema is given).")
@click.option("--stream", "streams", multiple=True, help=_STREAM_HELP)
@click.option("--schema", "schema_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="An original Cayuga <StreamType> XML schema file. Repeatable.")
@click.option("--query", "queries", multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False),
              help="A query: AIR (.xml) or CEL (.cel). Repeatable; later queries may read earlier outputs.")
@click.option("--events", "events_path", required=True, type=click.Path(exists=True, dir_okay=False, allow_dash=True),
              help="The event file ('-' for standard input).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "cayuga", "csv"]), default="jsonl",
              show_default=True, help="Format of the event file.")
@click.option("--output", "output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              help="Where to write witnesses as JSON lines (default: standard output).")
@click.option("--include-resub", is_flag=True, help="Also write witnesses of internal (RESUB) streams.")
def run(config_path, streams, schema_files, queries, events_path, fmt, output, include_resub) -> None:
    """Run queries over an event file offline and print the witnesses.

    Exit code 0 when every input line was accepted, 1 when some line was
    rejected (each is reported on standard error with its line number), 2 on
    a usage, schema or query error."""
    from server.config import ConfigError, load_settings
    from server.engine import EngineError
    from server.runner import load_streams, run_offline

    try:
        schemas = load_streams(streams, schema_files)
        if config_path or not schemas:
            schemas = load_settings(config_path).stream_schemas() + schemas
    except (ModelError, CayugaError, ConfigError) as exc:
        _fail(str(exc))
    out = click.open_file(output, "w", encoding="utf-8")
    try:
        with click.open_file(events_path, "r", encoding="utf-8") as fh:
            result = run_offline(
                schemas, list(queries), fh, fmt, include_resub=include_resub,
                on_witness=lambda w: out.write(_json(w) + "\n"),
            )
    except (CayugaError, EngineError, ModelError) as exc:
        _fail(str(exc))
    finally:
        if output != "-":
            out.close()
        else:
            out.flush()
    for r in result.rejected:
        click.echo(f"{events_path}:{r.line}: rejected: {r.reason}", err=True)
    click.echo(
        f"cayuga: {result.events} events, {len(result.witnesses)} witnesses, "
        f"{len(result.rejected)} rejected lines", err=True)
    sys.exit(1 if result.rejected else 0)


def _json(obj) -> str:
    from server.formats import encode_json

    return encode_json(obj)


@main.command("compile")
@click.argument("query", type=click.Path(exists=True, dir_okay=False))
@click.option("--stream", "streams", multiple=True, help=_STREAM_HELP)
@click.option("--schema", "schema_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="An original Cayuga <StreamType> XML schema file. Repeatable.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the AIR here instead of standard output.")
def compile_(query, streams, schema_files, output) -> None:
    """Compile a CEL query to AIR (one <NFA> per automaton)."""
    from air.airxml import dump_air
    from server.runner import load_streams

    try:
        schemas = {s.name: s for s in load_streams(streams, schema_files)}
        schemas.setdefault("DUAL", StreamSchema("DUAL", ()))
        from air.cel import compile_cel

        text = Path(query).read_text(encoding="utf-8")
        compiled = compile_cel(text, schemas, name_prefix=Path(query).stem)
    except (CayugaError, ModelError) as exc:
        _fail(f"{query}: {exc}")
    autos = compiled.automata
    if len(autos) == 1:
        air = dump_air(autos[0])
    else:
        air = "<NFAs>\n" + "".join(dump_air(a) for a in autos) + "</NFAs>\n"
    if output:
        Path(output).write_text(air, encoding="utf-8")
    else:
        click.echo(air, nl=False)


def _add_optional_groups() -> None:
    """Command groups that live with their subsystem (e.g. ``bench/cli.py``)."""
    try:
        from bench.cli import bench
    except ImportError:  # the benchmark package is not part of this installation
        return
    main.add_command(bench)


_add_optional_groups()


if __name__ == "__main__":  # pragma: no cover
    main()
