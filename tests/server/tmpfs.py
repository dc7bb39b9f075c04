"""A small real tmpfs to fill up: the full disk of issue 19, for tests.

Mounting needs root (CI and the sessions run as root); elsewhere the tests
that use it are skipped with the reason, and under ``CI=true`` they fail with
it (tests/conftest.py ``unavailable``): a CI machine that cannot mount would
otherwise pass without running any of them. The mount is always undone, also
when the test fails."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from tests.conftest import unavailable


@contextlib.contextmanager
def tmpfs(where: Path, size: str):
    """A tmpfs of ``size`` (``mount -o size=``) mounted on a new directory under ``where``."""
    if os.geteuid() != 0:
        unavailable("mounting a tmpfs (a small disk to fill) needs root; CI runs these tests as root")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        unavailable("no mount/umount command to mount a tmpfs with")
    mnt = Path(where) / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mnt.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        mnt.rmdir()
        unavailable(f"mount -t tmpfs is not permitted here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        undone = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=30)
        if undone.returncode != 0:  # something still holds a file: detach it lazily
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
        with contextlib.suppress(OSError):
            mnt.rmdir()


def fill(mnt: Path, leave: int = 0, name: str = "filler") -> Path:
    """Fill ``mnt`` with a file until at most ``leave`` bytes are free; returns the file."""
    path = mnt / name
    chunk = b"\0" * (1 << 16)
    with open(path, "ab") as f:
        while True:
            free = shutil.disk_usage(mnt).free
            if free <= leave:
                break
            try:
                f.write(chunk[:max(min(len(chunk), free - leave), 1)])
                f.flush()
            except OSError:
                break
    return path


def free_space(mnt: Path) -> int:
    return shutil.disk_usage(mnt).free
