"""``cayuga subscriptions`` (list, show, delete) and ``cayuga streams``: what a
running server holds, from the command line (GET /subscriptions,
/subscriptions/{id}, DELETE /subscriptions/{id}, GET /streams), and
:func:`refusal`, the words every client command gives a refusal of the
server's in (``cayuga watch`` too). Registered on the ``cayuga`` group by
clients/cli.py."""

from __future__ import annotations

import json
import re
import sys
import time

import click

from clients.options import make_client, tls_options, url_option
from clients.words import plural, unreachable


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"cayuga: {message}", err=True)
    sys.exit(code)


def refusal(exc, url: str, *, subscription: str | None = None, stream: str | None = None) -> str:
    """A refusal of the server's (:class:`clients.client.CayugaAPIError`: an HTTP
    status or a WebSocket close code) as one line that says what to do next, in
    the commands' terms (``cayuga subscriptions`` where the API would say
    GET /subscriptions), without the code."""
    status, detail = exc.status, exc.detail
    if status in (404, 4404) and stream is not None:
        return f"no stream {stream!r} on {url}: cayuga streams lists them"
    if status in (404, 4404) and subscription is not None:
        return f"no subscription {subscription!r} on {url}: cayuga subscriptions lists them"
    if status in (401, 4401):
        return (f"the server at {url} wants a token (none was given, or it is not one of the server's "
                "auth_tokens): give --token, or set CAYUGA_TOKEN")
    if status == 409 and subscription is not None and isinstance(exc.body, dict) and exc.body.get("readers"):
        readers = exc.body["readers"]
        them = "it" if len(readers) == 1 else "them"
        return (f"{subscription} is not deleted: {', '.join(readers)} read{'s' if len(readers) == 1 else ''} its "
                f"outputs; delete {them} first, or give --cascade to delete {them} too")
    if status == 4410:  # from N is no longer retained: the log of s7 starts at M
        start = re.search(r"starts at (\d+)", detail)
        return detail + (f"; --from {start.group(1)} starts there" if start else "")
    if status == 4416:  # from N is beyond the end of s1: its last witness is L; from=L+1 waits for the next
        return detail.replace("from=", "--from ")
    return detail


def _client(url, token, cacert, cert, key):
    return make_client(url, token=token, cacert=cacert, cert=cert, key=key)


def _calling(url: str, call, **about):
    """``call()``, its failures as one line and exit status 1."""
    import httpx

    from clients.client import CayugaAPIError, explain_tls

    try:
        return call()
    except CayugaAPIError as exc:
        _fail(refusal(exc, url, **about))
    except (OSError, httpx.HTTPError) as exc:
        _fail(explain_tls(exc, url) or unreachable(url, exc))


def _columns(rows: list[tuple[str, ...]]) -> None:
    """Rows as columns as wide as their widest cell (the last one left as it is)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        click.echo("  ".join([c.ljust(w) for c, w in zip(r, widths)] + [r[-1]]).rstrip())


def _exactness(s: dict) -> str:
    lost = s.get("inexact") or {}
    if s.get("exact", True):
        return "exact"
    return (f"inexact since witness {lost.get('since_seq', '?')} ({plural(lost.get('instances_lost', 0), 'partial match')}"
            " shed)")


#: Subscriptions asked for per request by ``cayuga subscriptions list``.
PAGE = 5000

_JSON_HELP = "Print the server's JSON (one object a line) instead of a table."


def _connection(f):
    """--url, --token and the TLS options of every command here."""
    f = tls_options(f)
    f = click.option("--token", default=None, help="API token (default: CAYUGA_TOKEN).")(f)
    return url_option(f)


@click.group(invoke_without_command=True)
@_connection
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
@click.pass_context
def subscriptions(ctx, url, token, cacert, cert, key, as_json) -> None:
    """The server's subscriptions: list them (the default), show one, delete some.

    The options given here (--url, --token, ...) hold for the command after
    them too: cayuga subscriptions --url URL show s1."""
    import os

    shared = {"url": url, "token": token or os.environ.get("CAYUGA_TOKEN"), "cacert": cacert, "cert": cert,
              "key": key}
    ctx.default_map = {name: shared for name in ("list", "show", "delete")}
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_, **shared, as_json=as_json)


@subscriptions.command("list")
@_connection
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
def list_(url, token, cacert, cert, key, as_json) -> None:
    """List the subscriptions in registration order: id, name, language,
    output streams, live instances (partial matches), exact or not, and,
    when some were registered with --from, how far each one's backfill is."""
    from clients.cli_backfill import backfill_words

    with _client(url, token, cacert, cert, key) as client:
        rows = [("ID", "NAME", "LANGUAGE", "OUTPUTS", "INSTANCES", "EXACT")]
        backfills: list[str] = []
        offset = 0
        while True:
            page = _calling(url, lambda: client.subscriptions(offset, PAGE))
            for s in page:
                if as_json:
                    click.echo(json.dumps(s, separators=(",", ":")))
                else:
                    rows.append((s["id"], s.get("name") or "-", s["kind"], ", ".join(s["outputs"]) or "-",
                                 str(s["instances"]), _exactness(s)))
                    backfills.append(backfill_words(s.get("backfill")))
            offset += len(page)
            if len(page) < PAGE:
                break
    if not as_json and len(rows) > 1:
        if any(b != "-" for b in backfills):  # a column only where a subscription ran over history
            rows = [(*r, b) for r, b in zip(rows, ["BACKFILL", *backfills])]
        _columns(rows)
    if offset == 0:
        click.echo(f"cayuga: the server at {url} has no subscriptions: cayuga register QUERY.cel adds one",
                   err=True)


@subscriptions.command()
@click.argument("sid", metavar="ID")
@_connection
@click.option("--json", "as_json", is_flag=True, help="Print the server's JSON, the AIR included.")
def show(sid, url, token, cacert, cert, key, as_json) -> None:
    """Show one subscription: what it publishes, its state, how many
    witnesses it has had, its backfill if it has one, and its query."""
    from clients.cli_backfill import backfill_words

    with _client(url, token, cacert, cert, key) as client:
        s = _calling(url, lambda: client.subscription(sid), subscription=sid)
    if as_json:
        click.echo(json.dumps(s, indent=2))
        return
    created = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(s["created"])) if s.get("created") else "-"
    _columns([
        ("id", s["id"]), ("name", s.get("name") or "-"), ("language", s["kind"]),
        ("outputs", ", ".join(s["outputs"]) or "-"), ("registered", created),
        ("instances", f"{s['instances']} (live partial matches)"),
        ("witnesses", f"{s.get('last_seq', 0)} so far (cayuga watch {s['id']} --from-start prints them)"),
        ("exact", "yes" if s.get("exact", True) else _exactness(s)), ("runs on", s.get("runs_on", "-")),
        *((("backfill", backfill_words(s["backfill"])),) if s.get("backfill") else ()),
        *((("limits", ", ".join(f"{k} {v}" for k, v in s["limits"].items())),) if s.get("limits") else ()),
    ])
    click.echo("query:")
    click.echo("".join(f"  {line}\n" for line in s["text"].splitlines()), nl=False)


@subscriptions.command()
@click.argument("sids", metavar="ID...", nargs=-1, required=True)
@_connection
@click.option("--cascade", is_flag=True,
              help="Also delete the subscriptions that read its outputs (and theirs); without it, deleting one "
                   "that others read is refused, naming them.")
def delete(sids, url, token, cacert, cert, key, cascade) -> None:
    """Delete subscriptions: they stop, and their watchers are told."""
    with _client(url, token, cacert, cert, key) as client:
        for sid in sids:
            _calling(url, lambda: client.unsubscribe(sid, cascade=cascade), subscription=sid)
            click.echo(f"deleted {sid}")


@click.command()
@_connection
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
def streams(url, token, cacert, cert, key, as_json) -> None:
    """List the server's streams: those declared (events come in on them) and
    those subscriptions publish, each with its attributes."""
    import os

    with _client(url, token or os.environ.get("CAYUGA_TOKEN"), cacert, cert, key) as client:
        found = _calling(url, client.streams)
    if as_json:
        for s in found:
            click.echo(json.dumps(s, separators=(",", ":")))
        return
    rows = [("NAME", "KIND", "ATTRIBUTES")]
    rows += [(s["name"], s["kind"], ", ".join(f"{a} {t}" for a, t in s["schema"].items()) or "-") for s in found]
    if len(rows) > 1:
        _columns(rows)
    else:
        click.echo(f"cayuga: the server at {url} has no streams: POST /streams declares one", err=True)
