"""TLS for the clients: the context a client connects with, what a TLS failure
means in words, and the alert a server sent before it closed.

An ``https://`` URL speaks TLS on the server's three ways in (REST, WebSockets,
the TCP port: one certificate covers both of its ports); ``--cacert`` names the
CA that signed the server's certificate when the system does not trust it,
``--cert``/``--key`` this client's certificate for a server with tls_client_ca."""

from __future__ import annotations

import ssl


class TlsSetupError(ValueError):
    """A client's TLS files (--cacert, --cert, --key) cannot be used; the message says which and why."""


def tls_context(cacert: str | None = None, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    """A client's TLS context: the server's certificate checked against ``cacert``
    (PEM; else the CAs the system trusts) and its name; with ``cert`` (and
    ``key``, unless it is in the same file), this client's certificate for
    mutual TLS. Raises :class:`TlsSetupError`."""
    try:
        ctx = ssl.create_default_context(cafile=cacert)
    except FileNotFoundError:
        raise TlsSetupError(f"--cacert {cacert}: no such file") from None
    except (OSError, ssl.SSLError) as exc:
        raise TlsSetupError(f"--cacert {cacert}: not a PEM CA certificate ({exc})") from None
    ctx.options |= getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)  # a server that just closes: an end, not an error
    if key and not cert:
        raise TlsSetupError("--key needs --cert: the client certificate the key belongs to")
    if cert:
        try:
            ctx.load_cert_chain(cert, key)
        except FileNotFoundError as exc:
            raise TlsSetupError(f"--cert/--key: {exc.filename}: no such file") from None
        except (OSError, ssl.SSLError) as exc:
            raise TlsSetupError(f"--cert {cert}" + (f" --key {key}" if key else "") + f": cannot use them ({exc}): "
                                "give a PEM certificate and its unencrypted private key") from None
    return ctx


def explain_tls(exc: BaseException | None, url: str) -> str | None:
    """What a failed TLS connection to ``url`` means and what to do; None when ``exc`` is not a TLS failure."""
    texts = []
    while exc is not None and len(texts) < 10:
        texts.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    text = " | ".join(texts)
    if "SSL" not in text and "certificate" not in text.lower():
        return None
    if "certificate has expired" in text:
        return f"the server's certificate has expired ({url}): renew it on the server, then send it SIGHUP"
    if "Hostname mismatch" in text or "IP address mismatch" in text:
        return (f"the server's certificate is not issued for the host in {url}: connect by a name or address its "
                "certificate lists, or issue it for this one")
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (f"the server's certificate ({url}) is not signed by a CA this client trusts: give --cacert (or "
                "CAYUGA_CACERT) with the CA that signed it")
    if "CERTIFICATE_REQUIRED" in text or "certificate required" in text:
        return (f"the server ({url}) wants a client certificate (its tls_client_ca is set): give --cert and --key "
                "(or CAYUGA_CERT and CAYUGA_KEY) with one its CA signed")
    if "UNKNOWN_CA" in text or "unknown ca" in text or "BAD_CERTIFICATE" in text:
        return (f"the server ({url}) refused this client's certificate: its tls_client_ca did not sign it; give "
                "--cert/--key with one it did")
    if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text or "record layer failure" in text:
        return f"the server does not speak TLS ({url}): use an http:// URL"
    if "SSLZeroReturnError" in text or "SSLEOFError" in text:
        return (f"the server ({url}) ended the TLS session before answering: if it wants client certificates "
                "(its tls_client_ca is set), give --cert and --key with one its CA signed")
    return f"TLS with {url} failed: {texts[0]}"


def alert_of(sock: ssl.SSLSocket, failure: ssl.SSLError) -> ssl.SSLError:
    """The TLS alert the server sent before it closed (a write can fail before it is read), else ``failure``."""
    try:
        sock.settimeout(1.0)
        sock.recv(1)
    except ssl.SSLError as exc:
        if exc.reason and "ALERT" in exc.reason:
            return exc
    except OSError:
        pass
    return failure
