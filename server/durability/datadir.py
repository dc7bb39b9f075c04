"""One server per data directory: an exclusive lock held for the server's life.

Two servers on one data directory both append to the journal, both number
witnesses and both publish snapshots: acknowledged events are lost and
witnesses renumbered (issue 33). So a server takes :data:`LOCK_NAME` in its
data directory with ``flock(LOCK_EX | LOCK_NB)`` before it opens anything
there, holds it until :meth:`DataDirLock.release` (``Daemon.stop``), and a
second server is refused at once with :class:`DataDirInUse`, which names the
directory and the holder's pid and ports (the holder writes them into the lock
file: ``{"pid": N, "host": ..., "http_port": N, "tcp_port": N, "started": ...}``,
the ports once they are bound). The kernel releases a flock when the last
descriptor of its open file is closed, so a server killed with SIGKILL leaves
no stale lock: the file stays, the lock does not.

A flock belongs to the open file, which a forked child shares: a snapshot
writer (server/durability/snapshot.py) would keep the lock alive after its
parent died. Every forked child closes its copy at once (``os.register_at_fork``;
closing, not unlocking: an unlock by the child would release the parent's
lock too), before it runs any code of its own. Child processes started with
``subprocess`` never get it (the descriptor is close-on-exec).

A data directory that cannot be created or written (a read-only mount, no
permission) is reported here too, in one line (:class:`DataDirUnusable`),
before anything else touches it. No sockets, no threads.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
import weakref
from pathlib import Path

from server.durability import fsio

#: The lock file in the data directory.
LOCK_NAME = "cayuga.lock"

#: Where another data directory comes from, for messages.
HOW_TO_CHOOSE = "--data-dir or CAYUGA_DATA_DIR"


class DataDirInUse(OSError):
    """Another server holds the data directory's lock."""


class DataDirUnusable(OSError):
    """The data directory cannot be created, opened or written."""


#: Locks held in this process: a forked child closes their descriptors.
_held: "weakref.WeakSet[DataDirLock]" = weakref.WeakSet()


def _close_in_child() -> None:
    for lock in list(_held):
        lock._forget()


os.register_at_fork(after_in_child=_close_in_child)


def _unusable(directory: Path, exc: OSError) -> DataDirUnusable:
    why = exc.strerror or str(exc)
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        todo = "make it writable for the user the server runs as, or give a writable one with " + HOW_TO_CHOOSE
    else:
        todo = "give a directory the server can create and write with " + HOW_TO_CHOOSE
    return DataDirUnusable(f"the data directory {directory} cannot be used ({why}): the server keeps "
                                      f"its store, journal, witness log and snapshots there; {todo}")


class DataDirLock:
    """The lock on one data directory (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._fd = -1
        self._info: dict = {}

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self, host: str | None = None) -> None:
        """Take the lock, or raise :class:`DataDirInUse` (another server holds
        it) or :class:`DataDirUnusable` (the directory cannot be written)."""
        if self.held:
            return
        try:
            fsio.makedirs(self.directory)  # (its entry synced: what is synced in it stays)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _unusable(self.directory, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DataDirInUse(self._in_use(holder)) from None
            raise _unusable(self.directory, exc) from None
        self._fd = fd
        _held.add(self)
        self._info = {"pid": os.getpid(), "host": host, "http_port": None, "tcp_port": None,
                      "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        try:
            self._write()
        except OSError as exc:
            self.release()
            raise _unusable(self.directory, exc) from None

    def note_ports(self, http_port: int | None, tcp_port: int | None) -> None:
        """Record the bound ports in the lock file, for a second server's message
        (best effort: a full disk leaves the pid alone there)."""
        if not self.held:
            return
        self._info.update(http_port=http_port, tcp_port=tcp_port)
        try:
            self._write()
        except OSError:
            pass

    def release(self) -> None:
        """Empty the lock file and let go of the lock (idempotent)."""
        fd, self._fd = self._fd, -1
        _held.discard(self)
        if fd < 0:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # the kernel releases the flock with the open file's last descriptor

    def _forget(self) -> None:
        """In a forked child: close this process's copy of the descriptor, which
        leaves the parent's lock as it is (the parent still has the open file)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def _write(self) -> None:
        data = json.dumps(self._info).encode() + b"\n"
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def _in_use(self, holder: dict) -> str:
        pid = holder.get("pid")
        who = f"pid {pid}" if isinstance(pid, int) else "its pid not recorded"
        http, tcp = holder.get("http_port"), holder.get("tcp_port")
        if http is not None or tcp is not None:
            where = f", HTTP port {http if http is not None else '?'}, TCP port {tcp if tcp is not None else '?'}"
        elif isinstance(pid, int):
            where = ", still starting: its ports are not bound yet"
        else:
            where = ""
        return (f"the data directory {self.directory} is in use by another cayuga serve ({who}{where}; "
                f"lock file {self.path}); two servers on one data directory would lose acknowledged events. "
                f"Stop that server first, or give this one another data directory ({HOW_TO_CHOOSE})")

    def __del__(self) -> None:  # a daemon dropped without stop(): its lock goes with it
        self._forget()


def _read_holder(fd: int) -> dict:
    """What the holder wrote into the lock file ({} when nothing readable yet)."""
    try:
        data = os.pread(fd, 4096, 0)
        info = json.loads(data)
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}
