"""The audit log: who changed what, and who failed to authenticate.

One JSON object a line in ``data_dir/audit/audit.log``, appended (the file is
opened with O_APPEND and each record is written whole by one ``write``), never
rewritten. Beyond ``audit_log_bytes`` the file is rotated: ``audit.log``
becomes ``audit.log.1``, ``audit.log.1`` becomes ``audit.log.2`` and so on;
``audit_log_files`` files are kept in all, the oldest is deleted.

A record: ``time`` (UTC, ISO 8601, milliseconds), ``action``, ``token`` (the
token's *name* from auth_tokens, never its secret; null on a server without
tokens, or when no token was recognised), ``address`` (the client's IP),
``port`` (``http`` or ``tcp``), and what the action needs:

- ``subscription.register``: ``subscriptions`` (ids), ``names``;
- ``subscription.delete``: ``subscriptions`` (ids deleted, a cascade's too);
- ``stream.declare``: ``stream``, ``schema``;
- ``auth.failure``: ``reason`` (``missing``: no token; ``wrong``: not one of
  the server's; ``scope``: a known token without the scope or the reach the
  request needs), ``what`` (the request). Every wrong token is written (the
  backoff bounds them per address); a missing token or scope at most once a
  minute per address (and token), with ``repeated``: how many more were refused
  since the last record of that kind, so that a flood of requests without a
  token cannot rotate the records of changes out of the log (the metric counts
  them all);
- ``auth.throttled``: ``failures``, ``wait_seconds``: the address sent too many
  wrong tokens and is slowed down (server/security/throttle.py); the attempts
  refused while it waits are counted in ``cayuga_auth_failures_total``, not
  written here one by one.

Records of changes are synced to disk before the API answers; those of
failures are written (they survive the server's crash, not the machine's).
A record that cannot be written (a full disk) is counted
(``cayuga_audit_write_errors_total``) and logged; the change it describes
stands.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from server.observability.counters import Count, Counters

log = logging.getLogger("cayuga.audit")

FILE = "audit.log"
#: Actions whose records are synced before the API answers.
CHANGES = ("subscription.register", "subscription.delete", "stream.declare")


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


class AuditLog:
    def __init__(self, directory: str | Path, max_bytes: int, files: int, counters: Counters | None = None) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.files = files
        self.counters = counters
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._failing = False

    @property
    def path(self) -> Path:
        return self.dir / FILE

    def _open(self) -> int:
        if self._fd is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._size = os.fstat(self._fd).st_size
        return self._fd

    def _rotate(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for k in range(self.files - 1, 0, -1):
            older = self.dir / f"{FILE}.{k}"
            newer = self.dir / (FILE if k == 1 else f"{FILE}.{k - 1}")
            if newer.exists():
                os.replace(newer, older)  # the oldest kept (audit.log.<files-1>) is replaced: deleted
        if self.files == 1:
            self.path.unlink(missing_ok=True)

    def record(self, action: str, *, token: str | None, address: str | None, port: str = "http",
               **fields) -> None:
        """Append one record (see the module docstring); never raises."""
        line = json.dumps({"time": _now(), "action": action, "token": token, "address": address, "port": port,
                           **fields}, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        with self._lock:
            try:
                if self._size and self._size + len(line) > self.max_bytes:
                    self._rotate()
                fd = self._open()
                written = os.write(fd, line)
                if written != len(line):  # a full disk took part of it: cut it back, refuse
                    os.ftruncate(fd, self._size)
                    raise OSError(28, "No space left on device (the record was cut back)")
                self._size += written
                if action in CHANGES:
                    os.fdatasync(fd)
                if self._failing:
                    self._failing = False
                    log.warning("the audit log %s can be written again", self.path)
            except OSError as exc:
                if self.counters is not None:
                    self.counters.add(Count.AUDIT_WRITE_ERRORS)
                if not self._failing:
                    self._failing = True
                    log.error("cannot write the audit log %s: %s; %s records are not kept until it can be "
                              "written (free space, check its permissions)", self.path, exc, action)

    def read(self, limit: int = 100, *, action: str | None = None, token: str | None = None,
             subscription: str | None = None, address: str | None = None) -> tuple[list[dict], bool]:
        """The newest ``limit`` records that match every filter given, oldest
        first, across the rotated files; and whether older ones match too."""
        found: list[dict] = []
        with self._lock:  # no rotation meanwhile
            paths = [self.path] + [self.dir / f"{FILE}.{k}" for k in range(1, self.files)]
            for path in paths:
                try:
                    lines = path.read_bytes().splitlines()
                except FileNotFoundError:
                    continue
                for raw in reversed(lines):
                    try:
                        rec = json.loads(raw)
                    except ValueError:  # a record cut short by a crash: skipped
                        continue
                    if ((action is None or rec.get("action") == action)
                            and (token is None or rec.get("token") == token)
                            and (address is None or rec.get("address") == address)
                            and (subscription is None or subscription in (rec.get("subscriptions") or ()))):
                        if len(found) == limit:
                            return found[::-1], True
                        found.append(rec)
        return found[::-1], False

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
