"""One seam for the system calls that change the durable files: the journal
(journal.py), the witness log (witlog.py), snapshots (snapshot.py) and the
framing they share (framing.py) open for writing, write, truncate, sync,
rename and remove their files, and create and sync their directories, only
through these names, never through ``os`` directly. Reading needs no seam.

Each name is the ``os`` function itself (``write = os.write``): a call
``fsio.write(fd, data)`` costs what ``os.write(fd, data)`` costs, one
attribute lookup, so the hot paths (a journal append, a witness batch) pay
nothing for it. A test may replace them in a process to record what was
written and what was made durable, and so build the disk a power cut would
leave at any point (tests/server/powercut.py); nothing else does. The helpers
below call the names, so they follow a replacement.
"""

from __future__ import annotations

import os
from pathlib import Path

open = os.open  # noqa: A001 - the os function, as os names it
write = os.write
ftruncate = os.ftruncate
fsync = os.fsync
fdatasync = os.fdatasync
close = os.close
replace = os.replace
rename = os.rename
unlink = os.unlink
mkdir = os.mkdir


def remove(path: str | os.PathLike) -> None:
    """Remove ``path`` if it is there."""
    try:
        unlink(path)
    except FileNotFoundError:
        pass


def sync_dir(directory: str | os.PathLike) -> None:
    """fsync a directory: its entries (files created, renamed, removed) are durable."""
    fd = open(directory, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        close(fd)


def makedirs(path: str | os.PathLike) -> None:
    """Create ``path`` and its missing parents (none is an error if it
    exists), each durably: the parent of every directory created is synced,
    so that a power cut cannot take a new directory, and what was synced in
    it, away (tests/server/test_powercut.py)."""
    missing = []
    p = Path(path)
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            mkdir(d)
        except FileExistsError:
            if not d.is_dir():
                raise
            continue
        sync_dir(d.parent)


def write_file(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` as the whole content of ``path`` (created or emptied); no sync."""
    fd = open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view, done = memoryview(data), 0
        while done < len(data):
            done += write(fd, view[done:])
    finally:
        close(fd)
