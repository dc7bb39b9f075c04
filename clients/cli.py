"""The ``cayuga`` command line."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path

import click

from air.errors import CayugaError
from air.model import ModelError, StreamSchema
from clients.options import url_option
from clients.words import QueryWarnings, plural


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
    """Compile a CEL (or, .sase, SASE) query to AIR (one <NFA> per automaton)."""
    from air.airxml import dump_air
    from clients.offline import load_streams

    try:
        schemas = {s.name: s for s in load_streams(streams, schema_files)}
        schemas.setdefault("DUAL", StreamSchema("DUAL", ()))
        from air.cel import compile_cel
        from air.sase import compile_sase

        text = Path(query).read_text(encoding="utf-8")
        compile_ = compile_sase if Path(query).suffix.lower() == ".sase" else compile_cel
        compiled = compile_(text, schemas, name_prefix=Path(query).stem)
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
def serve(config_path, host, http_port, tcp_port, data_dir, port_file) -> None:
    """Run the Cayuga server until SIGTERM or SIGINT (then drain and exit 0)."""
    from server.config import ConfigError, load_settings

    try:
        settings = load_settings(config_path, host=host, http_port=http_port, tcp_port=tcp_port,
                                 data_dir=data_dir)
    except ConfigError as exc:
        _fail(str(exc))
    from server.serve import serve as run_server

    try:
        run_server(settings, port_file=port_file)
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


#: Unacknowledged bytes ``cayuga send`` lets out before it waits for acknowledgements.
SEND_WINDOW = 32 << 20
#: Seconds one connection may go without an acknowledgement (or an answer to
#: ``#sender``) before ``cayuga send`` drops it and reconnects (a dead network path).
ACK_STALL_SECONDS = 60.0
#: The least time ``cayuga send`` gives a server it is connected to for an
#: answer or an acknowledgement, however small ``--retry-for`` is.
MIN_PATIENCE = 5.0


def _default_sender_id(path: str, data: bytes) -> str:
    """``send-<hash>``: the same file (absolute path and content) gets the
    same id; the content counts, so a file rewritten in place, or another
    stream on standard input, is a new sender rather than one the server has
    "already" had."""
    import hashlib

    where = "-" if path == "-" else str(Path(path).resolve())
    content = hashlib.blake2b(data, digest_size=16).hexdigest()
    return "send-" + hashlib.sha256(f"{where}\0{len(data)}\0{content}".encode()).hexdigest()[:24]


class _Lost(Exception):
    """The connection was lost, refused, or made no progress: reconnect and
    resume, while ``--retry-for`` allows."""


class _Stalled(_Lost):
    """The server took no line while this connection waited ``seconds``: cayuga
    send's own finding, not the server's word."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


class _Progress:
    """How far ``cayuga send`` has got: the lines the server has acknowledged
    (or said it had, ``#resume``), the furthest line sent, and since when no
    line was acknowledged. It bounds every wait: a wait on a connected server
    ends once nothing has moved for ``--retry-for`` seconds (MIN_PATIENCE at
    least) or one connection has had no acknowledgement for
    ACK_STALL_SECONDS; a failure gives up once nothing has moved for
    ``--retry-for`` seconds. Reconnecting is not progress: a server that
    takes the connection and then refuses or ignores every line ends it too."""

    def __init__(self, retry_for: float) -> None:
        self.retry_for = retry_for
        self.acked = 0
        self.sent = 0
        self.since = self.attempt_at = time.monotonic()

    def acknowledged(self, n: int) -> bool:
        """Note the server's count; whether it is progress."""
        if n <= self.acked:
            return False
        self.acked, self.since = n, time.monotonic()
        return True

    def sending(self, upto: int) -> None:
        if self.acked >= self.sent:  # nothing was outstanding: the time since was --rate's pacing, not the server's
            self.since = time.monotonic()
        self.sent = max(self.sent, upto)

    def attempt(self) -> None:
        """A new connection is being made."""
        self.attempt_at = time.monotonic()

    def idle(self) -> float:
        """Seconds without progress (or, on this connection, without an acknowledgement)."""
        return time.monotonic() - max(self.since, self.attempt_at)

    def exhausted(self) -> bool:
        return time.monotonic() - self.since >= self.retry_for

    def patience(self) -> float:
        """Seconds the next wait on the server may last (<= 0: none)."""
        now = time.monotonic()
        return min(self.since + max(self.retry_for, MIN_PATIENCE),
                   max(self.since, self.attempt_at) + ACK_STALL_SECONDS) - now


#: A refusal no retry can mend: a wrong token, a bad ``#from``, a malformed ``#sender``.
_FINAL = re.compile(r"error(?: line \d+)?: (?:authentication required|#from |a second #sender|sender id )")
#: Another connection holds the sender id.
_TAKEN = re.compile(r"error: sender \S+ is already connected")
#: The server cannot journal: its disk is full (retry; it answers again once there is room).
_DISK_FULL = "error: disk full"


def _explain(problem: str, sender_id: str) -> tuple[str, str]:
    """(what went wrong, what to do about it: '' when the words say it)."""
    if _TAKEN.match(problem):
        return (f"another connection with sender id {sender_id} is still open (the server refuses a second one)",
                "wait until it ends (is another cayuga send of this file running?) and run this again, "
                "or give --sender-id another id to send the file as a new sender")
    if problem.startswith(_DISK_FULL):
        return (f"the server's disk is full: {problem[len(_DISK_FULL):].lstrip(': ')}",
                "free space on the server and run this again (it resumes)")
    return problem, ""


@main.command()
@click.argument("events_path", metavar="FILE", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@url_option
@click.option("--port", "tcp_port", type=int, default=None,
              help="The server's TCP event port (default: asked from the server's /health).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "cayuga", "csv"]), default="jsonl", show_default=True,
              help="Format of FILE: JSON lines, the original Cayuga lines, or CSV with a header line.")
@click.option("--rate", type=float, default=None, help="Events per second (default: as fast as possible).")
@click.option("--token", envvar="CAYUGA_TOKEN", default=None,
              help="API token (or CAYUGA_TOKEN); sent as the connection's first line '#token <token>'.")
@click.option("--sender-id", default=None,
              help="The id the server tracks this file's progress by (#sender); default: derived from "
                   "the file's absolute path and content, so sending the same file again resumes it (or, "
                   "when the server has it all, sends nothing), and a changed file is sent as new.")
@click.option("--retry-for", type=click.FloatRange(0), default=60.0, show_default=True,
              help="Seconds to keep trying while no line gets acknowledged: reconnecting with exponential "
                   "backoff (0.1 s doubling to 5 s, each wait drawn between half and all of it) when the "
                   "connection is lost or refused (the server restarts, another connection holds the sender "
                   "id, its disk is full), and waiting for a "
                   f"server that takes no line (a connected server gets at least {MIN_PATIENCE:g} s). Each "
                   "reconnection resumes where the server's journal stands. Then exit 1 with the reason.")
def send(events_path, url, tcp_port, fmt, rate, token, sender_id, retry_for) -> None:
    """Send an event file to a running server's TCP port, with a progress bar.

    Every line is delivered exactly once: the connection names a sender
    (#sender) and asks for acknowledgements (#ack); the server answers with
    the lines of that sender it already has (#resume N) and cayuga send goes
    on from line N+1 (nothing at all when it has every line). When the
    connection is lost (the server restarts, the network fails), it
    reconnects and resumes, for as long as --retry-for allows without
    progress. Every wait is bounded by --retry-for: it never hangs.

    Exit status 0 when every line is acknowledged and none was rejected; 1
    when some was (each reported with its file line number), when the server
    refused for good (a wrong token), when the server has more lines of this
    sender id than the file, or when --retry-for ran out (the server
    unreachable, another connection holding the sender id, a full disk, a
    server that takes no line); 130 when interrupted."""
    from tqdm import tqdm

    from clients.client import Backoff, CayugaClient, SenderRefused, TcpSender
    from server.ingest.protocol import SENDER_ID

    with click.open_file(events_path, "rb") as fh:
        data = fh.read()
    total = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    sender_id = sender_id or _default_sender_id(events_path, data)
    if not SENDER_ID.fullmatch(sender_id):
        _fail(f"--sender-id {sender_id!r}: 1-128 characters of A-Z a-z 0-9 . _ : -")
    if total == 0:
        click.echo(f"cayuga: nothing to send: {events_path} is empty", err=True)
        return
    client = CayugaClient(url, token=token, tcp_port=tcp_port)
    errors: dict[int, str] = {}  # by file line: a line resent after a reconnection may be reported twice
    other: list[str] = []
    progress = _Progress(retry_for)
    had = None  # lines the server had when this run began (#resume of its first connection)
    backoff = Backoff()
    failing = False  # a failure since the last progress (told once, with the retry)
    said = ""  # the server's last refusal since the last progress ("error: disk full: ...")
    start = time.monotonic()
    address = None
    bar = tqdm(total=total, unit="ev", unit_scale=True, disable=None)

    def say(message: str) -> None:
        tqdm.write(f"cayuga: {message}", file=sys.stderr)

    def stop(message: str, code: int) -> None:
        bar.close()
        click.echo(f"cayuga: {message}", err=True)
        sys.exit(code)

    try:
        while True:
            sender = None
            try:
                progress.attempt()
                try:
                    if address is None:
                        client.http.timeout = max(min(progress.patience(), 30.0), 0.1)
                        address = client.tcp_address()
                    sender = TcpSender(*address, fmt=fmt, token=token, sender_id=sender_id, ack=True,
                                       timeout=max(progress.patience(), 0.1))
                except SenderRefused as exc:
                    raise _Lost(exc.answer) from None
                except Exception as exc:  # noqa: BLE001 - refused, reset, timed out, an HTTP error: all mean retry
                    raise _Lost(f"cannot reach the server at {url}: {exc}") from None
                resume = sender.resume
                if resume > total:
                    sender.abort()
                    stop(f"the server already has {plural(resume, 'line')} from sender id {sender_id}, more than the "
                         f"{plural(total, 'line')} of {events_path}: that id was used to send another file (or this one "
                         "before it was changed); give --sender-id an id of its own for this file", 1)
                if had is None:
                    had = resume
                    if 0 < resume < total:
                        say(f"the server already has lines 1-{resume} of {events_path} (sender id {sender_id}); "
                            f"sending lines {resume + 1}-{total}")
                elif failing:
                    say(f"reconnected; the server has {resume} of {plural(total, 'line')}, going on from line {resume + 1}"
                        if resume < total else f"reconnected; the server has all {plural(total, 'line')}")
                if progress.acknowledged(resume):
                    failing, said = False, ""
                    backoff.reset()
                if resume == total:  # nothing to send: no line would bring an #ack
                    sender.close(timeout=1.0)
                    if progress.sent == 0:
                        stop(f"nothing new to send: the server already has all {plural(total, 'line')} of {events_path} "
                             f"(sender id {sender_id})", 0)
                    break
                first = resume
                if fmt == "csv" and resume:  # the header line must come again: resend, the server drops what it has
                    first = 0
                    sender.send_from(0)
                _send_acked(sender, data, first, total, rate, start, bar, progress)
                _await_acks(sender, total, progress)
                _collect(sender.close(timeout=max(progress.patience(), 1.0)), errors, other)
                break
            except (_Lost, OSError) as exc:
                if sender is not None:
                    _collect(sender.abort(), errors, other)
                    if progress.acknowledged(sender.acked):
                        failing, said = False, ""
                        backoff.reset()
                problem = ((_last_error(sender) if sender is not None else "")
                           or (str(exc) if isinstance(exc, _Lost) else f"the connection was lost: {exc}"))
                if problem.startswith("error"):  # the server's own words
                    said = problem
                elif isinstance(exc, _Stalled) and exc.seconds < MIN_PATIENCE and said:
                    # the time ran out on a connection made just before: that is no finding about the
                    # server; its last reply since the last progress is why nothing got through
                    problem = said
                if _FINAL.match(problem) and not _TAKEN.match(problem):
                    stop(f"{problem}; {progress.acked} of {plural(total, 'line')} acknowledged", 1)
                what, todo = _explain(problem, sender_id)
                gave_up = (f"gave up after {retry_for:g} s of retries: {what}" + (f": {todo}" if todo else "")
                           + f"; {progress.acked} of {plural(total, 'line')} acknowledged")
                if progress.exhausted():
                    stop(gave_up, 1)
                if not failing:
                    failing = True
                    say(f"{what}; retrying for up to {retry_for:g} s (--retry-for)")
                time.sleep(min(backoff.next(), max(retry_for - (time.monotonic() - progress.since), 0)))
                if progress.exhausted():  # no time left for another connection: this is why
                    stop(gave_up, 1)
                address = address if tcp_port else None  # the server may come back on another port
    except KeyboardInterrupt:
        stop(f"interrupted; {progress.acked} of {plural(total, 'line')} acknowledged", 130)
    finally:
        client.close()
    bar.close()
    for line in sorted(errors):
        click.echo(f"{events_path}: {errors[line]}", err=True)
    for e in other:
        click.echo(f"{events_path}: {e}", err=True)
    click.echo(f"cayuga: sent {plural(total - had, 'line')}, {len(errors)} rejected, {progress.acked} acknowledged", err=True)
    sys.exit(1 if errors else 0)


def _send_acked(sender, data: bytes, first: int, total: int, rate, start: float, bar, progress: _Progress) -> int:
    """Send ``data`` from its line ``first + 1`` on, keeping at most
    SEND_WINDOW bytes unacknowledged; returns the line reached (``total``).
    Raises :class:`_Lost` when the server stops acknowledging or reading
    for longer than ``progress`` allows."""
    from collections import deque

    pos = _offset_of_line(data, first)
    line = first
    marks: deque[tuple[int, int]] = deque()  # (line reached, byte offset) at the end of each block not acked
    acked_pos = pos
    bar.n = first
    bar.refresh()
    for block, n in _send_blocks(data[pos:], rate):
        if rate:
            delay = start + (line + n) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        while True:
            while marks and marks[0][0] <= sender.acked:
                acked_pos = marks.popleft()[1]
            if not marks or pos - acked_pos <= SEND_WINDOW:
                break
            _await_acks(sender, marks[0][0], progress)
        if sender.ended:  # the server closed the connection (its disk is full, it is stopping): send no more
            raise _Lost(_last_error(sender) or "the server closed the connection")
        progress.sending(line + n)
        sender.set_timeout(progress.patience())
        try:
            sender.send_lines(block, n)
        except TimeoutError:  # the server stopped reading: TCP flow control holds the rest
            raise _stalled(progress) from None
        progress.acknowledged(sender.acked)
        pos += len(block)
        line += n
        marks.append((line, pos))
        bar.update(n)
    return line


def _await_acks(sender, n: int, progress: _Progress) -> None:
    """Wait until the server has acknowledged ``n`` lines, as long as
    ``progress`` allows; :class:`_Lost` if it does not."""
    while sender.acked < n and not sender.ended:
        left = progress.patience()
        if left <= 0:
            raise _stalled(progress)
        progress.acknowledged(sender.wait_for_ack(n, left))
    if sender.acked < n:
        raise _Lost(_last_error(sender) or "the server closed the connection before acknowledging every line")


def _stalled(progress: _Progress) -> _Stalled:
    idle = progress.idle()
    return _Stalled(f"the server has taken no line for {idle:.0f} s (overloaded, shutting down, "
                    "or its journal stuck?)", idle)


def _offset_of_line(data: bytes, k: int) -> int:
    """Byte offset of line ``k + 1`` (after ``k`` lines)."""
    pos = 0
    for _ in range(k):
        nl = data.find(b"\n", pos)
        if nl < 0:
            return len(data)
        pos = nl + 1
    return pos


def _last_error(sender) -> str:
    """The last ``error: ...`` line the server sent before it closed the connection, if any."""
    said = [e for e in sender.errors if e.startswith("error:")]
    return said[-1] if said else ""


def _collect(lines: list[str], errors: dict[int, str], other: list[str]) -> None:
    for e in lines:
        m = re.match(r"error line (\d+):", e)
        if m:
            errors[int(m.group(1))] = e
        elif e not in other and not e.startswith("error:"):
            other.append(e)
    lines.clear()


def _send_blocks(data: bytes, rate: float | None, size: int = 1 << 18):
    """``(block, lines)`` pieces of ``data`` that end at line ends: about
    ``size`` bytes each, or about a hundredth of a second's worth at ``rate``."""
    per = max(int(rate / 100), 1) if rate else None
    pos = 0
    while pos < len(data):
        if per is None:
            end = data.find(b"\n", min(pos + size, len(data)) - 1)
        else:
            end = pos - 1
            for _ in range(per):
                end = data.find(b"\n", end + 1)
                if end < 0:
                    break
        end = len(data) if end < 0 else end + 1
        block = data[pos:end]
        lines = block.count(b"\n")
        if not block.endswith(b"\n"):
            block += b"\n"
            lines += 1
        yield block, lines
        pos = end


def _queries_in(paths) -> list[tuple[str, dict]]:
    """(where, request item) for each query: a ``.cel`` file is CEL, an
    ``.xml`` file AIR, a ``.sase`` file SASE (all named by their stem), a
    directory stands for its query files in name order, and a ``.jsonl`` file
    holds one query a line: a JSON string (CEL) or an object like the REST body."""
    import json

    from clients.offline import expand_queries

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
        elif suffix in (".cel", ".xml", ".sase"):
            kind = {".cel": "cel", ".xml": "air", ".sase": "sase"}[suffix]
            out.append((str(p), {kind: p.read_text(encoding="utf-8"), "name": p.stem}))
        else:
            _fail(f"{p}: not a query file (.cel, .xml, .sase, or .jsonl with one query a line)")
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
def register(paths, url, token, batch_size, max_instances, max_state_bytes) -> None:
    """Register the queries of files and directories with a running server,
    many per request (POST /subscriptions/batch), with a progress bar.

    PATH is a query file (.cel CEL, .xml AIR, .sase SASE), a directory of them
    (taken in name order), or a .jsonl file with one query a line (a JSON string
    of CEL, or {"cel"|"air"|"sase": ..., "name": ...}). Prints "<id> <where>" for each
    subscription registered, and on standard error each warning (a NEXT or
    FOLD that keeps automaton instances without a time bound: registered
    all the same) with its file and position. A request with errors registers
    none of its queries: each error is reported with its file (and line) and
    position, and the command stops with exit status 1."""
    import httpx
    from tqdm import tqdm

    from clients.client import CayugaAPIError, CayugaClient

    queries = _queries_in(paths)
    client = CayugaClient(url, token=token, timeout=600)
    done = 0
    warnings = QueryWarnings(lambda text: tqdm.write(text, file=sys.stderr))
    with tqdm(total=len(queries), unit="q", disable=None, file=sys.stderr) as bar:
        for k in range(0, len(queries), batch_size):
            chunk = queries[k:k + batch_size]
            caps = {k: v for k, v in (("max_instances", max_instances), ("max_state_bytes", max_state_bytes))
                    if v is not None}
            try:
                subs = client.subscribe_many([{**item, **caps} for _, item in chunk])
            except CayugaAPIError as exc:
                bar.close()
                errors = exc.body.get("errors") if isinstance(exc.body, dict) else None
                for e in errors or [{"detail": str(exc)}]:
                    where = chunk[e["index"]][0] if "index" in e else url
                    click.echo(f"{where}: {e.get('detail') or e.get('message') or e.get('msg') or e}", err=True)
                click.echo(f"cayuga: registered {done} of {plural(len(queries), 'query')}; the request with "
                           f"queries {k + 1}-{k + len(chunk)} was refused", err=True)
                sys.exit(1)
            except (OSError, httpx.HTTPError) as exc:
                _fail(f"cannot reach the server at {url}: {exc}")
            for (where, _), sub in zip(chunk, subs):
                click.echo(f"{sub['id']} {where}")
                for w in sub.get("warnings") or ():
                    warnings(where, w)
            done += len(subs)
            bar.update(len(subs))
    warnings.summary()
    click.echo(f"cayuga: registered {plural(done, 'query')}", err=True)


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
def watch(subscription, stream, url, token, count, from_seq, from_start, show_seq, retry_for) -> None:
    """Print the witnesses of a subscription (or stream) as JSON lines.

    From the subscription's newest witness on (a stream: from when it is
    connected), or from an earlier one with --from N / --from-start, each
    exactly once: the witnesses carry sequence numbers (printed with --seq),
    and after a disconnect it reconnects by itself and resumes where it was
    (the server's witness log holds what was missed). A final failure is one
    line on standard error and exit status 1."""
    import httpx

    from clients.client import CayugaAPIError, CayugaClient, WebSocketRefused

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
    client = CayugaClient(url, token=token)
    out = sys.stdout.buffer
    n = 0

    def retrying(reason: str, delay: float) -> None:
        click.echo(f"cayuga: {reason}; reconnecting in {delay:.1f} s", err=True)

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
            _fail(f"gave up after {retry_for:g} s of retries: the server refused the WebSocket: {exc}", 1)
        _fail(f"the server closed the connection: {exc}", 1)
    except KeyboardInterrupt:
        pass
    except (OSError, httpx.TransportError) as exc:  # the WebSocket, or the REST call for last_seq
        _fail(f"gave up after {retry_for:g} s of retries: cannot reach the server at {url}: {exc}", 1)
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        _fail(f"{type(exc).__name__}: {exc}", 1)
    finally:
        with contextlib.suppress(OSError):
            out.flush()
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
