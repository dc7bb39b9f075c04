"""TLS for both ports: the server's context, its reload, and a TLS accept for the TCP port.

With ``tls_certfile`` (and ``tls_keyfile``, unless the key is in the certificate
file) the HTTP port (REST, WebSockets, console) and the TCP event port speak
TLS only (TLS 1.2 or later); with ``tls_client_ca`` too, every client must
present a certificate signed by one of those CAs (mutual TLS). A client that
speaks plain text to a TLS port is told so in plain text -- an HTTP 400 on the
HTTP port, an ``error:`` line on the TCP port -- and the connection is closed;
nothing it sent is read as a request or an event.

:class:`ServerTls` holds the context every new connection is accepted with.
:meth:`ServerTls.reload` (``cayuga serve`` runs it on SIGHUP) builds a new one
from the same files and swaps it in: connections accepted from then on get the
new certificate (and client CAs); open connections keep the session they
have, and nothing they carry is lost. A reload that fails (a missing file, a
key that does not match) keeps the old context and says why in the log.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import time
from pathlib import Path

from server.config import ConfigError
from server.observability.counters import Count, Counters

log = logging.getLogger("cayuga.tls")

#: The first byte of every TLS connection (a handshake record); anything else is plain text.
HANDSHAKE_RECORD = 0x16
#: Seconds between checks of a stop flag while a TCP connection's handshake waits.
POLL = 0.25


class TlsError(ConfigError):
    """The certificate, its key or the client CAs cannot be used; the message says which and what to do."""


def _explain(exc: Exception, what: str, setting: str) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"{setting} {exc.filename}: no such file"
    if isinstance(exc, PermissionError):
        return f"{setting} {exc.filename}: the server may not read it (permissions)"
    reason = getattr(exc, "reason", None)
    if reason == "KEY_VALUES_MISMATCH":
        return "the private key in tls_keyfile does not belong to the certificate in tls_certfile"
    if reason == "NO_CERTIFICATE_OR_CRL_FOUND":
        return f"{setting} holds no PEM certificate"
    return f"cannot read {what} ({exc}): {setting} must be PEM (-----BEGIN ...-----), the key unencrypted"


def build_context(certfile: str | Path, keyfile: str | Path | None = None,
                  client_ca: str | Path | None = None) -> ssl.SSLContext:
    """A server context: this certificate (chain) and key; with ``client_ca``, clients must
    present a certificate signed by one of its CAs. Raises :class:`TlsError`."""
    for setting, path in (("tls_certfile", certfile), ("tls_keyfile", keyfile), ("tls_client_ca", client_ca)):
        if path and not Path(path).is_file():
            raise TlsError(f"TLS: {setting} {path}: no such file; give a PEM certificate (chain) in tls_certfile, "
                           "its private key in tls_keyfile and, for mutual TLS, the clients' CAs in tls_client_ca "
                           "(CAYUGA_TLS_CERTFILE, CAYUGA_TLS_KEYFILE, CAYUGA_TLS_CLIENT_CA)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)  # a client that just closes: an end, not an error
    # No TLS 1.3 session tickets: they come after the handshake, and a client that reads on one
    # thread while it writes on another (TcpSender, websockets' sync client) could lose a write
    # to OpenSSL handling one (1 connection's events in 60 were lost so); nothing here resumes sessions.
    ctx.num_tickets = 0
    ctx.options |= ssl.OP_NO_TICKET
    try:
        ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile else None)
    except (OSError, ssl.SSLError) as exc:
        setting = "tls_keyfile" if keyfile and getattr(exc, "filename", None) == str(keyfile) else "tls_certfile"
        raise TlsError(f"TLS: {_explain(exc, 'the certificate and its key', setting)}; give a PEM certificate "
                       "(chain) in tls_certfile and its private key in tls_keyfile (CAYUGA_TLS_CERTFILE, "
                       "CAYUGA_TLS_KEYFILE)") from None
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=str(client_ca))
        except (OSError, ssl.SSLError) as exc:
            raise TlsError(f"TLS: {_explain(exc, 'the client CAs', 'tls_client_ca')}; give the PEM "
                           "certificates of the CAs that sign client certificates (CAYUGA_TLS_CLIENT_CA)") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def not_after(certfile: str | Path) -> float | None:
    """When the (first) certificate in ``certfile`` expires, as a Unix time; None if unknown."""
    try:
        decoded = ssl._ssl._test_decode_cert(str(certfile))  # the standard library's own decoder
        return float(ssl.cert_time_to_seconds(decoded["notAfter"]))
    except Exception:  # noqa: BLE001 - only a figure for /metrics and a warning
        return None


class ServerTls:
    """The context new connections are accepted with, reloadable from its files."""

    def __init__(self, certfile: str | Path, keyfile: str | Path | None = None,
                 client_ca: str | Path | None = None, counters: Counters | None = None) -> None:
        self.certfile, self.keyfile, self.client_ca = certfile, keyfile, client_ca
        self.counters = counters
        self.context = build_context(certfile, keyfile, client_ca)
        self.expires = not_after(certfile)
        self.loaded_at = time.time()
        self._lock = threading.Lock()
        self._warn_expiry()

    @classmethod
    def from_settings(cls, settings, counters: Counters | None = None) -> "ServerTls | None":
        if settings.tls_certfile is None:
            return None
        return cls(settings.tls_certfile, settings.tls_keyfile, settings.tls_client_ca, counters)

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def _warn_expiry(self) -> None:
        if self.expires is not None and self.expires < time.time():
            log.warning("TLS: the certificate in %s expired at %s: clients refuse it; renew it and send the "
                        "server SIGHUP", self.certfile, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.expires)))

    def reload(self) -> str | None:
        """Load the files again and use them for new connections; the error, or None."""
        with self._lock:
            try:
                ctx = build_context(self.certfile, self.keyfile, self.client_ca)
            except TlsError as exc:
                if self.counters is not None:
                    self.counters.add(Count.TLS_RELOADS_FAILED)
                log.error("%s; still serving the certificate loaded before", exc)
                return str(exc)
            self.context = ctx
            self.expires = not_after(self.certfile)
            self.loaded_at = time.time()
        if self.counters is not None:
            self.counters.add(Count.TLS_RELOADS)
        log.info("TLS: reloaded %s: new connections get it, open ones keep theirs", self.certfile)
        self._warn_expiry()
        return None


class PlainText(Exception):
    """A client spoke plain text to a TLS port."""


def accept_tls(conn: socket.socket, ctx: ssl.SSLContext, deadline: float,
               stop: threading.Event | None = None) -> ssl.SSLSocket | None:
    """The TLS side of an accepted TCP connection, its handshake done by
    ``deadline`` (monotonic); None when the client left first. Raises
    :class:`PlainText` when its first byte is not a TLS handshake (nothing
    is read: the caller may still answer in plain text), ``TimeoutError``
    past the deadline or on ``stop``, ``ssl.SSLError`` when the handshake
    fails (a client that does not trust the certificate, no client
    certificate where one is required)."""
    conn.setblocking(False)
    first = _wait_for(conn, lambda: conn.recv(1, socket.MSG_PEEK), select.POLLIN, deadline, stop)
    if not first:
        return None
    if first[0] != HANDSHAKE_RECORD:
        raise PlainText()
    tls = ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)  # conn is detached: tls owns it
    try:
        _wait_for(tls, tls.do_handshake, select.POLLIN, deadline, stop)
    except ssl.SSLError:
        close_gently(tls, min(LINGER_SECONDS, max(deadline - time.monotonic(), 0.0)))
        raise
    except BaseException:
        tls.close()
        raise
    tls.settimeout(POLL)
    return tls


#: Seconds a connection whose handshake failed is still read (and what comes discarded) before it is
#: closed: closed at once, with the client's first line unread, the kernel resets it, and the client
#: may never read the alert that says why (e.g. "certificate required").
LINGER_SECONDS = 1.0


def close_gently(sock: socket.socket, seconds: float) -> None:
    """End the connection after what was written (the alert), reading until the client closes too."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)
        end = time.monotonic() + seconds
        p = select.poll()
        p.register(sock, select.POLLIN)
        while (left := end - time.monotonic()) > 0 and p.poll(left * 1000):
            if not socket.socket.recv(sock, 65536):
                break
    except OSError:
        pass
    finally:
        sock.close()


def _wait_for(sock, step, events: int, deadline: float, stop: threading.Event | None):
    """Run ``step`` until it neither blocks nor wants I/O, waiting for ``sock`` between tries."""
    while True:
        try:
            return step()
        except ssl.SSLWantWriteError:
            events = select.POLLOUT
        except (ssl.SSLWantReadError, BlockingIOError):
            events = select.POLLIN
        left = deadline - time.monotonic()
        if left <= 0 or (stop is not None and stop.is_set()):
            raise TimeoutError("the TLS handshake did not finish in time")
        p = select.poll()  # not select(): descriptors beyond 1024 (see server/ingest/tcp.py)
        p.register(sock, events)
        p.poll(min(left, POLL) * 1000)


def read_more(sock: ssl.SSLSocket, first: bytes, limit: int) -> bytes:
    """``first`` (what one ``recv`` gave: a TLS record, at most 16 KiB) and
    whatever more the connection has without waiting, up to ``limit``
    bytes: the receiver decodes and queues one block per read, and a block
    of one record each would cost a read, a journal record and a queue hand-over
    per 16 KiB."""
    parts, n = [first], len(first)
    sock.setblocking(False)
    try:
        while n < limit:
            try:
                more = sock.recv(limit - n)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                break
            if not more:
                break
            parts.append(more)
            n += len(more)
    finally:
        sock.settimeout(POLL)
    return b"".join(parts) if len(parts) > 1 else first


def write_nowait(sock: socket.socket, data: bytes) -> int:
    """Write what the socket takes now (plain: one ``write``; TLS: one whole record or nothing);
    the bytes written. A TLS write that must wait is retried with the same bytes (OpenSSL's rule)."""
    if not isinstance(sock, ssl.SSLSocket):
        import os

        try:
            return os.write(sock.fileno(), data)
        except (BlockingIOError, InterruptedError):
            return 0
    sock.setblocking(False)
    try:
        return sock.send(data)
    except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
        return 0
    finally:
        sock.settimeout(POLL)


def force_shutdown(sock: socket.socket) -> None:
    """Shut a connection down under the thread reading it (plain or TLS: the
    TLS layer is left alone, its reader sees the end of the stream)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class TlsCollector:
    """``cayuga_tls_certificate_expiry_timestamp_seconds``: when the certificate last loaded expires."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        gauge = GaugeMetricFamily("cayuga_tls_certificate_expiry_timestamp_seconds", "When the server's "
                                  "certificate (tls_certfile, as last loaded: SIGHUP reloads it) expires, as a "
                                  "Unix time")
        if self.tls.expires is not None:
            gauge.add_metric([], self.tls.expires)
        yield gauge
