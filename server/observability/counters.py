"""Named event counters: the receivers, the API and the engine thread bump them; scrapes read them.

:class:`Counters` is a thread-safe bag of integers, read at scrape time by the
metrics collector (metrics.py) and /stats, so hot paths only add.
"""

from __future__ import annotations

import threading
from collections import Counter


class Counters:
    """Thread-safe named counters (receivers and the API write; scrapes read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c: Counter[str] = Counter()

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._c[key] += n

    def get(self, key: str) -> int:
        with self._lock:
            return self._c[key]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._c)
