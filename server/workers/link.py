"""The main process's end of an engine worker (server/workers/worker.py): the
process, its pipe, and the thread that reads what it sends.

Messages go out in one order — whoever sends, under :attr:`WorkerLink.lock` —
and the worker handles them in that order. What comes back comes on two
sockets. Commands' answers and snapshots' ends are read by a thread of its
own (``cayuga-worker-reader``), so that the worker never waits on a full pipe
while the main process is busy writing: a command's answer resolves its future
there; a snapshot's end goes to ``on_snapshot``. Batches' results (and the
answers to ``P``) come on the results channel (server/workers/channel.py),
:attr:`WorkerLink.results`, which the engine thread (server/workers/dispatch.py)
waits on and reads itself, in order; the answers to ``P`` go on
:attr:`WorkerLink.applied` as they are read. ``on_result`` is called once the
worker has gone (the engine thread may be waiting for events).
"""

from __future__ import annotations

import itertools
import logging
import pickle
import queue as stdqueue
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, InvalidStateError
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Callable

from server.observability.threadcpu import ProcessCpuWait, process_cpu, stat_fields
from server.workers import codec
from server.workers.channel import ResultReader

if TYPE_CHECKING:
    from server.config import Settings

log = logging.getLogger("cayuga.daemon")

#: Seconds a command may take before its caller gives up (the worker goes on with it).
COMMAND_TIMEOUT = 60.0
#: Seconds a worker may stay stopped (SIGSTOP, a debugger) while :meth:`WorkerLink.result` waits for
#: an answer that only its continuing would bring (a snapshot's): then it is waited for no longer.
STOPPED_SECONDS = 1.0
#: Seconds a reading of /proc/PID/stat answers for: one ``/health`` asks each worker's state
#: and CPU three times (43 µs a worker a call at 16 workers, read anew each time: BENCHMARKS.md,
#: "Engine workers, round 21").
STAT_FRESH = 0.02


def worker_settings(settings: Settings, **changes) -> dict:
    """What a worker takes of the server's ``settings`` (with ``changes``), as plain values: it
    need not import the settings' model, a quarter of its start (BENCHMARKS.md, "Engine
    workers, round 8")."""
    return {"functions": settings.function_specs(), "engine_workers": settings.engine_workers,
            "max_state_bytes": settings.max_state_bytes,
            "max_instances_per_subscription": settings.max_instances_per_subscription,
            "log_level": settings.log_level, **changes}


class WorkerGone(RuntimeError):
    """The engine worker process has ended (its pipe closed)."""


class WorkerStopped(TimeoutError):
    """The engine worker process is stopped (a signal, a debugger): what was asked of it is not waited for."""


class WorkerLink:
    """One engine worker: start, send, receive, stop (see the module's docstring)."""

    def __init__(self, settings: dict, name: str = "cayuga-engine-worker-0") -> None:
        self.settings = settings  # what the worker takes (:func:`worker_settings`)
        self.name = name
        self.process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self.lock = threading.Lock()  # one sender at a time: the order of the pipe is the order of the worker
        self.results: ResultReader | None = None  # its batches' results, read by the engine thread (start())
        self.applied: stdqueue.Queue = stdqueue.Queue()  # the answers to P (what applying decisions removed)
        self.on_snapshot: Callable[[int], None] | None = None
        #: called once the worker has gone: the engine thread waits for events, results or that
        #: (server/workers/dispatch.py)
        self.on_result: Callable[[], None] | None = None
        self._numbers = itertools.count(1)
        self._pending: dict[int, Future] = {}
        self._reader: threading.Thread | None = None
        self.gone: str | None = None  # why the worker is no longer there (None while it runs)
        self.started = False  # it has answered a command: its interpreter is up and reading its pipe
        #: where its engine is while a batch has run a second or more (``W``; None otherwise): the
        #: registered function on its stack, if any, and the innermost place
        self.where: dict | None = None
        self._stat_at: tuple[float, list[bytes] | None] = (-float("inf"), None)  # (when, fields): :meth:`_stat`
        self._wait_at: tuple[float, float | None] = (-float("inf"), None)  # (when, seconds): :meth:`cpu_wait_seconds`
        self._waits: ProcessCpuWait | None = None  # its process's threads' waits, kept as they end

    def start(self) -> None:
        """Start ``python -m server.workers.worker`` on one end of a socket pair (a
        fresh interpreter, not a fork of this threaded process, and not one that
        imports the caller's ``__main__`` as multiprocessing's spawn does)."""
        mine, theirs = socket.socketpair()
        results, their_results = socket.socketpair()
        try:
            fds = (theirs.fileno(), their_results.fileno())
            self.process = subprocess.Popen([sys.executable, "-m", "server.workers.worker", *map(str, fds)],
                                            pass_fds=fds, stdin=subprocess.DEVNULL)
        except BaseException:
            mine.close()
            results.close()
            raise
        finally:
            theirs.close()
            their_results.close()
        self._conn = Connection(mine.detach())
        self.results = ResultReader(results, self._applied, self._closed)
        # the settings, and where this process imports from (a user function's module may be on a path
        # this process was given at run time: the worker must import it as this process did)
        self._conn.send_bytes(pickle.dumps((self.settings, list(sys.path)),
                                           pickle.HIGHEST_PROTOCOL))
        self._reader = threading.Thread(target=self._read, name="cayuga-worker-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self.gone is None and self.process is not None and self.process.poll() is None

    def _reading(self, slot: str, read: Callable[[int], object], fresh: bool = False):
        """``read(pid)`` of the live worker process (None once it has ended, or before it started),
        kept in attribute ``slot`` as ``(when, value)``: a reading STAT_FRESH seconds old at most is
        answered again, unless ``fresh``."""
        now = time.monotonic()
        at, value = getattr(self, slot)
        if now - at < STAT_FRESH and not fresh:
            return value
        proc = self.process
        value = None if proc is None or proc.poll() is not None else read(proc.pid)
        setattr(self, slot, (now, value))
        return value

    def _stat(self, fresh: bool = False) -> list[bytes] | None:
        """The fields of /proc/PID/stat after the command's name (None where there is no /proc, or
        once the worker has ended); see :meth:`_reading`."""
        return self._reading("_stat_at", stat_fields, fresh)

    def cpu_seconds(self) -> float | None:
        """CPU time the worker process has used (user and system, from /proc; None where there is no
        /proc, or once it has ended)."""
        fields = self._stat()
        if fields is None:
            return None
        return process_cpu(fields)

    def cpu_wait_seconds(self) -> float | None:
        """Seconds the worker process's threads have waited for a CPU while ready to run (Linux's
        schedstat run delay: server/observability/threadcpu.py), an ended thread's kept; None where
        /proc says nothing of it, or once it has ended; see :meth:`_reading`."""
        return self._reading("_wait_at", self._waits_of)

    def _waits_of(self, pid: int) -> float | None:
        waits = self._waits
        if waits is None or waits.pid != pid:  # (a restarted worker's counter starts again)
            waits = self._waits = ProcessCpuWait(pid)
        return waits.read()

    def stopped(self, fresh: bool = False) -> bool:
        """The worker process is stopped (SIGSTOP, a terminal's ^Z, a debugger's stop): it answers
        nothing until it is continued (the state field of /proc/PID/stat, T or t; read anew with
        ``fresh``, else a reading of the last STAT_FRESH seconds)."""
        fields = self._stat(fresh)
        return fields is not None and fields[0] in (b"T", b"t")

    # ------------------------------------------------------------------ sending

    def send(self, data: bytes) -> None:
        if self.gone is not None:
            raise WorkerGone(self.gone)
        with self.lock:
            try:
                self._conn.send_bytes(data)
            except (OSError, ValueError) as exc:
                raise WorkerGone(f"the engine worker {self.name} has ended ({exc})") from None

    def command(self, name: str, *args) -> Future:
        """Send a command; its answer resolves the future (in the worker's order)."""
        fut: Future = Future()
        if self.gone is not None:
            fut.set_exception(WorkerGone(self.gone))
            return fut
        with self.lock:
            number = next(self._numbers)
            self._pending[number] = fut
            try:
                self._conn.send_bytes(codec.COMMAND + pickle.dumps((number, name, args), pickle.HIGHEST_PROTOCOL))
            except (OSError, ValueError) as exc:
                self._pending.pop(number, None)
                _fail(fut, WorkerGone(f"the engine worker {self.name} has ended ({exc})"))
        return fut

    def call(self, name: str, *args, timeout: float = COMMAND_TIMEOUT):
        """:meth:`command` and wait for its answer (raises what the worker raised)."""
        return self.command(name, *args).result(timeout=timeout)

    def result(self, fut: Future, timeout: float):
        """The answer of one of this worker's commands (``fut``), within ``timeout`` seconds; raises
        :class:`WorkerStopped` once the worker has stayed stopped STOPPED_SECONDS (it answers
        nothing until it is continued: a shutdown waited 600 s for a stopped one's snapshot)."""
        deadline = time.monotonic() + timeout
        since = None
        while True:
            try:
                return fut.result(timeout=max(min(0.1, deadline - time.monotonic()), 0))
            except TimeoutError:
                now = time.monotonic()
                if now >= deadline:
                    raise
                if not self.stopped():
                    since = None
                elif since is None:
                    since = now
                elif now - since >= STOPPED_SECONDS:
                    pid = self.process.pid if self.process is not None else None
                    raise WorkerStopped(f"the engine worker {self.name} (pid {pid}) is stopped (a signal or a "
                                        "debugger) and does not answer") from None

    # ------------------------------------------------------------------ receiving

    def _read(self) -> None:
        conn = self._conn
        while True:
            try:
                msg = conn.recv_bytes()
            except (EOFError, OSError):
                break
            tag, body = msg[:1], msg[1:]
            if tag == codec.ANSWER:
                self.started = True
                number, ok, value = pickle.loads(body)
                fut = self._pending.pop(number, None)
                if fut is None:
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
            elif tag == codec.SNAPSHOT:
                if self.on_snapshot is not None:
                    self.on_snapshot(pickle.loads(body))
            elif tag == codec.WHERE:
                self.where = pickle.loads(body)
        try:
            code = self.process.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        self.gone = f"the engine worker {self.name} has ended (exit code {code})"
        self.where = None
        for fut in list(self._pending.values()):
            _fail(fut, WorkerGone(self.gone))
        self._pending.clear()
        if self.on_result is not None:  # wakes the engine thread
            self.on_result()

    def _applied(self, body: bytes) -> None:
        """The answer to the decisions of a check (``P``), read on the results channel."""
        self.applied.put(pickle.loads(body)[2])

    def _closed(self) -> None:
        """The results channel has ended: the worker has gone. Waits (on the engine thread)
        until the reader thread has said why (:attr:`gone`)."""
        if self._reader is not None:
            self._reader.join(COMMAND_TIMEOUT)

    # ------------------------------------------------------------------ stopping

    def kill(self) -> None:
        """End the worker at once (SIGKILL, which a stopped process gets too): at a stop, one that
        does not answer. Its reader thread sees the end as any other (:attr:`gone`)."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.kill()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the worker to end (after what it has been sent), then make sure it has. A stopped one
        (:meth:`stopped`) is ended with SIGKILL at once: it would answer neither."""
        proc = self.process
        if proc is None:
            return
        if self.stopped(fresh=True):  # (one stopped a moment ago would wait out the timeout below)
            log.warning("engine worker %s (pid %d) is stopped (a signal or a debugger): ended with SIGKILL",
                        self.name, proc.pid)
            self.kill()
            proc.wait(5)
        if self.gone is None and proc.poll() is None:
            try:
                self.call("stop", timeout=timeout)
            except Exception:  # noqa: BLE001 - it is stopped below in any case
                pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        with self.lock:
            self._conn.close()
        if self._reader is not None:
            self._reader.join(5)
        if self.results is not None:
            self.results.close()


def _fail(fut: Future, exc: BaseException) -> None:
    """``fut`` failed with ``exc``, unless it is already done: a command whose send meets the
    worker's end and the reader thread that has just seen that end both fail it, and only the
    first may (the second would raise InvalidStateError, on the engine thread, and end it)."""
    try:
        fut.set_exception(exc)
    except InvalidStateError:
        pass
