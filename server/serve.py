"""Running the daemon behind uvicorn, with a graceful stop.

On SIGTERM or SIGINT the server first drains (receivers stop, the queue is
processed, WebSocket clients get what is buffered for them; ``/health``
answers 503 "draining" meanwhile) and only then lets uvicorn close the HTTP
side, waiting at most HTTP_CLOSE_SECONDS for connections still open. A second
signal stops at once.

HTTP connections are limited below uvicorn (:mod:`server.api.httpguard`), and the
process's descriptor limit is checked at start (:func:`ensure_descriptors`).

With ``tls_certfile`` set, both ports speak TLS (:mod:`server.api.tlsguard` on
the HTTP port, server/ingest/tcp.py on the TCP port); SIGHUP reloads the
certificate, its key and the client CAs from their files for new connections
(:meth:`CayugaServer.reload_tls`), without closing any open one.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import resource
import signal
import socket
import sys
import threading
import time

import uvicorn

from air.engine import BUILD as ENGINE_BUILD
from air.engine.memory import raise_young_threshold
from server.api.httpguard import GuardedHttpToolsProtocol, GuardedWebSocketProtocol, HttpGuard
from server.api.tlsguard import TlsFirst, TlsGate
from server.app import create_app
from server.config import Settings, port_clash, port_refusal
from server.daemon import Daemon
from server.observability import redact

log = logging.getLogger("cayuga.serve")

#: WebSocket compression (permessage-deflate) is off: compressing every message
#: held the server's event loop so long that watchers of a fast replay fell more
#: than ``client_buffer`` witnesses behind and were cut; witnesses go to clients
#: on a local network, where it saves little (BENCHMARKS.md, "Round 5
#: (2026-11-26): the server path", "What changed, each measured").
WS_DEFLATE = False

#: The GIL switch interval of a ``cayuga serve`` process (Python's default is
#: 5 ms). The receiver threads, the engine thread and the event loop share one
#: GIL; with 20 ms fewer forced hand-overs between the two busy threads leave
#: more for the work: replays ran faster than at 5 ms or at 50 ms, and latency
#: was no worse (BENCHMARKS.md, "Round 5 (2026-11-26): the server path", "What
#: changed, each measured").
GIL_SWITCH_INTERVAL = 0.02

#: Once drained, seconds uvicorn waits for HTTP connections to close before it
#: cancels what still runs and exits: a WebSocket client that never reads its
#: close frame kept a drained server running for as long as it stayed connected.
HTTP_CLOSE_SECONDS = 3.0

#: Descriptors the server needs besides its connections: the listening sockets,
#: the SQLite store (database, WAL, shared memory), journal and witness-log
#: segments, snapshot files, the event loop's own, standard streams, imports.
RESERVED_FDS = 128
#: Descriptors one HTTP connection may hold: its socket.
FDS_PER_HTTP_CONNECTION = 1
#: Descriptors one WebSocket may hold: its socket and, for a client catching up from
#: the witness log, the segment it reads.
FDS_PER_WEBSOCKET = 2


def freeze_startup_objects() -> int:
    """Move everything alive after start-up (the imported modules, the app,
    the daemon and what it restored: hundreds of thousands of objects that
    live as long as the process) out of the cyclic garbage collector's reach
    (``gc.freeze``). A full collection walked all of them: 55-77 ms with
    every thread of the server stopped, once every few seconds at 100K
    events/s, in the latency's p99 (BENCHMARKS.md, "Round 8 (2026-11-27):
    latency"). No collection first: it took 70-200 ms and found a few dozen
    objects. Objects made later are collected as before; :meth:`Daemon.stop`
    unfreezes. Returns how many objects are frozen."""
    gc.freeze()
    return gc.get_freeze_count()


class DescriptorLimit(OSError):
    """The process may not open as many files as the settings allow connections."""


def descriptors_needed(settings: Settings) -> int:
    return (settings.max_http_connections * FDS_PER_HTTP_CONNECTION + settings.max_websockets * FDS_PER_WEBSOCKET
            + settings.max_connections + RESERVED_FDS)


def ensure_descriptors(settings: Settings) -> int:
    """Make the soft RLIMIT_NOFILE hold :func:`descriptors_needed`: raise it up
    to the hard limit when it is lower, or raise :class:`DescriptorLimit`
    when even the hard limit is. Returns the soft limit in force."""
    need = descriptors_needed(settings)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard != resource.RLIM_INFINITY and hard < need:
        raise DescriptorLimit(
            f"the process may open {hard} files (ulimit -n, hard limit) but the settings need {need}: "
            f"max_http_connections ({settings.max_http_connections}) + 2 x max_websockets "
            f"({settings.max_websockets}) + max_connections ({settings.max_connections}) + {RESERVED_FDS} for "
            f"the server's own files; lower max_http_connections, max_websockets or max_connections, or raise "
            f"the limit (ulimit -Hn, LimitNOFILE= in a systemd unit, --ulimit nofile= for docker run)")
    target = hard if hard != resource.RLIM_INFINITY else need
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    log.info("raised the open-file limit from %d to %d (the settings need %d)", soft, target, need)
    return target


def uvicorn_config(app, settings: Settings, counters, access_log: bool = True, tls=None) -> uvicorn.Config:
    """uvicorn's settings for ``app``, with the guarded HTTP protocol; with ``tls``
    (server/security/tls.py: ServerTls), under TLS (``config.tls_gate``: the connections
    in their handshake)."""
    guard = HttpGuard(settings.max_http_connections, settings.http_header_timeout, settings.http_body_timeout,
                      counters, max_websockets=settings.max_websockets,
                      max_websockets_per_address=settings.max_websockets_per_address)
    http = functools.partial(GuardedHttpToolsProtocol, guard=guard)
    gate = None
    if tls is not None:
        gate = TlsGate(tls, settings.max_http_connections, settings.http_header_timeout, counters)
        http = functools.partial(TlsFirst, inner=http, gate=gate)
    config = uvicorn.Config(app, log_level=settings.log_level, lifespan="on",
                            ws=functools.partial(GuardedWebSocketProtocol, guard=guard),
                            access_log=access_log, ws_per_message_deflate=WS_DEFLATE, http=http,
                            timeout_graceful_shutdown=HTTP_CLOSE_SECONDS)
    config.tls_gate = gate
    redact.install()  # after the Config: it configures uvicorn's loggers
    return config


class CayugaServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, daemon: Daemon, draining: threading.Event) -> None:
        super().__init__(config)
        self.daemon = daemon
        self.draining = draining  # the app's (app.state.draining): /health reads it
        self._draining = False
        self._drained = threading.Event()
        self.announced = threading.Event()  # up, and its ports written where a second server or a caller reads them

    #: Where to write the bound ports once connections are accepted (``cayuga serve --port-file``).
    port_file: str | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)  # the lifespan started the daemon: its TCP receiver is bound
        if not self.should_exit:
            freeze_startup_objects()
        if not self.should_exit and sockets:  # for a second server's message (server/durability/datadir.py)
            self.daemon.lock.note_ports(sockets[0].getsockname()[1], self.daemon.receiver.port)
        if self.port_file and not self.should_exit and sockets:
            _write_port_file(self.port_file, sockets[0].getsockname()[1], self.daemon.receiver.port)
        self.announced.set()

    # uvicorn records handled signals and raises them again after shutting down
    # (so the process dies "by the signal"); a drained Cayuga exits with 0, so
    # the flags are set directly instead of through Server.handle_exit.
    def handle_exit(self, sig, frame) -> None:  # called by uvicorn's signal handlers
        if self._draining:
            self.should_exit = True  # a second signal: stop now
            self.force_exit = True
            return
        self._draining = True
        self.draining.set()
        log.info("shutting down: draining events and notifications (at most %.0f s)",
                 self.daemon.settings.shutdown_timeout)
        threading.Thread(target=self._drain_then_exit, args=(sig,), name="cayuga-drain", daemon=True).start()

    def _drain_then_exit(self, sig) -> None:
        try:
            self.daemon.drain(self.daemon.settings.shutdown_timeout)
        finally:
            self._drained.set()
            self.should_exit = True

    def request_shutdown(self) -> None:
        self.handle_exit(signal.SIGTERM, None)

    async def shutdown(self, sockets=None) -> None:
        gate = getattr(self.config, "tls_gate", None)
        if gate is not None:
            gate.abort_all()  # connections still in their TLS handshake: uvicorn does not know them yet
        await super().shutdown(sockets)

    def reload_tls(self) -> str | None:
        """Load the TLS certificate, key and client CAs again for new connections (SIGHUP);
        the error (the old ones stay in use), or None. Nothing to do without TLS."""
        tls = self.daemon.security.tls
        if tls is None:
            log.info("SIGHUP: the server has no tls_certfile; nothing to reload")
            return None
        error = tls.reload()
        receiver = self.daemon.receiver
        if error is None and receiver is not None and receiver.readers is not None:
            receiver.readers.reload_tls()  # the reader process's TLS connections: the same files
        return error


def _write_port_file(path: str, http_port: int, tcp_port: int) -> None:
    """The bound ports as JSON, written whole (a reader never sees half a file)."""
    import json

    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"http_port": http_port, "tcp_port": tcp_port}, f)
    os.replace(tmp, path)


def bind_http(host: str, port: int) -> socket.socket:
    """The HTTP listening socket, bound and inheritable, for uvicorn to serve on."""
    # IPPROTO_TCP, not the default 0: asyncio turns Nagle off (TCP_NODELAY) only on
    # accepted sockets whose proto says TCP. With proto 0 every keep-alive HTTP
    # response waited for the client's delayed ACK: 44 ms a request instead of 0.5 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def bind_ports(daemon: Daemon, settings: Settings) -> socket.socket:
    """Bind both ports before anything starts; the HTTP port's socket. A port that
    cannot be bound is a ConfigError naming it, the setting that chose it and how to
    choose another (server/config.py: port_refusal), not a failure of uvicorn's start-up;
    so is one port named for both (port_clash)."""
    clash = port_clash(settings)
    if clash is not None:
        raise clash
    try:
        sock = bind_http(settings.host, settings.http_port)
    except OSError as exc:
        raise port_refusal(exc, settings, "http_port") from None
    try:
        daemon.bind_tcp()
    except OSError as exc:
        sock.close()
        raise port_refusal(exc, settings, "tcp_port") from None
    return sock


class RunningServer:
    """A server started in a background thread (tests, embedding); ``cayuga
    serve`` uses :func:`serve` in the main thread instead."""

    def __init__(self, settings: Settings) -> None:
        ensure_descriptors(settings)
        self.settings = settings
        self.daemon = Daemon(settings)
        try:
            self.app = create_app(settings, self.daemon)
            self._sock = bind_ports(self.daemon, settings)
        except BaseException:
            self.daemon.stop()  # not started: releases the data directory
            raise
        config = uvicorn_config(self.app, settings, self.daemon.counters, access_log=False,
                                tls=self.daemon.security.tls)
        self.server = CayugaServer(config, self.daemon, self.app.state.draining)
        self._thread = threading.Thread(target=self._run, name="cayuga-http", daemon=True)

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self._sock])
        finally:
            self.daemon.stop()

    def start(self, timeout: float = 20.0, wait_ready: bool = True) -> "RunningServer":
        """Start, and return once the server answers and (with ``wait_ready``)
        every stored subscription is restored."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not (self.server.started and self.server.announced.is_set()):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        if wait_ready and not self.daemon.ready.wait(max(deadline - time.monotonic(), 0.0)):
            done, total = self.daemon.restored, self.daemon.restore_total
            self.stop()
            raise RuntimeError(f"the server did not finish restoring its subscriptions within {timeout} s "
                               f"({done} of {total})")
        return self

    @property
    def http_port(self) -> int:
        return self._sock.getsockname()[1]

    @property
    def tcp_port(self) -> int:
        return self.daemon.receiver.port

    @property
    def base_url(self) -> str:
        scheme = "https" if self.daemon.security.tls is not None else "http"
        return f"{scheme}://{self.settings.host}:{self.http_port}"

    def reload_tls(self) -> str | None:
        """What SIGHUP does to ``cayuga serve``: :meth:`CayugaServer.reload_tls`."""
        return self.server.reload_tls()

    def stop(self, timeout: float | None = None) -> None:
        timeout = timeout if timeout is not None else self.settings.shutdown_timeout + 5
        if self._thread.is_alive():
            self.server.request_shutdown()
            self._thread.join(timeout)
        self._sock.close()
        if self._thread.is_alive():
            raise RuntimeError("the server did not stop in time")

    def __enter__(self) -> "RunningServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(settings: Settings, port_file: str | None = None) -> None:
    """Run in the foreground until SIGTERM/SIGINT; returns after a clean stop.
    With ``port_file``, the bound ports are written there once connections are
    accepted (``cayuga serve --port-file``)."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    raise_young_threshold()  # (air/engine/memory.py: GC_YOUNG_THRESHOLD, as cayuga run feeds)
    ensure_descriptors(settings)
    daemon = Daemon(settings)  # takes the data directory's lock, or refuses to start (DataDirInUse)
    try:
        app = create_app(settings, daemon)
        sock = bind_ports(daemon, settings)
    except BaseException:
        daemon.stop()
        raise
    tls = daemon.security.tls
    server = CayugaServer(uvicorn_config(app, settings, daemon.counters, tls=tls), daemon, app.state.draining)
    log.info("Cayuga: HTTP on %s://%s:%d (docs at /docs), events on %s://%s:%d, %s engine%s",
             "https" if tls else "http", settings.host, sock.getsockname()[1], "tls" if tls else "tcp",
             settings.host, settings.tcp_port, ENGINE_BUILD,
             f"; TLS with {tls.certfile}" + (f", client certificates from {tls.client_ca}" if tls.mutual else "")
             + " (SIGHUP reloads them)" if tls else "")
    if not daemon.security.enabled and settings.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("listening on %s without auth_tokens: anyone who reaches the ports may register, delete and "
                    "read every subscription and send events; set auth_tokens (and tls_certfile)", settings.host)
    elif tls is None and settings.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("listening on %s without TLS: tokens and events cross the network in clear text; set "
                    "tls_certfile and tls_keyfile", settings.host)
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=server.reload_tls, name="cayuga-tls-reload",
                                                             daemon=True).start())
    if ENGINE_BUILD == "python" and os.environ.get("CAYUGA_ENGINE", "").lower() != "python":
        log.warning("the compiled engine is not built (installed without a C compiler?): the pure-Python engine "
                    "runs, 1.2-3x slower; install gcc and the Python headers, then run `cayuga build-engine`")
    server.port_file = port_file
    try:
        server.run(sockets=[sock])
    finally:
        daemon.stop()
        sock.close()
