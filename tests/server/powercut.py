"""A power cut, simulated: what the disk holds when the power goes at any
point of a run, built from a record of the run's file operations (the
crash-consistency method of ALICE, OSDI 2014: record the system calls, then
construct the states a crash can leave and run recovery on each).

**Recording.** :func:`install` replaces the names of the durable files' seam
(server/durability/fsio.py) in one process with wrappers that do the call,
then append what it changed to a log shared by every process of the run (the
server, its engine worker, the forked snapshot writers: each ``O_APPEND``
write of a whole record, so records never interleave): a write with its
offset and bytes, a truncation, a file created, renamed or removed, an fsync
(or fdatasync) of a file or of a directory. Files are known by inode, so a
rename keeps what was written and synced. The sitecustomize in
``tests/server/powercut_site/`` installs it in every Python process started
with ``POWERCUT_LOG`` and ``POWERCUT_ROOT`` in its environment and that
directory on its ``PYTHONPATH``. :func:`mark` appends a record of the test's
own (an acknowledgement received): the log's order is causal, so an
acknowledgement marked after the fsync it waited for comes after it.

**The disk at a cut.** :class:`Disk` replays the first ``k`` records over the
directory as it was when the recording began (:func:`snapshot_tree`): every
file and directory entry then was durable. After the cut:

- ``"sync"`` (the harshest disk): every write and every directory entry
  (created, renamed, removed) not yet fsynced is dropped. A file holds what it
  held at its last fsync, or nothing if it never had one; a directory holds
  the entries it had at its last fsync;
- ``"prefix"``: besides, each file keeps an arbitrary prefix of the writes
  made since its last fsync, and each directory an arbitrary prefix of the
  entry changes since its last fsync, independently of one another (what a
  file system that orders nothing across files may leave; a torn last write
  included);
- ``"reorder"``, just before a file's fsync: that file holds only what it
  had synced, every other file and directory all that was done to it (the
  one state of the prefix model that matters most there, chosen outright:
  the end of a sealed segment lost while the next segment, written later,
  kept its records).

The SQLite store is outside the seam: a test must leave it unchanged while
recording (:func:`store_rows` reads what it holds).
"""

from __future__ import annotations

import os
import pickle
import random
import sqlite3
import stat
import struct
from pathlib import Path

from server.durability import fsio

_LEN = struct.Struct("<I")
NAMES = ("open", "write", "ftruncate", "fsync", "fdatasync", "close", "replace", "rename", "unlink", "mkdir")


# --------------------------------------------------------------------------- recording


class _Log:
    """One process's handle on the shared log (reopened after a fork)."""

    def __init__(self, path: str) -> None:
        self.path, self.fd, self.pid = path, None, None

    def forked(self) -> None:
        self.fd = None  # the child may close every inherited descriptor (snapshot.py): never write to it

    def append(self, record: tuple) -> None:
        body = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        data = _LEN.pack(len(body)) + body
        if self.fd is None or self.pid != os.getpid():
            self.fd, self.pid = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644), \
                os.getpid()
        written = os.write(self.fd, data)
        if written != len(data):  # a regular file takes an append whole, or the test cannot go on
            raise OSError(f"the power-cut log took {written} of {len(data)} bytes")


class Recorder:
    """The seam's calls in this process, done and recorded (see the module docstring)."""

    def __init__(self, log: str, root: str) -> None:
        self.log = _Log(log)
        self.root = os.path.realpath(root)
        self.real = {name: getattr(fsio, name) for name in NAMES}
        self.fds: dict[int, tuple[int, str]] = {}  # fd -> (inode, path under the root)

    def rel(self, path) -> str | None:
        p = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
        if p != self.root and not p.startswith(self.root + os.sep):
            return None
        return os.path.relpath(p, self.root)

    def open(self, path, flags, mode=0o777, *, dir_fd=None):
        existed = os.path.lexists(path)
        fd = self.real["open"](path, flags, mode)
        r = self.rel(path)
        if r is not None:
            st = os.fstat(fd)
            self.fds[fd] = (st.st_ino, r)
            if stat.S_ISREG(st.st_mode) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
                self.log.append(("open", r, st.st_ino, not existed, bool(flags & os.O_TRUNC)))
        return fd

    def write(self, fd, data):
        n = self.real["write"](fd, data)
        if fd in self.fds:
            end = os.lseek(fd, 0, os.SEEK_CUR)  # after an O_APPEND write too, the file's end
            self.log.append(("write", self.fds[fd][0], end - n, bytes(memoryview(data)[:n])))
        return n

    def ftruncate(self, fd, size):
        self.real["ftruncate"](fd, size)
        if fd in self.fds:
            self.log.append(("truncate", self.fds[fd][0], size))

    def _sync(self, name, fd):
        self.real[name](fd)
        if fd in self.fds:
            ino, r = self.fds[fd]
            self.log.append(("sync", ino, r, stat.S_ISDIR(os.fstat(fd).st_mode)))

    def fsync(self, fd):
        self._sync("fsync", fd)

    def fdatasync(self, fd):
        self._sync("fdatasync", fd)

    def close(self, fd):
        self.fds.pop(fd, None)  # first: the number may be reused by another thread once closed
        self.real["close"](fd)

    def _move(self, name, src, dst):
        self.real[name](src, dst)
        a, b = self.rel(src), self.rel(dst)
        if a is not None and b is not None:
            self.log.append(("rename", a, b))

    def replace(self, src, dst):
        self._move("replace", src, dst)

    def rename(self, src, dst):
        self._move("rename", src, dst)

    def unlink(self, path):
        self.real["unlink"](path)
        r = self.rel(path)
        if r is not None:
            self.log.append(("unlink", r))

    def mkdir(self, path, mode=0o777):
        self.real["mkdir"](path, mode)
        r = self.rel(path)
        if r is not None:
            self.log.append(("mkdir", r))


def install(log: str, root: str) -> Recorder:
    """Record, in this process, every change the seam makes under ``root`` into ``log``."""
    rec = Recorder(log, root)
    for name in NAMES:
        setattr(fsio, name, getattr(rec, name))
    os.register_at_fork(after_in_child=rec.log.forked)
    return rec


def mark(log: str, *what) -> None:
    """Append a record of the test's own (``("ack", n)``, ...) to ``log``."""
    _Log(log).append(("mark", *what))


def read_log(path: str | Path) -> list[tuple]:
    """Every record of ``path``, in order (a record cut short by a kill at the end is left out)."""
    data, out, at = Path(path).read_bytes(), [], 0
    while at + _LEN.size <= len(data):
        (n,) = _LEN.unpack_from(data, at)
        if at + _LEN.size + n > len(data):
            break
        out.append(pickle.loads(data[at + _LEN.size:at + _LEN.size + n]))
        at += _LEN.size + n
    return out


# --------------------------------------------------------------------------- the disk


def snapshot_tree(root: Path) -> dict:
    """The directory as the recording starts: ``{"dirs": [...], "files": {path: (inode, bytes)}}``
    (paths under ``root``); it must be on disk then (``os.sync()`` first)."""
    dirs, files = [], {}
    for d, subdirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs.append(rel)
        for n in names:
            p = os.path.join(d, n)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                files[os.path.normpath(os.path.join(rel, n))] = (st.st_ino, Path(p).read_bytes())
    return {"dirs": dirs, "files": files}


class Disk:
    """The durable and the volatile state of the files under the root, record by record.

    A file is known by an identity of its own: the inode number of a file
    created now, as the records give it, until a file created later reuses it."""

    def __init__(self, tree: dict) -> None:
        self.file: dict[int, int] = {}          # inode number -> the file that has it now
        self.data: dict[int, bytearray] = {}    # file -> what a read sees
        self.synced: dict[int, bytes] = {}      # file -> what its last fsync made durable
        self.since: dict[int, list] = {}        # file -> changes since then
        self.entries: dict[str, dict] = {}      # directory -> {name: file, or "dir"}
        self.durable: dict[str, dict] = {}      # directory -> entries at its last fsync
        self.pending: dict[str, list] = {}      # directory -> entry changes since then
        for d in tree["dirs"]:
            self.entries[os.path.normpath(d)] = {}
        for d in tree["dirs"]:
            if d != ".":
                self.entries[os.path.dirname(d) or "."][os.path.basename(d)] = "dir"
        for path, (ino, content) in tree["files"].items():
            f = self._new(ino, content)
            self.synced[f] = bytes(content)
            self.entries[os.path.dirname(path) or "."][os.path.basename(path)] = f
        self.durable = {d: dict(e) for d, e in self.entries.items()}
        self.pending = {d: [] for d in self.entries}

    def _new(self, ino: int, content: bytes = b"") -> int:
        f = self.file[ino] = len(self.data)
        self.data[f], self.synced[f], self.since[f] = bytearray(content), None, []
        return f

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        return os.path.dirname(path) or ".", os.path.basename(path)

    def _dir_change(self, d: str, change: tuple) -> None:
        self.entries.setdefault(d, {})
        self.durable.setdefault(d, {})
        _apply_entry(self.entries[d], change)
        self.pending.setdefault(d, []).append(change)

    def _file_change(self, ino: int, change: tuple) -> None:
        _apply_content(self.data[ino], change)
        self.since[ino].append(change)

    def apply(self, rec: tuple) -> None:
        kind = rec[0]
        if kind == "open":
            _, path, ino, created, trunc = rec
            f = self._new(ino) if created or ino not in self.file else self.file[ino]
            d, name = self._split(path)
            if created or self.entries.get(d, {}).get(name) != f:
                self._dir_change(d, ("set", name, f))
            if trunc and self.data[f]:
                self._file_change(f, ("truncate", 0))
        elif kind == "write":
            self._file_change(self.file[rec[1]], ("write", rec[2], rec[3]))
        elif kind == "truncate":
            self._file_change(self.file[rec[1]], ("truncate", rec[2]))
        elif kind == "sync":
            _, ino, path, is_dir = rec
            if is_dir:
                d = os.path.normpath(path)
                self.durable[d] = dict(self.entries.get(d, {}))
                self.pending[d] = []
            else:
                f = self.file[ino]
                self.synced[f], self.since[f] = bytes(self.data[f]), []
        elif kind == "rename":
            (da, a), (db, b) = self._split(rec[1]), self._split(rec[2])
            if da != db:
                raise ValueError(f"a rename across directories is not modelled: {rec}")
            self._dir_change(da, ("move", a, b))
        elif kind == "unlink":
            d, name = self._split(rec[1])
            self._dir_change(d, ("drop", name))
        elif kind == "mkdir":
            d, name = self._split(rec[1])
            self._dir_change(d, ("set", name, "dir"))
            self.entries.setdefault(os.path.normpath(rec[1]), {})

    def state(self, model: str, rng: random.Random, lose: int | None = None) -> dict[str, bytes | None]:
        """``{path: content}`` of every file the disk holds after a cut now
        (``None`` for a directory), under ``model`` (``"sync"``, ``"prefix"``,
        or ``"reorder"``: the file of inode ``lose`` holds only what it synced,
        every other file and directory all that was done to it)."""
        def kept(changes: list) -> list:
            if model == "reorder":
                return changes
            return changes[:rng.randint(0, len(changes))] if model == "prefix" else []

        entries = {}
        for d, durable in self.durable.items():
            e = dict(durable)
            for change in kept(self.pending.get(d, [])):
                _apply_entry(e, change)
            entries[d] = e
        lost = self.file.get(lose) if lose is not None else None
        content: dict[int, bytes] = {}
        for f, synced in self.synced.items():
            base = bytearray(synced or b"")
            if f != lost:
                for change in kept(self.since[f]):
                    _apply_content(base, change)
            if model == "prefix":
                changes = self.since[f]
                if changes and rng.random() < 0.5 and changes[-1][0] == "write" and len(base) > len(synced or b""):
                    del base[rng.randint(len(synced or b""), len(base) - 1):]  # the last write torn
            content[f] = bytes(base)
        out: dict[str, bytes | None] = {}

        def walk(d: str) -> None:
            for name, f in entries.get(d, {}).items():
                path = os.path.normpath(os.path.join(d, name))
                if f == "dir":
                    out[path] = None
                    walk(path)
                else:
                    out[path] = content.get(f, b"")
        walk(".")
        return out


def _apply_entry(entries: dict, change: tuple) -> None:
    if change[0] == "set":
        entries[change[1]] = change[2]
    elif change[0] == "move":
        if change[1] in entries:
            entries[change[2]] = entries.pop(change[1])
    elif change[0] == "drop":
        entries.pop(change[1], None)


def _apply_content(data: bytearray, change: tuple) -> None:
    if change[0] == "write":
        _, at, chunk = change
        if len(data) < at:
            data.extend(bytes(at - len(data)))
        data[at:at + len(chunk)] = chunk
    else:
        del data[change[1]:]


def materialize(state: dict[str, bytes | None], where: Path) -> None:
    """Write the disk ``state`` (:meth:`Disk.state`) out as the directory ``where``."""
    where.mkdir(parents=True)
    for path, content in sorted(state.items()):
        target = where / path
        if content is None:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)


def disk_at(tree: dict, records: list[tuple], cut: int, model: str, rng: random.Random) -> dict:
    """The disk a power cut leaves after the first ``cut`` records. With
    ``"reorder"`` the next record must be a file's sync: that file loses what
    the sync would have made durable, everything else keeps all it was given
    (nothing orders unsynced writes to two files)."""
    disk = Disk(tree)
    for rec in records[:cut]:
        if rec[0] != "mark":
            disk.apply(rec)
    lose = None
    if model == "reorder":
        if cut >= len(records) or records[cut][0] != "sync" or records[cut][3]:
            raise ValueError(f"a reorder cut must come just before a file's sync, not {records[cut:cut + 1]}")
        lose = records[cut][1]
    return disk.state(model, rng, lose)


def store_rows(db: Path, scratch: Path) -> list[str]:
    """The rows of the SQLite store ``db``, read from a copy in ``scratch`` (with
    its write-ahead log: a killed server's is read as SQLite recovers it)."""
    scratch.mkdir(parents=True)
    if not db.exists():
        raise FileNotFoundError(db)
    for suffix in ("", "-wal"):
        src = Path(str(db) + suffix)
        if src.exists():
            (scratch / (db.name + suffix)).write_bytes(src.read_bytes())
    con = sqlite3.connect(str(scratch / db.name))
    try:
        return list(con.iterdump())
    finally:
        con.close()
