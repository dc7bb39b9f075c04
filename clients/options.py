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


CACERT_HELP = ("The CA certificate (PEM) that signed the server's certificate, for an https:// URL when the "
               "system does not trust it (CAYUGA_CACERT). TLS covers the TCP event port too.")
CERT_HELP = "This client's certificate (PEM), for a server that wants one: mutual TLS (CAYUGA_CERT)."
KEY_HELP = "The private key (PEM) of --cert, unless it is in the same file (CAYUGA_KEY)."


def tls_options(f):
    """``--cacert``, ``--cert``, ``--key``: TLS for an ``https://`` URL (:func:`clients.client.tls_context`)."""
    path = click.Path(exists=True, dir_okay=False)
    f = click.option("--key", envvar="CAYUGA_KEY", type=path, default=None, help=KEY_HELP)(f)
    f = click.option("--cert", envvar="CAYUGA_CERT", type=path, default=None, help=CERT_HELP)(f)
    return click.option("--cacert", envvar="CAYUGA_CACERT", type=path, default=None, help=CACERT_HELP)(f)


def make_client(url: str, *, cacert=None, cert=None, key=None, **kw):
    """A :class:`clients.client.CayugaClient` for a command, its TLS files checked: a usage error
    (exit 2) that says which file and why when they cannot be used."""
    from clients.client import CayugaClient, TlsSetupError

    if (cacert or cert) and not url.startswith("https://"):
        raise click.UsageError(f"--cacert/--cert are for TLS: the URL {url} is not https:// (a server with "
                               "tls_certfile set is reached at https://HOST:PORT)")
    try:
        return CayugaClient(url, cacert=cacert, cert=cert, key=key, **kw)
    except TlsSetupError as exc:
        raise click.UsageError(str(exc)) from None
