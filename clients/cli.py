"""The ``cayuga`` command line."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path

import click

from air.errors import CayugaError
from air.model import ModelError, StreamSchema
from clients.cli_backfill import FROM_HELP, ReplayMarker, from_refusal, parse_from, preview, wait_live
from clients.cli_manage import refusal, streams, subscriptions
from clients.cli_send import send
from clients.options import make_client, tls_options, url_option
from clients.words import QueryWarnings, plural, unreachable


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"cayuga: {message}", err=True)
    sys.exit(code)


class _LazyGroup(click.Group):
    """Subcommand groups that live with their subsystem, imported only when
    named: ``cayuga bench`` imports the engine, ``cayuga build-engine`` must
    not have imported it before it rebuilds it."""

    LAZY = {"bench": "clients.bench.cli:bench"}

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self._available()])

    def get_command(self, ctx, name):
        if name in self._available():
            import importlib

            module, attr = self.LAZY[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)

    def _available(self) -> list[str]:
        import importlib.util

        # the benchmark package is not part of every installation
        return [n for n, target in self.LAZY.items() if importlib.util.find_spec(target.split(".")[0])]


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cayuga")
def main() -> None:
    """Cayuga for Python: a complex-event-processing engine and server."""


main.add_command(send)  # clients/cli_send.py
main.add_command(subscriptions)  # clients/cli_manage.py
main.add_command(streams)
main.add_command(preview)  # clients/cli_backfill.py


_STREAM_HELP = 'A stream declaration, e.g. "Stock(Name string, Price float, Volume int)". Repeatable.'


@main.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Declare the streams of this configuration file (default: the bundled config.yaml "
                   "when no --stream or --schema is given).")
@click.option("--stream", "streams", multiple=True, help=_STREAM_HELP)
@click.option("--schema", "schema_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="An original Cayuga <StreamType> XML schema file. Repeatable.")
@click.option("--query", "queries", multiple=True, required=True, type=click.Path(exists=True),
              help="A query: AIR (.xml), CEL (.cel) or SASE (.sase), or a directory of them (taken in name "
                   "order). Repeatable; later queries may read earlier outputs.")
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
    from air.engine import EngineError
    from clients.offline import load_streams, run_offline
    from server.config import ConfigError, load_settings

    try:
        settings = load_settings(config_path)
        schemas = load_streams(streams, schema_files)
        if config_path or not schemas:
            schemas = settings.stream_schemas() + schemas
        functions = settings.function_registry()
    except (ModelError, CayugaError, ConfigError) as exc:
        _fail(str(exc))
    out = click.open_file(output, "wb")
    warnings = QueryWarnings()
    try:
        with click.open_file(events_path, "rb") as fh:
            result = run_offline(schemas, list(queries), fh, fmt, include_resub=include_resub,
                                 functions=functions, out=out, freeze=True,
                                 on_warning=lambda path, w: warnings(path, w.to_dict()))
    except (CayugaError, EngineError, ModelError) as exc:
        _fail(str(exc))
    finally:
        if output != "-":
            out.close()
        else:
            out.flush()
    warnings.summary()
    for r in result.rejected:
        click.echo(f"{events_path}:{r.line}: rejected: {r.reason}", err=True)
    click.echo(
        f"cayuga: {plural(result.events, 'event')}, {plural(result.witness_count, 'witness')}, "
        f"{plural(len(result.rejected), 'rejected line')}", err=True)
    sys.exit(1 if result.rejected else 0)


@main.command("compile")
@click.argument("query", type=click.Path(exists=True, dir_okay=False))
@click.option("--stream", "streams", multiple=True, help=_STREAM_HELP)
@click.option("--schema", "schema_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="An original Cayuga <StreamType> XML schema file. Repeatable.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the AIR here instead of standard output.")
def compile_(query, streams, schema_files, output) -> None:
    """Compile a CEL (or, .sase, SASE) query to AIR (one <NFA> per automaton).

    Without --stream or --schema, the streams of the bundled config.yaml are
    declared (Stock), as cayuga run declares them."""
    from air.airxml import dump_air
    from clients.offline import load_streams
    from server.config import ConfigError, load_settings

    try:
        schemas = {s.name: s for s in load_streams(streams, schema_files)
                   or load_settings().stream_schemas()}  # none given: the bundled config's, as cayuga run
        schemas.setdefault("DUAL", StreamSchema("DUAL", ()))
        from air.cel import compile_cel
        from air.sase import compile_sase

        text = Path(query).read_text(encoding="utf-8")
        compile_ = compile_sase if Path(query).suffix.lower() == ".sase" else compile_cel
        compiled = compile_(text, schemas, name_prefix=Path(query).stem)
    except (CayugaError, ModelError, ConfigError) as exc:
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


class _ServeCommand(click.Command):
    """``cayuga serve``, whose help ends with every setting and its variable."""

    def format_epilog(self, ctx, formatter) -> None:
        import os

        import yaml

        from server.config import DEFAULT_CONFIG, ENV_PREFIX, Settings

        try:
            bundled = Settings(**(yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8")) or {}))
        except (OSError, ValueError):  # a broken bundled file: the class's own defaults
            bundled = Settings()
        rows = []
        for name in Settings.model_fields:
            var = f"{ENV_PREFIX}{name.upper()}"
            value = getattr(bundled, name)
            shown = "none" if value in ({}, [], None) else "list in the file" if name == "streams" else str(value)
            here = "" if var not in os.environ else "; set here" if name == "auth_tokens" else \
                f"; set here: {os.environ[var]}"
            rows.append((var, f"{name} (bundled: {shown}{here})"))
        with formatter.section("Settings"):
            formatter.write_text(
                f"Each setting is read from the configuration file (--config; default: the bundled "
                f"{DEFAULT_CONFIG}, whose comments say what each one does), then from its environment "
                "variable (text as it is, e.g. CAYUGA_HOST=::; a list as JSON or [a, b], every item a string: "
                "CAYUGA_AUTH_TOKENS='[\"s3cr3t\", \"0123\"]'; numbers as numbers), then from the flags above. "
                "Client commands (send, watch, register, spark source/sink) find the server by CAYUGA_URL, "
                "or by CAYUGA_HOST and CAYUGA_HTTP_PORT when they run beside it.")
            formatter.write_dl(rows)


@main.command(cls=_ServeCommand)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Configuration file (default: the bundled config.yaml); the settings are listed below.")
@click.option("--host", default=None, help="Address to listen on (CAYUGA_HOST; default 127.0.0.1).")
@click.option("--http-port", type=int, default=None,
              help="REST, WebSocket and console port (CAYUGA_HTTP_PORT; default 8400; 0 picks a free one).")
@click.option("--tcp-port", type=int, default=None,
              help="TCP event port (CAYUGA_TCP_PORT; default 8401; 0 picks a free one).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="The server's state (CAYUGA_DATA_DIR; default ./data): cayuga.sqlite3, the store of declared "
                   "streams and subscriptions; journal/, the write-ahead journal of accepted events; "
                   "witnesses/, the witness log clients resume from; snapshots/, the engine's checkpoints. "
                   "Back it up, move it or delete it as a whole.")
@click.option("--port-file", type=click.Path(dir_okay=False), default=None,
              help='Once the server accepts connections, write {"http_port": N, "tcp_port": N} (JSON) here: '
                   "the ports it bound, e.g. with --http-port 0 --tcp-port 0.")
@click.option("--accept-schema-changes", is_flag=True, default=False,
              help="Start although the configured streams changed the schemas of stored subscriptions since the "
                   "last start (CAYUGA_ACCEPT_SCHEMA_CHANGES): those are recompiled and start afresh. Without it "
                   "such a start exits 2 listing each one.")
def serve(config_path, host, http_port, tcp_port, data_dir, port_file, accept_schema_changes) -> None:
    """Run the Cayuga server until SIGTERM or SIGINT (then drain and exit 0)."""
    from server.config import ConfigError, load_settings

    try:
        settings = load_settings(config_path, host=host, http_port=http_port, tcp_port=tcp_port,
                                 data_dir=data_dir, accept_schema_changes=accept_schema_changes or None)
    except ConfigError as exc:
        _fail(str(exc))
    from server.serve import serve as run_server

    try:
        run_server(settings, port_file=port_file)
    except ConfigError as exc:  # TLS files that cannot be used (server/security/tls.py)
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot start: {exc}")


@main.command("build-engine")
@click.option("--remove", is_flag=True, help="Delete the compiled modules (run plain Python again).")
def build_engine(remove) -> None:
    """Compile the engine's hot modules with Cython (optional; needs
    pip install -e '.[fast]' and a C compiler). Results are identical; only
    speed changes. CAYUGA_ENGINE=python ignores the compiled modules."""
    import warnings

    with warnings.catch_warnings():  # importing the package warns of the stale build this replaces
        warnings.simplefilter("ignore", RuntimeWarning)
        from air.engine import build as engine_build

    if remove:
        for p in engine_build.remove():
            click.echo(f"removed {p}")
        return
    try:
        for p in engine_build.build():
            click.echo(f"built {p}")
    except RuntimeError as exc:
        _fail(str(exc), code=1)


def _queries_in(paths) -> list[tuple[str, dict]]:
    """(where, request item) for each query: a ``.cel`` file is CEL, an
    ``.xml`` file AIR, a ``.sase`` file SASE (all named by their stem), a
    directory stands for its query files in name order, and a ``.jsonl`` file
    holds one query a line: a JSON string (CEL) or an object like the REST body."""
    import json

    from clients.offline import QUERY_FILES, check_language, expand_queries

    out: list[tuple[str, dict]] = []
    for p in expand_queries(paths):
        suffix = p.suffix.lower()
        if suffix == ".jsonl":
            for no, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except ValueError as exc:
                    _fail(f"{p}:{no}: not JSON: {exc}")
                out.append((f"{p}:{no}", {"cel": item} if isinstance(item, str) else item))
        else:
            text = p.read_text(encoding="utf-8")
            try:
                check_language(p, text)  # a suffix of no language, or XML where text goes: what to rename
            except CayugaError as exc:
                _fail(f"{p}: {exc}" + ("" if suffix in QUERY_FILES else "; or a .jsonl file holds one query a line"))
            kind = {".cel": "cel", ".xml": "air", ".sase": "sase"}[suffix]
            out.append((str(p), {kind: text, "name": p.stem}))
    return out


@main.command()
@click.argument("paths", metavar="PATH...", nargs=-1, required=True, type=click.Path(exists=True))
@url_option
@click.option("--token", envvar="CAYUGA_TOKEN", default=None, help="API token (or CAYUGA_TOKEN).")
@click.option("--batch", "batch_size", type=click.IntRange(1, 100_000), default=5000, show_default=True,
              help="Subscriptions per request; each request is registered all or nothing.")
@click.option("--max-instances", type=click.IntRange(1), default=None,
              help="Cap each subscription's live instances: above it, its oldest partial matches are shed "
                   "(down to 90%%) and it is marked inexact.")
@click.option("--max-state-bytes", default=None, metavar="SIZE",
              help="Cap each subscription's state in memory (64MiB, 1GB, 10%% of the server's max_state_bytes).")
@click.option("--from", "from_", default=None, callback=parse_from, metavar="T|retained|-24h",
              help=FROM_HELP + " Each query first runs over that history (its witnesses carry \"replay\": "
                   "true), then joins the live stream; one request per query.")
@click.option("--wait", is_flag=True, help="With --from: return once every backfill is live (a progress bar on "
                                           "standard error); exit status 1 if one failed.")
@tls_options
def register(paths, url, token, batch_size, max_instances, max_state_bytes, from_, wait, cacert, cert, key) -> None:
    """Register the queries of files and directories with a running server,
    many per request (POST /subscriptions/batch), with a progress bar.

    PATH is a query file (.cel CEL, .xml AIR, .sase SASE), a directory of them
    (taken in name order), or a .jsonl file with one query a line (a JSON string
    of CEL, or {"cel"|"air"|"sase": ..., "name": ...}). Prints "<id> <where>" for each
    subscription registered, and on standard error each warning (a NEXT or
    FOLD that keeps automaton instances without a time bound: registered
    all the same) with its file and position. A request with errors registers
    none of its queries: each error is reported with its file (and line) and
    position, and the command stops with exit status 1.

    With --from, each query is first run over the server's retained history
    from then on: cayuga subscriptions shows how far its backfill is, cayuga
    watch ID --from-start prints its witnesses, history first."""
    import httpx
    from tqdm import tqdm

    from clients.client import CayugaAPIError, explain_tls

    if wait and from_ is None:
        _fail("--wait waits for the backfills of --from: give --from too")
    queries = _queries_in(paths)
    if from_ is not None:  # the batch route takes no history: one query per request
        batch_size = 1
    client = make_client(url, token=token, timeout=600, cacert=cacert, cert=cert, key=key)
    done = 0
    backfilling: list[str] = []
    warnings = QueryWarnings(lambda text: tqdm.write(text, file=sys.stderr))
    with tqdm(total=len(queries), unit="q", disable=None, file=sys.stderr) as bar:
        for k in range(0, len(queries), batch_size):
            chunk = queries[k:k + batch_size]
            caps = {k: v for k, v in (("max_instances", max_instances), ("max_state_bytes", max_state_bytes))
                    if v is not None}
            try:
                if from_ is None:
                    subs = client.subscribe_many([{**item, **caps} for _, item in chunk])
                else:
                    subs = [client.subscribe_body({**item, **caps, "from": from_}) for _, item in chunk]
            except CayugaAPIError as exc:
                bar.close()
                if from_refusal(exc):
                    _fail(f"{chunk[0][0]}: {from_refusal(exc)}; registered {done} of "
                          f"{plural(len(queries), 'query')}", 1)
                errors = exc.body.get("errors") if isinstance(exc.body, dict) else None
                for e in errors or [{"detail": str(exc)}]:
                    item = re.match(r"body\.subscriptions\.(\d+)", e.get("where", ""))  # a 422's errors
                    index = e["index"] if "index" in e else int(item.group(1)) if item else None
                    where = chunk[index][0] if index is not None else url
                    click.echo(f"{where}: {e.get('detail') or e.get('message') or e.get('problem') or e}", err=True)
                click.echo(f"cayuga: registered {done} of {plural(len(queries), 'query')}; the request with "
                           f"queries {k + 1}-{k + len(chunk)} was refused", err=True)
                sys.exit(1)
            except (OSError, httpx.HTTPError) as exc:
                _fail(explain_tls(exc, url) or unreachable(url, exc), 1)
            for (where, _), sub in zip(chunk, subs):
                click.echo(f"{sub['id']} {where}")
                if sub.get("backfill"):
                    backfilling.append(sub["id"])
                    b = sub["backfill"]
                    tqdm.write(f"{where}: {sub['id']} runs over the history from t1 = {b.get('from')} first: "
                               f"cayuga subscriptions shows how far, cayuga watch {sub['id']} --from-start "
                               "prints its witnesses", file=sys.stderr)
                for w in sub.get("warnings") or ():
                    warnings(where, w)
            done += len(subs)
            bar.update(len(subs))
    warnings.summary()
    click.echo(f"cayuga: registered {plural(done, 'query')}", err=True)
    if wait and backfilling:
        try:
            failed = wait_live(client, backfilling)
        except (CayugaAPIError, OSError, httpx.HTTPError) as exc:
            _fail(f"registered, but could not follow the backfills: {exc}", 1)
        for words in failed:
            click.echo(f"cayuga: {words}", err=True)
        if failed:
            sys.exit(1)
        click.echo(f"cayuga: {plural(len(backfilling), 'backfill')} live", err=True)


@main.command()
@click.argument("subscription", required=False)
@click.option("--stream", default=None, help="Watch an output stream instead of a subscription.")
@url_option
@click.option("--token", envvar="CAYUGA_TOKEN", default=None, help="API token (or CAYUGA_TOKEN).")
@click.option("--count", type=int, default=None, help="Exit after this many witnesses.")
@click.option("--from", "from_seq", type=click.IntRange(1), default=None, metavar="N",
              help="Start at the subscription's witness number N (its seq): the history from the server's "
                   "witness log, then the live ones. Default: from its newest witness on.")
@click.option("--from-start", is_flag=True,
              help="Start at the subscription's first witness (--from 1). A server keeps a bounded witness "
                   "log: a history it no longer holds ends the command with the seq the log now starts at.")
@click.option("--seq", "show_seq", is_flag=True,
              help="Prefix each line with its witness number and a space: '<seq> {...}' (with --stream, "
                   "'<subscription>:<seq> {...}'); --from takes these numbers.")
@click.option("--retry-for", type=float, default=300.0, show_default=True,
              help="After a disconnect (server restart, crash, network), keep reconnecting this many seconds; "
                   "it resumes after the last witness printed, so none is printed twice or missed.")
@tls_options
def watch(subscription, stream, url, token, count, from_seq, from_start, show_seq, retry_for, cacert, cert,
          key) -> None:
    """Print the witnesses of a subscription (or stream) as JSON lines.

    From the subscription's newest witness on (a stream: from when it is
    connected), or from an earlier one with --from N / --from-start, each
    exactly once: the witnesses carry sequence numbers (printed with --seq),
    and after a disconnect it reconnects by itself and resumes where it was
    (the server's witness log holds what was missed). A final failure is one
    line on standard error and exit status 1."""
    import httpx

    from clients.client import FINAL_CLOSE_CODES, CayugaAPIError, TlsSetupError, WebSocketRefused, explain_tls

    if not subscription and not stream:
        _fail("give a SUBSCRIPTION id or --stream NAME")
    if from_seq is not None and from_start:
        _fail("give --from N or --from-start, not both")
    if stream and (from_seq is not None or from_start):
        _fail("--from and --from-start take a subscription's witness numbers: watch a SUBSCRIPTION id "
              "(GET /streams/NAME names the subscriptions that publish the stream)")
    if count is not None and count <= 0:
        return
    after = None
    if subscription and (from_start or from_seq is not None):
        after = {subscription: 0 if from_start else from_seq - 1}
    client = make_client(url, token=token, cacert=cacert, cert=cert, key=key)
    out = sys.stdout.buffer
    n = 0
    replay = ReplayMarker(lambda: make_client(url, token=token, cacert=cacert, cert=cert, key=key), subscription)

    told = ""

    def retrying(reason: str, delay: float) -> None:  # each new reason once, not every retry of it
        nonlocal told
        if reason != told:
            told = reason
            click.echo(f"cayuga: {reason}; reconnecting (for up to {retry_for:g} s, --retry-for)", err=True)

    def notice(message: dict) -> None:  # e.g. the subscription lost partial matches: said, never printed as one
        click.echo(f"cayuga: {message.get('message') or json.dumps(message)}", err=True)

    try:
        for sid, first, block, k in client.follow_frames(subscription, stream=stream, after=after,
                                                         batch=WATCH_BATCH, retry_for=retry_for,
                                                         on_retry=retrying, on_notice=notice):
            # a run's bytes go out as they came (no decoding); only a line count cuts them (--count)
            if count is not None and n + k >= count:
                k = count - n
                block = b"\n".join(block.split(b"\n", k)[:k])
            replay.block(first, block)
            if show_seq:
                tag = b"" if subscription else sid.encode() + b":"
                block = b"\n".join(b"%s%d %s" % (tag, first + i, w) for i, w in enumerate(block.split(b"\n")))
            out.write(block)
            out.write(b"\n")
            out.flush()  # a reader down a pipe sees each message as it comes
            n += k
            if count is not None and n >= count:
                break
    except CayugaAPIError as exc:
        if isinstance(exc, WebSocketRefused):  # e.g. a WebSocket cap (503): retried for --retry-for
            _fail(f"gave up after {retry_for:g} s of retries: the server refused the WebSocket: {exc.detail}", 1)
        words = refusal(exc, url, subscription=subscription, stream=stream)
        _fail(words if exc.status in FINAL_CLOSE_CODES or exc.status < 500
              else f"gave up after {retry_for:g} s of retries: {words}", 1)
    except KeyboardInterrupt:
        pass
    except TlsSetupError as exc:  # a TLS failure no retry mends (an unknown CA, a wrong name)
        _fail(str(exc), 1)
    except (OSError, httpx.TransportError) as exc:  # the WebSocket, or the REST call for last_seq
        _fail(f"gave up after {retry_for:g} s of retries: " + (explain_tls(exc, url) or unreachable(url, exc)), 1)
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        _fail(f"{type(exc).__name__}: {exc}", 1)
    finally:
        with contextlib.suppress(OSError):
            out.flush()
        replay.close()
        client.close()


#: Witnesses per WebSocket message that ``cayuga watch`` asks for.
WATCH_BATCH = 1000


def _add_optional_groups() -> None:
    """The Spark command group (``clients/spark_cli.py``); Spark itself is
    imported only when a command runs."""
    from clients.spark_cli import spark

    main.add_command(spark)


_add_optional_groups()


if __name__ == "__main__":  # pragma: no cover
    main()
