"""Options every client command shares (``cayuga send/register/watch``, ``cayuga spark source/sink``)."""

from __future__ import annotations

import click

URL_HELP = ("Base URL of the server's HTTP API. Default: $CAYUGA_URL; else, beside the server, "
            "http://$CAYUGA_HOST:$CAYUGA_HTTP_PORT (its own settings); else http://127.0.0.1:8400.")


def _resolve_url(ctx, param, value):
    from clients.client import default_url

    if value:
        return value.rstrip("/")
    try:
        return default_url()
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def url_option(f):
    """``--url``, resolved from the environment when not given (:func:`clients.client.default_url`)."""
    return click.option("--url", default=None, callback=_resolve_url, help=URL_HELP)(f)
