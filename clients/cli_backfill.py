"""Backtest, then go live (issue 36) at the command line: ``cayuga preview``
runs a query over the server's retained history without registering it, and
the words the other commands use for a backfill: ``--from`` of ``cayuga
register`` (:func:`parse_from`, :func:`from_refusal`), the BACKFILL column of
``cayuga subscriptions`` (:func:`backfill_words`) and the line ``cayuga
watch`` writes on standard error when the replayed witnesses end
(:class:`ReplayMarker`). Registered on the ``cayuga`` group by clients/cli.py."""

from __future__ import annotations

import json
import re
import sys
import threading

import click

from clients.options import make_client, tls_options, url_option
from clients.words import plural, unreachable

FROM_HELP = ('Where in the retained history to start: an event time (in the units of the events\' t1), '
             '"retained" for all the server keeps, or a duration back from the newest event: -24h, -90m, -30s, -2d.')

_DURATION = re.compile(r"^-\d+(\.\d+)?[smhd]$")


def parse_from(ctx, param, value):
    """A ``--from`` as the API takes it: a number stays a number, ``retained`` and
    ``-24h`` stay text; anything else is a usage error that shows the forms."""
    if value is None:
        return None
    text = value.strip()
    if text == "retained" or _DURATION.match(text):
        return text
    try:
        number = float(text)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a time: give an event time (e.g. 33000000), 'retained', or "
                                 "a duration back from the newest event such as -24h, -90m, -30s or -2d",
                                 ctx=ctx, param=param) from None
    return int(number) if number.is_integer() else number


def from_refusal(exc) -> str | None:
    """The words for a ``from`` the server refused (400 with ``retained``): the
    range it holds and the option that takes all of it; None for other refusals."""
    body = exc.body if isinstance(exc.body, dict) else {}
    held = body.get("retained")
    if exc.status != 400 or not isinstance(held, dict):
        return None
    if f"from {held.get('from')} to {held.get('to')}" in exc.detail:  # the server's words say the range
        return exc.detail.replace("use a later from", "use a later --from").replace(" or 'retained'",
                                                                                  " or --from retained")
    return (f"{exc.detail} (the server retains events from {held.get('from')} to {held.get('to')}); "
            "--from retained starts at the oldest of them")


def backfill_words(b: dict | None) -> str:
    """A subscription's backfill in one cell: '-' without one, else its state,
    how far it is and its witnesses: 'running 45% (450/1000 events, 3 witnesses)'."""
    if not b:
        return "-"
    done, total, found = b.get("events_done", 0), b.get("events_total"), b.get("witnesses", 0)
    if b.get("state") == "failed":
        return f"failed: {b.get('error') or 'no reason given'}"
    if b.get("state") == "live":
        return f"live ({plural(found, 'witness')} replayed from t1 = {b.get('from')})"
    share = f"{100 * done // total}% " if total else ""
    of = f"{done}/{total}" if total is not None else str(done)
    return f"{b.get('state', 'running')} {share}({of} events, {plural(found, 'witness')})"


def wait_live(client, sids: list[str], poll: float = 0.2) -> list[str]:
    """Wait until the backfill of each of ``sids`` is live (a progress bar on standard
    error over their history's events); returns the words of those that failed."""
    import time

    from tqdm import tqdm

    failed: list[str] = []
    with tqdm(unit="ev", disable=None, file=sys.stderr, desc="backfill") as bar:
        for sid in sids:
            while True:
                b = client.subscription(sid).get("backfill") or {"state": "live"}
                if b.get("events_total"):
                    bar.total = b["events_total"]
                bar.n = b.get("events_done", 0)
                bar.refresh()
                if b["state"] == "failed":
                    failed.append(f"{sid}'s backfill failed: {b.get('error')}")
                    break
                if b["state"] == "live":
                    break
                time.sleep(poll)
    return failed


class ReplayMarker:
    """Says on standard error, once, where a subscription's replayed witnesses
    (``"replay": true``, its backfill's) end and the live ones begin: when a
    live witness follows replayed ones, or when the server says the backfill is
    live (polled while it runs). Standard output stays the witness JSON. Watching a
    stream (``sid`` None) it says nothing: the witnesses carry their mark."""

    MARKS = (b'"replay":true', b'"replay": true')

    def __init__(self, client_factory, sid: str | None, poll: float = 1.0) -> None:
        self.sid = sid
        self.replayed = 0
        self.done = False
        #: a run without a replayed witness came first: what follows it is live (a subscription's
        #: history is numbered before its live witnesses), and no run is searched for the marks again
        #: (a scan of every run of a watch of a million witnesses for two strings: a tenth of its CPU)
        self.live_first = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if sid is not None:
            self._thread = threading.Thread(target=self._watch_state, args=(client_factory, poll),
                                            name="cayuga-watch-backfill", daemon=True)
            self._thread.start()

    def block(self, first: int, block: bytes) -> None:
        """A run of witness lines numbered from ``first``, as printed."""
        if self.done or self.live_first or self.sid is None:  # (a stream's witnesses: several subscriptions' numbers)
            return
        if not any(m in block for m in self.MARKS):
            if self.replayed:
                self._end(first - 1)
            else:  # (whether there was a history is the backfill's state to say: _watch_state)
                self.live_first = True
            return
        for i, line in enumerate(block.split(b"\n")):
            if any(m in line for m in self.MARKS):
                self.replayed += 1
            else:
                self._end(first + i - 1)
                return

    def _end(self, last: int) -> None:
        """The last replayed witness is #``last``: say so, once."""
        with self._lock:
            if self.done:
                return
            self.done = True
        history = f"witnesses #1-#{last} were history" if last else "no witness was history"
        click.echo(f'cayuga: replay ended: {history} ("replay": true); those after are live', err=True)

    def _watch_state(self, client_factory, poll: float) -> None:
        first = True
        try:
            with client_factory() as client:
                while not self.done:
                    b = client.subscription(self.sid).get("backfill")
                    if not b:
                        return
                    if b.get("state") == "failed":
                        click.echo(f"cayuga: {self.sid}'s backfill failed: {b.get('error')}", err=True)
                        return
                    if b.get("state") == "live":
                        if not first or self.replayed:  # it went live while watched
                            self._end(b.get("witnesses", 0))
                        return
                    first = False
                    if self._stop.wait(poll):
                        return
        except Exception:  # noqa: BLE001 - the marker is a courtesy: the witnesses go on without it
            return

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def _query_of(query: str, language: str | None) -> tuple[str, dict]:
    """(where, body) for QUERY: a file (.cel, .sase, .xml) or the query's text."""
    from pathlib import Path

    p = Path(query)
    if len(query) < 4096 and "\n" not in query and p.is_file():
        kind = language or {".sase": "sase", ".xml": "air"}.get(p.suffix.lower(), "cel")
        return str(p), {kind: p.read_text(encoding="utf-8")}
    text = query
    kind = language or ("air" if text.lstrip().startswith("<") else "cel")
    return "query", {kind: text}


def _print_errors(where: str, errors: list[dict]) -> None:
    from air.errors import render

    for e in errors:
        click.echo(f"{where}: " + render(e.get("message", ""), e.get("line", 0), e.get("column", 0),
                                         e.get("excerpt", "")), err=True)


@click.command()
@click.argument("query")
@click.option("--from", "from_", default="-1h", show_default=True, callback=parse_from, help=FROM_HELP)
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Print at most this many witnesses (the count covers them all).")
@click.option("--language", type=click.Choice(["cel", "sase", "air"]), default=None,
              help="The query's language (default: from the file's suffix; text is CEL unless it is XML).")
@url_option
@click.option("--token", envvar="CAYUGA_TOKEN", default=None, help="API token (or CAYUGA_TOKEN).")
@tls_options
def preview(query, from_, limit, language, url, token, cacert, cert, key) -> None:
    """Run QUERY (a .cel/.sase/.xml file, or the query's text) over the events
    the server retains from --from on, without registering it.

    Prints its first --limit witnesses as JSON lines on standard output and, on
    standard error, how many it found over which range: 'cayuga: 12
    witnesses over 3600 events (t1 = T0 to T1)'. Errors in the query are
    reported with line, column and caret; a --from before the retained history
    with the range the server holds. Exit status 1 on either."""
    import httpx

    from clients.client import CayugaAPIError, explain_tls

    where, body = _query_of(query, language)
    try:
        with make_client(url, token=token, cacert=cacert, cert=cert, key=key, timeout=600) as client:
            r = client.preview(body, from_, limit)
    except CayugaAPIError as exc:
        errors = exc.body.get("errors") if isinstance(exc.body, dict) else None
        if errors:
            _print_errors(where, errors)
            click.echo(f"cayuga: {where} has {plural(len(errors), 'error')}: nothing was run", err=True)
        else:
            click.echo(f"cayuga: {from_refusal(exc) or exc.detail}", err=True)
        sys.exit(1)
    except (OSError, httpx.HTTPError) as exc:
        click.echo(f"cayuga: {explain_tls(exc, url) or unreachable(url, exc)}", err=True)
        sys.exit(1)
    out = sys.stdout
    for w in r["witnesses"]:
        out.write(json.dumps(w, separators=(",", ":")) + "\n")
    out.flush()
    shown = f"; the first {len(r['witnesses'])} printed (--limit)" if r.get("truncated") else ""
    click.echo(f"cayuga: {plural(r['count'], 'witness')} over {plural(r.get('events', 0), 'event')} "
               f"(t1 = {r.get('from')} to {r.get('to')}){shown}", err=True)
