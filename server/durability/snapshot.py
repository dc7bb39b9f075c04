"""Snapshots of the processing state, written without stalling the engine.

A snapshot holds everything a restart needs to go on exactly where the server
was (issue 12): every instance of every node and the epoch in progress
(``Engine.export_state``), the events still waiting in the T-delayed queue,
how many events the engine has taken (``fed``: the clock against which
subscriptions registered later are installed again during a replay), the
journal position it covers and the last witness sequence number of each
subscription. A restart loads the newest snapshot that reads back intact and
replays the journal after its position (see ``Recovery.restore_then_run`` in recovery.py).

Writing one must not stop the engine for long (with a million instances,
serialising takes seconds), so it is written the way Redis' BGSAVE is: the
engine thread forks between two batches while it holds the queue's lock (so
the child's copy of the queue and of the journal's position stand still), and
the child — a copy-on-write image of the whole process, frozen at that
instant — serialises and writes at its leisure while the parent goes on. The
engine's pause is the fork itself (page tables: milliseconds per GiB). The
child does nothing but that: it asks to die with its parent, closes every
inherited descriptor (a listening socket held by an orphan would keep the
port from a restarted server), never collects garbage, and leaves with
``os._exit``. The parent publishes the file once the child has succeeded
(rename into place, after ``before_publish``: the witness log's fsync), keeps
the newest ``keep`` snapshots and tells ``after_publish`` the oldest kept
one's journal position, before which journal segments may go.

File format (:mod:`server.durability.framing`): the file header ``CAYUGA S``
and version 2 (``MAGIC``), then records: the first holds the payload's length
(8 bytes, little-endian), the others the payload in order, in pieces of at
most ``CHUNK`` bytes (a record's length is 32 bits). The payload is a pickle of
plain data: tuples, lists, dicts, numbers, strings. Snapshots written before
that framing (``LEGACY_MAGIC``, payload length as 8 bytes big-endian, CRC-32
of the payload as 4, the payload) are still loaded. A file that is short, has
another magic, fails a CRC or holds less or more than its length is reported
and skipped, never loaded.

A snapshot that cannot be written (a full disk: the child exits with
``EXIT_NO_SPACE``, any other failure with 1) leaves no file behind -- its
``.tmp`` is removed, and a ``.tmp`` is never loaded anyway -- is counted
(``failed``, ``cayuga_snapshot_failures_total``), reported to the ``disk``
state while it lasts, and changes nothing else: the journal still covers
everything, and the next snapshot tries again.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import pickle
import re
import signal
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from server.durability import framing, fsio
from server.durability.diskfull import NO_SPACE, DiskFull, DiskState

log = logging.getLogger("cayuga.snapshot")

MAGIC = framing.file_header(framing.SNAPSHOT)
#: The payload is written in records of at most this many bytes.
CHUNK = 1 << 30
_SIZE = struct.Struct("<Q")
#: Snapshots written before the one framing: this magic, ``>Q`` length, ``>I`` CRC32, the payload.
LEGACY_MAGIC = b"CAYUGASNAP1\n"
_LEGACY_HEAD = struct.Struct(">QI")
_NAME = re.compile(r"^snapshot-(\d{10})-j(\d{20})\.bin$")

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
except (OSError, AttributeError):  # not Linux: the child cannot ask to die with its parent
    _prctl = None
PR_SET_PDEATHSIG = 1
#: The snapshot child's exit status when the disk was full (ENOSPC, EDQUOT).
EXIT_NO_SPACE = 3


class SnapshotError(ValueError):
    """A snapshot file that cannot be loaded (short, wrong magic, bad checksum)."""


@dataclass(frozen=True)
class SnapshotFile:
    path: Path
    number: int
    journal: int  # the journal position the snapshot covers (replay starts after it)


def encode(state: dict, chunk: int = CHUNK) -> bytes:
    """The snapshot file of ``state`` (see the module docstring)."""
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    size = _SIZE.pack(len(payload))
    parts = [MAGIC, framing.frame(size)]
    view = memoryview(payload)
    for at in range(0, len(payload), chunk):
        piece = view[at:at + chunk]
        parts += (framing.frame_head(piece), piece)
    return b"".join(parts)


def decode(data: bytes, where: str = "snapshot") -> dict:
    """The state in a snapshot file's bytes; :class:`SnapshotError` when they are not whole."""
    if data.startswith(LEGACY_MAGIC):
        return _decode_legacy(data, where)
    try:
        start = framing.file_kind(data, framing.SNAPSHOT, where)
    except framing.FramingError as exc:
        raise SnapshotError(str(exc)) from None
    if not start:
        raise SnapshotError(f"{where}: not a snapshot (no {MAGIC!r} header)")
    scan = framing.Scan(memoryview(data), start)
    records = iter(scan)
    _, head = next(records, (0, b""))
    if len(head) != _SIZE.size:
        raise SnapshotError(f"{where}: truncated or corrupt in its header "
                            f"({scan.problem or f'a first record of {len(head)} bytes'})")
    size = _SIZE.unpack(head)[0]
    pieces = [piece for _, piece in records]
    if scan.problem is not None:
        raise SnapshotError(f"{where}: {scan.problem} at offset {scan.good} (the file is torn or corrupt)")
    got = sum(map(len, pieces))
    if got != size:
        raise SnapshotError(f"{where}: truncated: {got} of {size} payload bytes")
    return pickle.loads(pieces[0] if len(pieces) == 1 else b"".join(pieces))


def _decode_legacy(data: bytes, where: str) -> dict:
    """A snapshot written before the one framing (``LEGACY_MAGIC``)."""
    head = len(LEGACY_MAGIC) + _LEGACY_HEAD.size
    if len(data) < head:
        raise SnapshotError(f"{where}: truncated in its header ({len(data)} bytes)")
    size, crc = _LEGACY_HEAD.unpack_from(data, len(LEGACY_MAGIC))
    payload = data[head:]
    if len(payload) != size:
        raise SnapshotError(f"{where}: truncated: {len(payload)} of {size} payload bytes")
    if zlib.crc32(payload) != crc:
        raise SnapshotError(f"{where}: checksum mismatch (the file is corrupt)")
    return pickle.loads(payload)


def _write_file(path: Path, data: bytes) -> None:
    fd = fsio.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        framing.write_all(fd, data)
        fsio.fsync(fd)
    finally:
        fsio.close(fd)



class SnapshotStore:
    """The snapshot files of one data directory."""

    def __init__(self, directory: Path, keep: int = 2) -> None:
        self.directory = Path(directory)
        fsio.makedirs(self.directory)
        self.keep = max(keep, 1)
        for tmp in self.directory.glob("*.tmp"):  # a child that was killed, or a crash mid-write
            fsio.remove(tmp)
        self.corrupt = 0

    def files(self) -> list[SnapshotFile]:
        """Snapshot files, newest first."""
        out = []
        for p in self.directory.iterdir():
            m = _NAME.match(p.name)
            if m:
                out.append(SnapshotFile(p, int(m.group(1)), int(m.group(2))))
        return sorted(out, key=lambda f: f.number, reverse=True)

    def next_path(self, journal: int) -> tuple[Path, Path]:
        """(temporary path, final path) for the next snapshot."""
        files = self.files()
        number = files[0].number + 1 if files else 1
        final = self.directory / f"snapshot-{number:010d}-j{journal:020d}.bin"
        return final.with_suffix(".tmp"), final

    def publish(self, tmp: Path, final: Path, parts: int = 0) -> list[SnapshotFile]:
        """Move a written snapshot into place (its ``parts``, the engine workers'
        part files beside it, first: the snapshot file is there only once they
        are), drop all but the newest ``keep``; returns the ones kept (newest first)."""
        for w in range(1, parts + 1):
            fsio.replace(final.with_name(final.name + f".w{w}.tmp"), final.with_name(final.name + f".w{w}"))
        fsio.replace(tmp, final)
        framing.fsync_dir(self.directory)
        files = self.files()
        for old in files[self.keep:]:
            fsio.remove(old.path)
            for part in self.directory.glob(old.path.name + ".w*"):
                fsio.remove(part)
        return files[: self.keep]

    def write(self, state: dict, journal: int) -> list[SnapshotFile]:
        """Write and publish a snapshot in this process (at shutdown, when
        nothing runs any more)."""
        tmp, final = self.next_path(journal)
        try:
            _write_file(tmp, encode(state))
        except BaseException:
            fsio.remove(tmp)
            raise
        return self.publish(tmp, final)

    def read(self, f: SnapshotFile) -> dict:
        """One snapshot's state; raises SnapshotError (a ValueError), OSError or a pickle error."""
        return decode(f.path.read_bytes(), str(f.path))

    def load_latest(self) -> tuple[dict, SnapshotFile] | None:
        """The newest snapshot that reads back intact (older ones stand in
        for a corrupt one: the journal is kept from the oldest kept one's
        position), or None."""
        for f in self.files():
            try:
                state = decode(f.path.read_bytes(), str(f.path))
                missing = [name for name in state.get("engine_parts", ()) if not (self.directory / name).exists()]
                if missing:
                    raise SnapshotError(f"{f.path}: its engine workers' parts {', '.join(missing)} are missing")
            except (SnapshotError, OSError, pickle.UnpicklingError, EOFError, ValueError) as exc:
                self.corrupt += 1
                log.error("skipping snapshot %s: %s", f.path, exc)
                continue
            return state, f
        return None


class Snapshotter:
    """Takes snapshots in a forked child (see the module docstring)."""

    def __init__(self, store: SnapshotStore, before_publish: Callable[[], None] | None = None,
                 after_publish: Callable[[list[SnapshotFile]], None] | None = None,
                 disk: DiskState | None = None) -> None:
        self.store = store
        self.disk = disk
        self.before_publish = before_publish
        self.after_publish = after_publish
        self._child: int | None = None
        self._paths: tuple[Path, Path] | None = None
        self._started = 0.0
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._remote_done = threading.Event()
        self._remote_status: int | None = None
        self._remote_statuses: list[int] = []
        self._remote_children = 1
        self.taken = 0
        self.failed = 0
        self.last_pause = 0.0  # seconds the engine thread stood still for the last fork
        self.last_seconds = 0.0  # how long the last child took
        self.last_bytes = 0
        self.last_error = ""

    @property
    def running(self) -> bool:
        return self._child is not None

    def fork(self, lock: threading.Lock, journal: Callable[[], int], collect: Callable[[], dict]) -> bool:
        """On the engine thread, between batches: fork a child that writes
        ``collect()`` (called in the child). ``lock`` is held across the fork
        (and ``journal()`` read under it). False when one is still being written."""
        if self._child is not None:
            return False
        start = time.perf_counter()
        with lock:
            position = journal()
            tmp, final = self.store.next_path(position)
            pid = os.fork()
            if pid == 0:  # the child: never returns
                _child_main(tmp, collect)
        self.last_pause = time.perf_counter() - start
        self._child, self._paths, self._started = pid, (tmp, final), time.monotonic()
        self._watcher = threading.Thread(target=self._watch, name="cayuga-snapshot", daemon=True)
        self._watcher.start()
        return True

    def fork_remote(self, lock: threading.Lock, journal: Callable[[], int], collect: Callable[[], dict],
                    start: Callable[[Path, dict], object], children: int = 1) -> bool:
        """:meth:`fork`, when other processes hold the engine (engine workers,
        server/workers/): ``collect()`` (this process's part, read under
        ``lock`` with the journal's position) and the temporary path go to
        ``start``, which has those processes' forked children (``children`` of
        them) write the file and its parts; each one's end comes to
        :meth:`remote_done` (its exit status), maybe before ``start`` returns.
        A failure to start is counted and said, and changes nothing else."""
        if self._child is not None:
            return False
        begin = time.perf_counter()
        with lock:
            position = journal()
            tmp, final = self.store.next_path(position)
            part = collect()
        self._remote_status = None
        self._remote_statuses = []
        self._remote_children = children
        self._remote_done.clear()
        self._child, self._paths, self._started = -1, (tmp, final), time.monotonic()
        try:
            start(tmp, part)
        except Exception as exc:  # noqa: BLE001 - e.g. a worker still writing the last one: the next tries again
            self._child = None
            self.failed += 1
            self.last_error = str(exc)
            log.error("snapshot %s could not be started: %s", final.name, exc)
            return False
        self.last_pause = time.perf_counter() - begin
        self._watcher = threading.Thread(target=self._watch, name="cayuga-snapshot", daemon=True)
        self._watcher.start()
        return True

    def remote_done(self, status: int) -> None:
        """A remote child of :meth:`fork_remote` has ended with ``status`` (as ``os.waitpid`` gives it)."""
        self._remote_statuses.append(status)
        if len(self._remote_statuses) >= self._remote_children:
            self._remote_status = next((s for s in self._remote_statuses if s), 0)
            self._remote_done.set()

    def remote_lost(self, why: str) -> None:
        """An engine worker died (server/workers/restart.py): a remote snapshot under way may lack
        its child's part, and its end would never come: counted as failed (the next one is taken
        as usual); nothing when none is under way."""
        if self._child == -1 and not self._remote_done.is_set():
            log.error("the snapshot under way fails: %s", why)
            self._remote_statuses = [1 << 8] * self._remote_children
            self._remote_status = 1 << 8
            self._remote_done.set()

    def _watch(self) -> None:
        pid = self._child
        status = None
        while not self._stop.is_set():
            if pid == -1:  # a remote child (fork_remote)
                if self._remote_done.wait(0.02):
                    status = self._remote_status
                    break
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            self._stop.wait(0.02)
        else:  # stopping: the child's work is abandoned (a remote one dies with its worker)
            if pid != -1:
                with _suppress():
                    os.kill(pid, signal.SIGKILL)
                with _suppress():
                    os.waitpid(pid, 0)
            fsio.remove(self._paths[0])
            self._child = None
            return
        tmp, final = self._paths
        self.last_seconds = time.monotonic() - self._started
        try:
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_NO_SPACE:
                raise DiskFull("snapshot", "a snapshot could not be written", tmp, os.strerror(NO_SPACE[0]))
            if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
                raise RuntimeError(f"the snapshot child ended with status {status:#x}")
            self.last_bytes = tmp.stat().st_size
            if self.before_publish is not None:
                self.before_publish()
            kept = self.store.publish(tmp, final, self._remote_children - 1 if pid == -1 else 0)
            self.taken += 1
            if self.disk is not None:
                self.disk.recovered("snapshot")
            if self.after_publish is not None:
                self.after_publish(kept)
        except Exception as exc:  # noqa: BLE001 - reported; the next snapshot tries again
            self.failed += 1
            self.last_error = str(exc)
            fsio.remove(tmp)
            for part in tmp.parent.glob(final.name + ".w*.tmp"):
                fsio.remove(part)
            if isinstance(exc, OSError) and exc.errno in NO_SPACE:
                exc = DiskFull.from_os("snapshot", "a snapshot could not be published", final, exc)
            if isinstance(exc, DiskFull) and self.disk is not None:
                self.disk.failed(exc)  # logged once per episode
            else:
                log.error("snapshot %s failed: %s", final.name, exc)
        finally:
            self._child = None

    def wait(self, timeout: float) -> bool:
        """Wait for a snapshot being written; True when none is (any more)."""
        w = self._watcher
        if w is not None:
            w.join(timeout)
        return self._child is None

    def stop(self, timeout: float = 5.0) -> None:
        """Let a snapshot being written finish within ``timeout``, else kill it."""
        if not self.wait(timeout):
            self._stop.set()
            if self._watcher is not None:
                self._watcher.join(5.0)


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)


def _child_main(tmp: Path, collect: Callable[[], dict]) -> None:
    code = 1
    try:
        gc.disable()  # finalizers of the parent's objects must not run here
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before the request took effect
            os._exit(1)
        _close_inherited()
        _write_file(tmp, encode(collect()))
        code = 0
    except OSError as exc:  # the parent reports the status and removes the file
        code = EXIT_NO_SPACE if exc.errno in NO_SPACE else 1
    except BaseException:  # noqa: BLE001 - the parent reports the status
        code = 1
    finally:
        os._exit(code)


def _close_inherited() -> None:
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
