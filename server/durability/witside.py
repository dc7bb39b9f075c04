"""Witness payloads that an engine worker writes itself, beside the witness log.

An engine worker's batch of thousands of subscriptions' witnesses is about a kilobyte an
event, nearly all of it the witnesses' JSON. Carried through the main process, that is
what the main process spends most on per event: reading it from the worker's pipe,
its CRC, writing it (BENCHMARKS.md, "Engine workers, round 12"). So a worker writes a
batch's payloads to a file of its own in the witness log's directory (:class:`SideWriter`), and
sends back where it put them (:class:`Ref`: the file, the offset and length of the framed
payloads). The main process numbers the batch as before and writes a record of kind 3
(witrecords.py): the sids, seqs and streams of the witnesses, and the ``Ref`` instead of
the payloads. Readers (witcursor.py, and the main process for a subscription a client
watches live) read the payloads from the file (:class:`SideReader`).

The files: ``side-<tag>-<n>.dat``, ``tag`` unique to a worker process (its number and a
random part: a restarted worker never appends to a file its predecessor may have left torn),
framed by :mod:`server.durability.framing` (kind ``P``); one record per batch, the
MessagePack array of its payloads, whose bytes the main process can put in place of the
payloads without unpacking them. A file is at most about ``max_bytes``; then the writer
starts the next. The witness log deletes a file once no retained segment refers to it
(witlog.py's retention), and at its opening every one that none refers to (what a worker
wrote and the main process never logged: a kill between the two). It fsyncs the files its
records refer to before its own segments (:meth:`WitnessLog.sync`).

A worker that cannot write (a full disk, any OSError) sends the payloads in its result as
before: the main process then meets the full disk itself, and holds the batch as it does.

No numpy, no threads: the worker imports this.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import weakref
from collections import deque
from pathlib import Path
from typing import NamedTuple

import msgspec

from server.durability import framing, fsio
from server.durability.framing import BadRecord

#: A file's name: ``side-<tag>-<n>.dat``.
PATTERN = re.compile(r"^side-[A-Za-z0-9]+-[0-9a-f]+-\d{6}\.dat$")
#: A file's size at which its writer starts the next.
MAX_FILE = 64 << 20

_unpack_payloads = msgspec.msgpack.Decoder(list[bytes]).decode


class Ref(NamedTuple):
    """Where a batch's payloads are: the file's name (in the witness log's directory), the
    offset and the length of their framed record."""

    name: str
    offset: int
    length: int


def is_side_file(name: str) -> bool:
    return PATTERN.match(name) is not None


class SideWriter:
    """Appends batches' payloads to files of its own under ``directory`` (one writer: a worker)."""

    def __init__(self, directory: str | os.PathLike, worker: int, max_bytes: int = MAX_FILE) -> None:
        self.dir = Path(directory)
        self.tag = f"w{worker}-{secrets.token_hex(4)}"
        self.max_bytes = max_bytes
        self._n = 0
        self._fd: int | None = None
        self._name = ""
        self._size = 0

    def write(self, payloads: bytes | memoryview) -> Ref:
        """Append one record of ``payloads`` (a packed array); where it is. Raises OSError when it
        cannot be written whole (what was written of it is cut off again, or the file is left)."""
        if self._fd is None or self._size >= self.max_bytes:
            self._next()
        off = self._size
        head = framing.frame_head(payloads)
        try:
            framing.write_all(self._fd, head)
            framing.write_all(self._fd, payloads)
        except OSError:
            self._drop(off)
            raise
        self._size = off + len(head) + len(payloads)
        return Ref(self._name, off, len(head) + len(payloads))

    def _next(self) -> None:
        self.close()
        self._n += 1
        name = f"side-{self.tag}-{self._n:06d}.dat"
        path = self.dir / name
        try:  # (never another's: a file of that name is never emptied)
            fd = fsio.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:
            self.tag = f"{self.tag.partition('-')[0]}-{secrets.token_hex(4)}"
            self._n -= 1
            return self._next()
        size = framing.start_segment(fd, path, framing.PAYLOADS, None)
        self._fd, self._name, self._size = fd, name, size

    def _drop(self, off: int) -> None:
        """A failed write: cut the file back to its last whole record, or leave it (the next write
        starts a new file: a reader never meets the torn part, which no record refers to)."""
        try:
            fsio.ftruncate(self._fd, off)
        except OSError:
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fsio.close(fd)


class SideReader:
    """Reads payloads by :class:`Ref` from the files under ``directory``, each file opened once
    (one reader per thread). Made by :meth:`SideFiles.reader`, it is told of the files the
    witness log deletes or sets aside (:meth:`forget`, from any thread) and closes them at its
    next read: a deleted file's room on disk is given back once no reader holds it open."""

    def __init__(self, directory: str | os.PathLike, max_open: int = 8) -> None:
        self.dir = Path(directory)
        self.max_open = max_open
        self._files: dict[str, object] = {}
        self._gone: deque[str] = deque()  # names forget() was given (appended and taken atomically)

    def payloads(self, ref) -> list[bytes]:
        """The payloads ``ref`` (a :class:`Ref`, or its fields as a list) points at. Raises OSError
        (the file is gone), :class:`BadRecord` (not whole there: a power cut took the end of a file
        the record that refers to it survived) or ``msgspec.DecodeError``."""
        return _unpack_payloads(self.read(ref))

    def read(self, ref) -> bytes | memoryview:
        """:meth:`payloads`, still packed (a MessagePack array)."""
        name, off, length = ref
        data = self._pread(name, length, off)
        payload, _end = framing.unframe(data, 0, len(data))
        return payload

    def span(self, ref, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` of the packed payloads ``ref`` points at, read alone (no CRC:
        for the main process's live delivery of a batch the worker has just written whole; a
        cursor reads the record whole, :meth:`payloads`). Raises OSError or :class:`BadRecord`."""
        name, off, length = ref
        if not 0 <= start <= end <= length - framing.FRAME.size:
            raise BadRecord(f"bytes {start}-{end} are not in the {length} bytes of a record of {name!r}")
        data = self._pread(name, end - start, off + framing.FRAME.size + start)
        if len(data) != end - start:
            raise BadRecord(f"{name!r} ends before byte {off + framing.FRAME.size + end}")
        return data

    def _pread(self, name: str, length: int, off: int) -> bytes:
        if self._gone:
            self._close_gone()
        f = self._files.get(name)
        gone = False
        if f is None:
            if not is_side_file(name):
                raise BadRecord(f"{name!r} is not the name of a payload file")
            f = self._files[name] = open(self.dir / name, "rb")
            # deleted between opening and being listed, forget() may not have seen it here: read, not kept
            gone = os.fstat(f.fileno()).st_nlink == 0
            if len(self._files) > self.max_open:  # (read in order, as a rule: the oldest is done with)
                oldest = next(iter(self._files))
                self._files.pop(oldest).close()
        try:
            return os.pread(f.fileno(), length, off)
        finally:
            if gone and self._files.get(name) is f:
                self._files.pop(name).close()

    def forget(self, names) -> None:
        """``names`` were deleted (or renamed): those this reader holds are closed at its next read
        (any thread; a file it opens later and finds deleted is not kept: :meth:`read`)."""
        self._gone.extend([n for n in names if n in self._files])

    def held(self) -> list[str]:
        """The files this reader holds open (the reader's thread)."""
        if self._gone:
            self._close_gone()
        return list(self._files)

    def _close_gone(self) -> None:
        while self._gone:
            f = self._files.pop(self._gone.popleft(), None)
            if f is not None:
                f.close()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def listing(directory: Path) -> list[Path]:
    """The payload files under ``directory``."""
    return [p for p in directory.iterdir() if is_side_file(p.name)]


class SideFiles:
    """What the witness log (witlog.py, its writer's thread and :meth:`sync`'s, under its lock)
    knows of the payload files under ``directory``: those referred to since the last sync, those
    deleted segments referred to, and each worker's newest (which its next record may refer to;
    a restarted worker's files are new ones: its predecessor's are then deleted like the others)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.unsynced: set[str] = set()
        self.done: set[str] = set()
        self.newest: dict[str, str] = {}  # worker ("w<N>") -> the newest of its files referred to
        self._readers: weakref.WeakSet[SideReader] = weakref.WeakSet()
        self._readers_lock = threading.Lock()  # (readers are made on any thread)

    def reader(self) -> SideReader:
        """A reader of the files, told of each one deleted or set aside from now on."""
        r = SideReader(self.dir)
        with self._readers_lock:
            self._readers.add(r)
        return r

    def _gone(self, names: list[str]) -> None:
        if names:
            with self._readers_lock:
                readers = list(self._readers)
            for r in readers:
                r.forget(names)

    def referred(self, name: str) -> bool:
        """A record refers to ``name``: whether the log's directory has a new entry to sync."""
        self.unsynced.add(name)
        worker = name.split("-", 2)[1]
        new = self.newest.get(worker) != name
        self.newest[worker] = name
        return new

    def take_unsynced(self) -> list[Path]:
        names, self.unsynced = sorted(self.unsynced), set()
        return [self.dir / name for name in names]

    def put_back(self, paths: list[Path]) -> None:
        """Paths :meth:`take_unsynced` gave that were not synced (with others: only its own are kept)."""
        self.unsynced.update(p.name for p in paths if is_side_file(p.name))

    def drop(self, deleted: dict[str, int], kept: set[str]) -> None:
        """A segment that referred to ``deleted`` was deleted: delete each file no retained segment
        refers to (``kept``), unless a writer may still append to it."""
        self.done.update(deleted)
        kept = kept | set(self.newest.values())
        doomed = [n for n in self.done if n not in kept]
        for name in doomed:
            self.done.discard(name)
            fsio.remove(self.dir / name)
        self._gone(doomed)

    def set_aside(self, names: set[str], kept: set[str]) -> list[str]:
        """Segments that referred to ``names`` were set aside (``*.dropped``, recovery): rename the
        files no other segment refers to (``kept``) ``*.dropped`` too, so that those segments can
        still be read whole by someone who inspects them, and nothing deletes them as orphans."""
        moved = sorted(n for n in names if n not in kept)
        for name in moved:
            fsio.rename(self.dir / name, self.dir / (name + ".dropped"))
        self.done.difference_update(moved)
        self._gone(moved)
        return moved

    def sizes(self) -> dict[str, int]:
        """Each payload file's size (what a record may refer to of it)."""
        return {p.name: p.stat().st_size for p in listing(self.dir)}

    def drop_orphans(self, referred: set[str]) -> None:
        """At the log's opening (no worker runs): delete the files no segment refers to."""
        orphans = [p for p in listing(self.dir) if p.name not in referred]
        for path in orphans:
            fsio.remove(path)
        self._gone([p.name for p in orphans])
