"""What cannot be written to the data directory now (a full disk, mostly).

A write to the journal, the witness log, the SQLite store or a snapshot that
fails with an ``OSError`` (ENOSPC, EDQUOT, EIO, ...) or SQLite's "database or
disk is full" becomes a :class:`DiskFull`: the write is cut back to its last
whole record, what it carried is refused (never half accepted), and the
callers turn it into a refusal the client can act on -- ``error: disk full:
...`` on TCP, HTTP 507 on the API. :class:`DiskState` remembers, per part of
the data directory, the failure that lasts, for ``/health`` and ``/metrics``,
and logs once when an episode starts and once when it ends, not for every
refused line. An episode also ends without a client writing: while one lasts, a
thread (``cayuga-disk-retry``) calls the part's retry (:meth:`DiskState.retry_with`:
the journal's probe, the store's small write) every :data:`RETRY_SECONDS`,
doubling to :data:`RETRY_MAX_SECONDS`, and ends when no episode is left; so once
space is freed ``/readyz`` turns 200 by itself (issue 33). The witness log and
snapshots are retried by the engine thread already. No sockets, no FastAPI.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("cayuga.disk")

#: errno values that mean "no room" (anything else is reported as a disk error).
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
#: SQLite's primary result codes for a full disk and an I/O error.
SQLITE_FULL, SQLITE_IOERR = 13, 10
#: While a part cannot be written, its retry runs after this many seconds, then twice as
#: long each time up to RETRY_MAX_SECONDS (bounded: one small write per part and period).
RETRY_SECONDS = 0.5
RETRY_MAX_SECONDS = 5.0
#: What each part of the data directory is called in messages.
PARTS = {"journal": "the journal", "witness_log": "the witness log", "store": "the SQLite store",
         "snapshot": "a snapshot"}


class DiskFull(Exception):
    """``what`` could not be written to ``path`` (``reason``: the OS's words).
    ``kind`` is "disk full" for ENOSPC/EDQUOT/SQLITE_FULL, "disk error" otherwise."""

    def __init__(self, part: str, what: str, path: str | Path, reason: str, kind: str = "disk full",
                 first_refused: int = 0) -> None:
        self.part, self.what, self.path, self.reason, self.kind = part, what, str(path), reason, kind
        #: set by DelayQueue.put_batch: the index of the first event of the call not accepted
        self.first_refused = first_refused
        super().__init__(f"{kind}: {what} ({reason})")

    def refusing_from(self, index: int) -> "DiskFull":
        """A copy that says the events from ``index`` on were not accepted."""
        return DiskFull(self.part, self.what, self.path, self.reason, self.kind, index)

    @classmethod
    def from_os(cls, part: str, what: str, path: str | Path, exc: OSError) -> "DiskFull":
        reason = exc.strerror or str(exc) or type(exc).__name__
        return cls(part, what, path, reason, "disk full" if exc.errno in NO_SPACE else "disk error")

    @property
    def hint(self) -> str:
        """What to do about it."""
        if self.kind == "disk full":
            return f"free space on the file system of {self.path}; the server resumes by itself once it can write"
        return f"check the file system of {self.path} (the server retries the write)"


def store_error(exc: sqlite3.Error, path: str | Path, what: str) -> DiskFull | None:
    """The :class:`DiskFull` a SQLite error stands for (None: another kind of error)."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc)
    if primary == SQLITE_FULL or "disk is full" in text:
        return DiskFull("store", what, path, text, "disk full")
    if primary == SQLITE_IOERR or "disk I/O error" in text:
        return DiskFull("store", what, path, text, "disk error")
    return None


@contextmanager
def storing(store, disk: "DiskState", what: str):
    """A write to the SQLite ``store``: one that fails for a full disk (or an
    I/O error) raises :class:`DiskFull` saying ``what`` could not be done, and
    ``disk`` notes the failure (a write that works ends it)."""
    try:
        yield
    except sqlite3.Error as exc:
        failure = store_error(exc, store.path, what)
        if failure is None:
            raise
        disk.failed(failure)
        raise failure from None
    disk.recovered("store")


@dataclass
class _Episode:
    error: DiskFull
    since: float  # time.time()
    count: int = 1


class DiskState:
    """Per part of the data directory, the write failure that lasts (thread-safe).

    :meth:`failed` notes one (logged at ERROR when the episode starts),
    :meth:`recovered` ends it (logged at WARNING); :meth:`current` is what
    /health reports. While an episode of a part with a retry lasts, the
    retry thread tries it (see the module docstring); :meth:`close` stops it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._episodes: dict[str, _Episode] = {}
        self.episodes = 0  # episodes started since start-up (all parts)
        self._retries: dict[str, Callable[[], bool]] = {}
        self._retrier: threading.Thread | None = None
        self._closed = False
        self.retried = 0  # retries run (all parts)

    def retry_with(self, part: str, retry: Callable[[], bool]) -> None:
        """While ``part`` cannot be written, call ``retry()`` now and then (on
        the retry thread). It tries the part without a client's write and,
        when it can be written again, ends the episode itself
        (:meth:`recovered`, under whatever lock orders it against the part's
        own writes); it returns whether it did."""
        self._retries[part] = retry

    def failed(self, exc: DiskFull) -> None:
        with self._lock:
            ep = self._episodes.get(exc.part)
            if ep is not None:
                ep.error, ep.count = exc, ep.count + 1
                return
            self._episodes[exc.part] = _Episode(exc, time.time())
            self.episodes += 1
            if exc.part in self._retries and self._retrier is None and not self._closed:
                self._retrier = threading.Thread(target=self._retry_loop, name="cayuga-disk-retry", daemon=True)
                self._retrier.start()
        log.error("%s: %s -- %s; refusing what needs it until it can be written (logged once per episode)",
                  exc.path, exc, exc.hint)

    def _retry_loop(self) -> None:
        delay = RETRY_SECONDS
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed, delay)
                due = [self._retries[p] for p in self._episodes if p in self._retries]
                if self._closed or not due:
                    self._retrier = None  # under the lock: a new episode starts another
                    return
            for retry in due:
                self.retried += 1
                try:
                    retry()
                except Exception:  # noqa: BLE001 - a retry that fails is tried again later
                    log.debug("a disk retry failed", exc_info=True)
            delay = min(delay * 2, RETRY_MAX_SECONDS)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the retry thread (the server is stopping)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            retrier = self._retrier
        if retrier is not None:
            retrier.join(timeout)

    def recovered(self, part: str) -> None:
        if part not in self._episodes:  # the common case, without the lock
            return
        with self._lock:
            ep = self._episodes.pop(part, None)
        if ep is not None:
            log.warning("%s can be written again (%s failed %d times over %.1f s)", PARTS.get(part, part),
                        ep.error.path, ep.count, time.time() - ep.since)

    def failing(self, part: str) -> DiskFull | None:
        ep = self._episodes.get(part)
        return ep.error if ep is not None else None

    def current(self) -> dict[str, dict]:
        """Per failing part: what failed, where, why, since when, how often."""
        with self._lock:
            return {part: {"error": str(ep.error), "path": ep.error.path, "since": ep.since, "failures": ep.count,
                           "hint": ep.error.hint}
                    for part, ep in self._episodes.items()}

    def __bool__(self) -> bool:
        return bool(self._episodes)
