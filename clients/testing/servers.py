"""Cayuga servers for tests, on free loopback ports with a data directory of
the test's own: :func:`running_server` runs one inside this process (threads
named ``cayuga-*``; its :class:`~server.serve.RunningServer` gives the daemon
and the bound ports), :class:`ServerProcess` runs ``cayuga serve`` as a child
process that a test can kill with SIGKILL and start again on the same ports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:  # the server is imported only when a test starts one in this process
    from server.config import Settings
    from server.serve import RunningServer

#: The directory that holds the ``air``, ``server`` and ``clients`` packages
#: (a checkout's root, or site-packages): a child process imports from it first.
IMPORT_ROOT = Path(__file__).resolve().parents[2]
#: /health's status of a server that is up ("warning": something holds it back, e.g.
#: a subscription's queue more than half full while it replays).
UP = ("ok", "warning")


def free_ports(n: int) -> list[int]:
    """``n`` different TCP ports free on 127.0.0.1 now (the kernel's picks; another
    process may take one before it is bound: start servers with port 0 when you can).
    Each is held while the next is picked: picked one by one, the kernel may give the
    same port twice, and a server given one port for both HTTP and events refuses to start."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (:func:`free_ports`: for two ports, ask for both at once)."""
    return free_ports(1)[0]


def cayuga_command(*args: str) -> list[str]:
    """The ``cayuga`` command as a user runs it, with this interpreter:
    ``subprocess.run(cayuga_command("run", "--query", q), env=cayuga_env())``."""
    return [sys.executable, "-m", "clients.cli", *args]


def cayuga_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment (``base``, by default this process's) for a ``cayuga``
    child process, importing the same packages as this process."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = str(IMPORT_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def server_settings(data_dir: str | Path, **overrides) -> Settings:
    """Settings for a server in a test: the bundled config.yaml and the
    environment as ``cayuga serve`` reads them, then ports chosen by the
    kernel (0), ``data_dir``, log level warning, a 5 s drain, then ``overrides``."""
    from server.config import load_settings

    base = dict(data_dir=Path(data_dir), http_port=0, tcp_port=0, log_level="warning", shutdown_timeout=5)
    base.update(overrides)
    return load_settings(None, **base)


@contextlib.contextmanager
def running_server(data_dir: str | Path, **overrides) -> Iterator[RunningServer]:
    """A server in this process, started with :func:`server_settings`
    (``data_dir``, ``overrides``) and stopped (drained) on leaving the block.
    It yields the :class:`~server.serve.RunningServer`: ``base_url``,
    ``http_port``, ``tcp_port``."""
    from server.serve import RunningServer

    srv = RunningServer(server_settings(data_dir, **overrides)).start()
    try:
        yield srv
    finally:
        srv.stop()


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> int | None:
    """Stop a child process as a user would: SIGTERM (a server drains), then
    SIGKILL if it still runs after ``timeout`` seconds; nothing if it has
    exited. Returns its exit code (negative: the signal that ended it)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


#: The CAYUGA_* variables a ServerProcess keeps from the calling environment: which engine build,
#: where the automata run (a test run with CAYUGA_ENGINE_WORKERS=1 runs them in a worker), and where the
#: TCP lines are read (CAYUGA_RECEIVERS=1: in a reader process).
PASSED_THROUGH = ("CAYUGA_ENGINE", "CAYUGA_ENGINE_WORKERS", "CAYUGA_RECEIVERS")


class ServerProcess:
    """``cayuga serve`` as a child process on fixed free ports, with its output
    in a log file; it can be killed (SIGKILL) and started again on the same
    ports and data directory.

    ``settings``: environment variables beside the shipped config.yaml (e.g.
    ``{"CAYUGA_SNAPSHOT_SECONDS": "0.3"}``); the ``CAYUGA_*`` variables of the
    calling environment are left out (all but :data:`PASSED_THROUGH`), so that a
    test runs the shipped defaults wherever it runs. ``log`` defaults to
    ``<data_dir>.log``. With ``CAYUGA_TLS_CERTFILE`` in ``settings`` the server speaks
    TLS: ``base_url`` is https, and its own client trusts ``cacert`` (and presents
    ``client_cert``, a (certificate, key) pair, to a server with tls_client_ca)."""

    def __init__(self, data_dir: str | Path, log: str | Path | None = None,
                 settings: Mapping[str, str] | None = None, *, http_port: int | None = None,
                 tcp_port: int | None = None, log_level: str = "info", cacert: str | Path | None = None,
                 client_cert: tuple[str | Path, str | Path] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.log = Path(log) if log is not None else self.data_dir.with_name(self.data_dir.name + ".log")
        spare = [p for p in free_ports(2) if p not in (http_port, tcp_port)]  # (at least one is not)
        self.http_port = http_port or spare.pop()
        self.tcp_port = tcp_port or spare.pop()
        tls = bool((settings or {}).get("CAYUGA_TLS_CERTFILE"))
        self.base_url = f"{'https' if tls else 'http'}://127.0.0.1:{self.http_port}"
        base = {k: v for k, v in cayuga_env().items() if not k.startswith("CAYUGA_") or k in PASSED_THROUGH}
        self.env = {**base, "CAYUGA_LOG_LEVEL": log_level, **(settings or {})}
        self.proc: subprocess.Popen | None = None
        verify = True
        if tls:
            from clients.client import tls_context

            verify = tls_context(str(cacert) if cacert else None,
                                 *(map(str, client_cert) if client_cert else (None, None)))
        self.http_client = httpx.Client(base_url=self.base_url, timeout=10, verify=verify)

    def start(self) -> None:
        """Start the process (it may take a while to answer: see :meth:`wait_up`)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            log.write(b"---- start\n")
            self.proc = subprocess.Popen(
                cayuga_command("serve", "--http-port", str(self.http_port), "--tcp-port", str(self.tcp_port),
                               "--data-dir", str(self.data_dir)),
                env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def health(self) -> dict | None:
        """/health, or None while the server does not answer; raises
        RuntimeError (with the log's end) when the process has exited."""
        try:
            return self.http_client.get("/health").json()
        except (httpx.HTTPError, ValueError):
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"cayuga serve is not running (exit code {code}); its log ends:\n"
                                   f"{self.log_tail()}") from None
            return None

    def wait_up(self, timeout: float = 60) -> dict:
        """Until /health says the server is up and its recovery's replay is over;
        returns that /health."""
        from clients.testing.waiting import wait_until

        return wait_until(lambda: (h := self.health()) and h["status"] in UP and not h.get("replay_remaining")
                          and h, timeout, what="the server to come up and finish its recovery", interval=0.02)

    def kill(self) -> None:
        """SIGKILL, as a crash: no drain, no shutdown snapshot."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (a drain), SIGKILL after ``timeout`` s; closes the HTTP client."""
        self.http_client.close()
        if self.proc is not None:
            stop_process(self.proc, timeout)

    def __enter__(self) -> "ServerProcess":
        self.start()
        try:
            self.wait_up()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
