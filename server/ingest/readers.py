"""The TCP connections' readers in a process of their own (``receivers: 1``;
docs/design/receivers.md, stage 1).

The main process still accepts every connection and keeps its limits
(server/ingest/tcp.py). It hands each one over to the reader process: a stream
socket pair made for it, the client's socket and one end of the pair sent in one
``SCM_RIGHTS`` message on the control socket (a ``SOCK_SEQPACKET`` pair), its own
copy of the client's socket closed. The reader process runs the connection's
reader (server/ingest/connection.py: TLS, the token, the headers, the lines'
decoding, the limits, the acknowledgements) on a thread of its own, with a
:class:`server.ingest.remote.RemoteIntake` over the pair; a thread of the main
process answers it (:func:`server.ingest.remote.serve`). So the lines are parsed
beside the main process's interpreter lock, not under it.

A reader process that dies (kill -9, the OOM killer) takes its connections with
it: their senders reconnect and resume from what the journal holds, and nothing
was acknowledged that it does not hold. The main process starts another at once
(``restarts`` counts them). One whose main process died ends (the control socket
closes; Linux's parent-death signal too). A stop tells it to end its connections
at their next line, as the threads' stop does, and waits for it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass

import msgspec

from server.ingest import remote
from server.ingest.connection import POLL, Connection, Limits
from server.observability.threadcpu import process_cpu, stat_fields

log = logging.getLogger("cayuga.receivers")

#: Seconds a reader process has to start (its imports) and to end once told to stop.
START_SECONDS = 30.0
STOP_SECONDS = 10.0
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


@dataclass(frozen=True)
class ReaderConfig:
    """What a reader process is started with (plain values)."""

    limits: Limits
    time_unit_ms: float = 1.0
    stamp: bool = True
    #: the latest t1 accepted, in time units past the server's clock (None: no bound; Health.horizon_ahead)
    horizon_ahead: float | None = None
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    tls_client_ca: str | None = None
    log_level: str = "info"


class ReaderProcess:
    """The main process's handle on the reader process: started by :meth:`start`,
    started again when it dies, ended by :meth:`stop`."""

    def __init__(self, config: ReaderConfig, *, auth: bool, journaled: bool) -> None:
        self.config = config
        self.auth = auth
        self.journaled = journaled
        self.restarts = 0
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._lock = threading.Lock()  # the control socket: one hand-over at a time
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def cpu_seconds(self) -> float | None:
        """The CPU the reader process now running has used (Linux's /proc; None elsewhere)."""
        fields = None if self.pid is None else stat_fields(self.pid)
        return None if fields is None else process_cpu(fields)

    def start(self) -> None:
        self._spawn()
        self._watcher = threading.Thread(target=self._watch, name="cayuga-reader-watch", daemon=True)
        self._watcher.start()

    def _spawn(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen([sys.executable, "-m", "server.ingest.readers", str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        config = asdict(self.config)
        mine.sendall(_encode(config))
        mine.settimeout(START_SECONDS)
        try:
            ready = mine.recv(64)
        except OSError:
            ready = b""
        if ready != b"ready":
            proc.kill()
            proc.wait()
            mine.close()
            raise RuntimeError("the TCP reader process did not start (its log says why)")
        mine.settimeout(None)
        with self._lock:
            self._proc, self._control = proc, mine
        log.info("TCP reader process %d started", proc.pid)
        if self._stopping.is_set():  # (a stop came while it started: :meth:`stop` waits for it)
            mine.send(_encode(["stop"]))

    def _watch(self) -> None:
        """Start the reader process again when it dies (not when it was told to stop)."""
        while not self._stopping.is_set():
            proc = self._proc
            if proc is None or proc.poll() is None:
                self._stopping.wait(POLL)
                continue
            if self._stopping.is_set():
                return
            log.warning("the TCP reader process %d ended (exit %s); its connections end and their senders "
                        "resume; starting another", proc.pid, proc.returncode)
            with self._lock:
                if self._control is not None:
                    self._control.close()
                self._control = None
            try:
                self._spawn()
                self.restarts += 1
            except (OSError, RuntimeError) as exc:
                log.error("the TCP reader process could not be started again: %s; retrying", exc)
                self._stopping.wait(1.0)

    def hand_over(self, conn: socket.socket, address: str) -> socket.socket | None:
        """Give ``conn`` to the reader process; the main process's end of its
        channel, or None when no reader process could take it (``conn`` is closed)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self._lock:
                if self._control is None:
                    raise OSError("no reader process")
                socket.send_fds(self._control, [_encode(["conn", address, self.auth, self.journaled])],
                                [conn.fileno(), theirs.fileno()])
        except OSError as exc:
            log.info("a TCP connection from %s could not be handed to the reader process: %s", address, exc)
            ours.close()
            return None
        finally:
            theirs.close()
            conn.close()
        return ours

    def reload_tls(self) -> None:
        """The server's TLS files were loaded again (SIGHUP): the reader process loads them too."""
        with self._lock:
            if self._control is not None:
                try:
                    self._control.send(_encode(["tls"]))
                except OSError:
                    pass

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        self._stopping.set()
        if self._watcher is not None:  # first: a reader process it is starting is then the one to stop
            self._watcher.join(timeout)
        with self._lock:
            control, self._control = self._control, None
        if control is not None:
            try:
                control.send(_encode(["stop"]))
            except OSError:
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the TCP reader process %d did not end in %.0f s; killing it", self._proc.pid, timeout)
                self._proc.kill()
                self._proc.wait()
        if control is not None:
            control.close()


# ---------------------------------------------------------------------- the reader process


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the main process dies (its control socket says so too)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(control_fd: int) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the group: the main process stops us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    control = socket.socket(fileno=control_fd)
    raw = _decode(control.recv(1 << 16))
    config = ReaderConfig(**{**raw, "limits": Limits(**raw["limits"])})
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s [reader]: %(message)s")
    tls = None
    if config.tls_certfile is not None:
        from server.security.tls import ServerTls
        tls = ServerTls(config.tls_certfile, config.tls_keyfile, config.tls_client_ca)
    units_per_second = 1000.0 / config.time_unit_ms
    clock = lambda: time.time() * units_per_second  # noqa: E731 (the server's clock: health.now)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    control.send(b"ready")
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(control, 1 << 12, 2)
        except OSError:
            break
        if not message:
            break  # the main process ended
        kind, *args = _decode(message)
        if kind == "conn":
            address, auth, journaled = args
            conn, channel = (socket.socket(fileno=fd) for fd in fds)
            conn.settimeout(POLL)  # (a socket made of a descriptor takes its blocking mode, not its timeout)
            channel.settimeout(None)
            intake = remote.RemoteIntake(channel, auth=auth, journaled=journaled, clock=clock,
                                         time_unit_ms=config.time_unit_ms, stamp=config.stamp,
                                         horizon_ahead=config.horizon_ahead)
            reader = Connection(conn, address, intake, config.limits, tls=tls, stop=stop)
            t = threading.Thread(target=_run, args=(reader, channel), name="cayuga-reader", daemon=True)
            threads = [x for x in threads if x.is_alive()] + [t]
            t.start()
        elif kind == "tls" and tls is not None:
            tls.reload()
        elif kind == "stop":
            break
        for fd in fds if kind != "conn" else ():
            os.close(fd)
    stop.set()
    deadline = time.monotonic() + STOP_SECONDS - 1
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0.1))
    os._exit(0)


def _run(reader: Connection, channel: socket.socket) -> None:
    try:
        reader.run()
    finally:
        try:
            reader.sock.close()
        finally:
            channel.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
