"""The one record framing of the durable files -- journal segments, witness-log
segments and snapshots -- and the segment-file handling the two logs share.

**A file** starts with an 8-byte header, :data:`HEADER`: the magic ``CAYUGA``,
one byte naming what the file holds (:data:`JOURNAL` ``J``, :data:`WITNESS_LOG`
``W``, :data:`SNAPSHOT` ``S``, :data:`PAYLOADS` ``P``: an engine worker's witness
payloads, server/durability/witside.py) and the framing version (:data:`VERSION`, 2;
a witness-log segment's is 4, :data:`VERSIONS`: it may hold records whose payloads
are in a ``P`` file (3), told per subscription (4), which a Cayuga that reads only
2 or 3 would take for a torn tail).
Records follow, each ``<u32 length><u32 CRC32 of the 4 length bytes and the
payload><payload>`` (little-endian, ``zlib.crc32``): the length is under the
CRC, so a flipped bit in a length is caught like one in a payload.

**Older files** have no header (framing version 1): a journal segment's records
are ``<u32 length><u32 CRC32 of the payload><payload>``, a witness-log
segment's are already framed as above, and a snapshot is ``CAYUGASNAP1\\n``,
``>Q`` length, ``>I`` CRC32 of the payload, the payload. :func:`file_kind`
tells the two apart by the first bytes (a version-1 log starts with a record
length: ``CAYU`` would be one of 1.4 GB); the owner of the file reads the
version-1 records with ``legacy=True``. New files are always written in
version 2.

**The scan** (:class:`Scan`) walks whole records from an offset and stops at
the first that is short, beyond the data, of a length out of bounds or with a
CRC mismatch: nothing after a bad record is trusted (after a power loss,
unsynced pages may be lost in any order). Its ``good`` offset is where the
torn tail starts; :func:`cut_tail` truncates a file there. No sockets, no
threads.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path
from typing import Iterator, Sequence

from server.durability import fsio

#: The file header: magic, what the file holds, framing version.
HEADER = struct.Struct("<6scB")
MAGIC = b"CAYUGA"
VERSION = 2
JOURNAL, WITNESS_LOG, SNAPSHOT, PAYLOADS = b"J", b"W", b"S", b"P"
KINDS = {JOURNAL: "a journal segment", WITNESS_LOG: "a witness-log segment", SNAPSHOT: "a snapshot",
         PAYLOADS: "an engine worker's witness payloads"}
#: The newest framing version of each kind, which new files are written in (read: 2 up to it).
VERSIONS = {JOURNAL: VERSION, WITNESS_LOG: 4, SNAPSHOT: VERSION, PAYLOADS: VERSION}
#: A record's frame: payload length, CRC32 of (length, payload) -- of the payload alone with ``legacy``.
FRAME = struct.Struct("<II")
_LEN = struct.Struct("<I")
MAX_LENGTH = 0xFFFFFFFF

_crc32 = zlib.crc32


class FramingError(ValueError):
    """A file this version cannot read: another kind of file, or a framing
    version it does not know (written by a newer Cayuga)."""


class BadRecord(ValueError):
    """The record at an offset is not whole (the message says why)."""


def file_header(kind: bytes) -> bytes:
    """The 8 bytes a new file of ``kind`` starts with."""
    return HEADER.pack(MAGIC, kind, VERSIONS[kind])


def file_kind(data: bytes | memoryview, kind: bytes, where: str) -> int:
    """Where the records of a file starting with ``data`` begin: ``HEADER.size``
    for a version-2 file of ``kind``, 0 for a version-1 file (no header; also a
    file too short to tell, or one whose header was torn: its records are then
    found bad where they start). Raises :class:`FramingError` for a version-2
    header of another kind or a version this code does not know."""
    if len(data) < HEADER.size or bytes(data[:len(MAGIC)]) != MAGIC:
        return 0
    magic, got, version = HEADER.unpack_from(data, 0)
    if got != kind:
        what = KINDS.get(got, f"a file of kind {got!r}")
        raise FramingError(f"{where}: {what}, not {KINDS[kind]}: move it out of this directory")
    if not VERSION <= version <= VERSIONS[kind]:
        reads = f"{VERSION}" if VERSIONS[kind] == VERSION else f"{VERSION} to {VERSIONS[kind]}"
        raise FramingError(f"{where}: framing version {version}, which this Cayuga does not read "
                           f"(it reads {reads} and the older headerless 1): written by a newer Cayuga?")
    return HEADER.size


def frame(payload: bytes) -> bytes:
    """``payload`` framed: length, CRC32 of length and payload, payload (one copy)."""
    return frame_parts((payload,))


def frame_parts(parts: Sequence[bytes | memoryview]) -> bytes:
    """The frame of the payload ``b"".join(parts)``, joined once (with its head)."""
    n = sum(map(len, parts))
    crc = _crc32(_LEN.pack(n))
    for p in parts:
        crc = _crc32(p, crc)
    return b"".join((FRAME.pack(n, crc), *parts))


def frame_head(payload: bytes | memoryview) -> bytes:
    """The 8 bytes that go before ``payload`` in its frame (to write the two
    apart, without copying the payload)."""
    n = len(payload)
    return FRAME.pack(n, _crc32(payload, _crc32(_LEN.pack(n))))


def file_version(path: Path) -> int:
    """The framing version in the header of the file ``path`` (0: none, or not whole)."""
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
    return head[-1] if len(head) == HEADER.size and head.startswith(MAGIC) else 0


def unframe(buf: bytes | memoryview, pos: int, end: int, *, legacy: bool = False, min_length: int = 1,
            max_length: int = MAX_LENGTH) -> tuple[bytes | memoryview, int]:
    """The payload of the record at ``buf[pos:end]`` and where the next record
    starts; raises :class:`BadRecord` when it is not whole (short, a length
    out of ``[min_length, max_length]`` or beyond ``end``, a CRC mismatch).
    ``legacy``: the CRC covers the payload alone (a version-1 journal)."""
    if end - pos < FRAME.size:
        raise BadRecord(f"a record header cut short ({end - pos} of {FRAME.size} bytes)")
    n, crc = FRAME.unpack_from(buf, pos)
    start = pos + FRAME.size
    if n < min_length or n > max_length or start + n > end:
        raise BadRecord(f"a record of {n} bytes where {end - start} remain")
    payload = buf[start:start + n]
    if (_crc32(payload) if legacy else _crc32(payload, _crc32(buf[pos:pos + 4]))) != crc:
        raise BadRecord("a CRC mismatch")
    return payload, start + n


class Scan:
    """The whole records of ``buf[pos:end]``, in order: iterate for
    ``(offset, payload)``. When the iteration ends, ``good`` is the end of the
    last whole record and ``problem`` says why it stopped (None: at ``end``).
    A caller that finds a record it cannot use breaks out of the loop:
    ``good`` is then that record's offset, and the caller says the problem."""

    __slots__ = ("buf", "good", "end", "problem", "legacy", "min_length", "max_length")

    def __init__(self, buf: bytes | memoryview, pos: int = 0, end: int | None = None, *, legacy: bool = False,
                 min_length: int = 1, max_length: int = MAX_LENGTH) -> None:
        self.buf, self.good = buf, pos
        self.end = len(buf) if end is None else end
        self.problem: str | None = None
        self.legacy, self.min_length, self.max_length = legacy, min_length, max_length

    def __iter__(self) -> Iterator[tuple[int, bytes | memoryview]]:
        # unframe() inlined: this loop reads every record of a log when it is opened
        buf, end, legacy, lo, hi = self.buf, self.end, self.legacy, self.min_length, self.max_length
        unpack, crc32, size = FRAME.unpack_from, _crc32, FRAME.size
        pos = self.good
        while pos < end:
            start = pos + size
            if start > end:
                break
            n, crc = unpack(buf, pos)
            nxt = start + n
            if n < lo or n > hi or nxt > end:
                break
            payload = buf[start:nxt]
            if (crc32(payload) if legacy else crc32(payload, crc32(buf[pos:start - 4]))) != crc:
                break
            yield pos, payload
            pos = self.good = nxt
        if pos < end:
            try:  # says why
                unframe(buf, pos, end, legacy=legacy, min_length=lo, max_length=hi)
            except BadRecord as exc:
                self.problem = str(exc)


def walk(buf: bytes | memoryview, pos: int, end: int) -> Iterator[bytes | memoryview]:
    """The payloads of ``buf[pos:end]``, records a :class:`Scan` has already
    found whole (no CRC is checked again)."""
    unpack = FRAME.unpack_from
    while pos < end:
        n = unpack(buf, pos)[0]
        pos += FRAME.size
        yield buf[pos:pos + n]
        pos += n


# --------------------------------------------------------------------------- segment files


class SegmentNames:
    """Segment files named by a number: ``prefix``, the number zero-padded to
    ``digits``, ``suffix`` (``00000000000000000001.journal``, ``wit-000000000001.log``)."""

    def __init__(self, prefix: str, digits: int, suffix: str) -> None:
        self.prefix, self.digits, self.suffix = prefix, digits, suffix
        self._pattern = re.compile(rf"^{re.escape(prefix)}(\d+){re.escape(suffix)}$")

    def name(self, number: int) -> str:
        return f"{self.prefix}{number:0{self.digits}d}{self.suffix}"

    def number(self, name: str) -> int | None:
        m = self._pattern.match(name)
        return int(m.group(1)) if m else None

    def listing(self, directory: Path) -> list[tuple[int, Path]]:
        """(number, path) of the segments in ``directory``, by number."""
        found = [(n, p) for p in directory.iterdir() if (n := self.number(p.name)) is not None]
        return sorted(found)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a short write, as a full disk gives, goes on where it stopped)."""
    view, done = memoryview(data), 0
    while done < len(data):
        done += fsio.write(fd, view[done:])


def open_new(path: Path) -> int:
    """A new (emptied) segment file, opened for appending."""
    return fsio.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)


def start_segment(fd: int, path: Path, kind: bytes, first: bytes | None) -> int:
    """Write the file header and the record ``first`` (None: none) to the new
    segment ``path`` open as ``fd``; returns its size. One that cannot be
    written whole is closed and removed again, and the ``OSError`` raised."""
    data = file_header(kind) + (frame(first) if first is not None else b"")
    try:
        write_all(fd, data)
    except OSError:
        fsio.close(fd)
        fsio.remove(path)
        raise
    return len(data)


def open_segment(path: Path) -> int:
    """An existing segment, opened for appending."""
    return fsio.open(path, os.O_WRONLY | os.O_APPEND)


def cut_tail(path: Path, size: int) -> None:
    """Truncate ``path`` to ``size`` (the end of its last whole record) and fsync it."""
    fd = fsio.open(path, os.O_WRONLY)
    try:
        fsio.ftruncate(fd, size)
        fsio.fsync(fd)
    finally:
        fsio.close(fd)


def fsync_dir(directory: Path) -> None:
    """fsync a directory (its entries: files created, renamed, deleted)."""
    fsio.sync_dir(directory)
