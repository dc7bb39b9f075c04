"""Per-subscription integers — the last seq numbered or logged, a count of
witnesses — in arrays indexed by a number per subscription, so that a batch's
thousands of subscriptions are numbered and indexed by a few array operations
rather than a pass of dict lookups each (issue 32: with 10,000 subscriptions
the main process spent most of its time hashing their ids, BENCHMARKS.md
"Engine workers, round 3").

:class:`Numbers` gives each subscription id a number (dense, from 0, never
given again in the process); :class:`SeqMap` is a mutable mapping from id to
int with a dict's behaviour for every other caller (``get``, ``[]``,
``items``...) and array operations for the engine thread's batches."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence

import numpy as np


def grown(a: np.ndarray, size: int, fill=0) -> np.ndarray:
    """``a``, or a copy of it at least ``size`` long (twice as long at least), the new places ``fill``."""
    if size <= len(a):
        return a
    out = np.full(max(size, 2 * len(a)), fill, a.dtype)
    out[:len(a)] = a
    return out


class Numbers:
    """Subscription id -> number. Numbers are given under a lock (the engine
    thread gives most; recovery and the API's threads some); looking one up
    never gives one."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}
        self.names: list[str] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.names)

    def number(self, sid: str) -> int:
        n = self.of.get(sid)
        if n is None:
            with self._lock:
                n = self.of.get(sid)
                if n is None:
                    n = len(self.names)
                    self.names.append(sid)
                    self.of[sid] = n
        return n

    def array(self, sids: Sequence[str]) -> np.ndarray:
        """The numbers of ``sids``, as an array (one C-level pass; new ids numbered)."""
        got = list(map(self.of.get, sids))
        if None in got:
            for i, n in enumerate(got):
                if n is None:
                    got[i] = self.number(sids[i])
        return np.array(got, dtype=np.intp)


class SeqMap(MutableMapping):
    """A ``dict[str, int]`` over :class:`Numbers`' ids, kept in two arrays
    (value, present) indexed by number. One writer thread; readers on other
    threads see each entry whole (an array grows by being replaced: values
    first, then presence)."""

    def __init__(self, numbers: Numbers, data: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        self.numbers = numbers
        self.values = np.zeros(64, np.int64)
        self.present = np.zeros(64, np.bool_)
        self._n = 0
        self.update(data)

    def _fit(self, size: int) -> None:
        if size > len(self.present):
            self.values = grown(self.values, size)
            self.present = grown(self.present, size, False)

    # ------------------------------------------------------------------ a dict's
    def __getitem__(self, sid: str) -> int:
        n = self.numbers.of.get(sid)
        present = self.present
        if n is None or n >= len(present) or not present[n]:
            raise KeyError(sid)
        return int(self.values[n])

    def get(self, sid: str, default=None):
        n = self.numbers.of.get(sid)
        present = self.present
        if n is None or n >= len(present) or not present[n]:
            return default
        return int(self.values[n])

    def __contains__(self, sid: object) -> bool:
        n = self.numbers.of.get(sid)  # type: ignore[arg-type]
        present = self.present
        return n is not None and n < len(present) and bool(present[n])

    def __setitem__(self, sid: str, value: int) -> None:
        n = self.numbers.number(sid)
        self._fit(n + 1)
        self.values[n] = value
        if not self.present[n]:
            self.present[n] = True
            self._n += 1

    def __delitem__(self, sid: str) -> None:
        n = self.numbers.of.get(sid)
        if n is None or n >= len(self.present) or not self.present[n]:
            raise KeyError(sid)
        self.present[n] = False
        self.values[n] = 0
        self._n -= 1

    def __iter__(self) -> Iterator[str]:
        return iter(self.copy())

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"SeqMap({self.copy()!r})"

    def copy(self) -> dict[str, int]:
        """A plain dict of what it holds now (in the order of the numbers)."""
        present = self.present
        values = self.values
        at = np.flatnonzero(present)
        names = self.numbers.names
        return dict(zip(map(names.__getitem__, at.tolist()), values[at].tolist()))

    def items(self):  # (a copy: the engine thread may write meanwhile)
        return self.copy().items()

    def update(self, other=(), /, **kw) -> None:
        pairs = other.items() if isinstance(other, Mapping) else other
        for sid, value in pairs:
            self[sid] = value
        for sid, value in kw.items():
            self[sid] = value

    # ------------------------------------------------------------------ a batch's, by numbers
    def take(self, nums: np.ndarray) -> np.ndarray:
        """The values of ``nums`` (:attr:`numbers`'; 0 for one it does not hold)."""
        self._fit(len(self.numbers.names))
        return self.values[nums]

    def put(self, nums: np.ndarray, values: np.ndarray) -> None:
        """Set the values of ``nums`` (:attr:`numbers`', each once)."""
        self._fit(len(self.numbers.names))
        if len(nums) == 1:  # (an array operation's fixed cost is most of it)
            n = int(nums[0])
            self.values[n] = values[0]
            if not self.present[n]:
                self.present[n] = True
                self._n += 1
            return
        self.values[nums] = values
        fresh = ~self.present[nums]
        if fresh.any():
            self.present[nums[fresh]] = True
            self._n += int(np.count_nonzero(fresh))

    def add(self, nums: np.ndarray, values: np.ndarray) -> None:
        """Add ``values`` to those of ``nums`` (each number once; 0 for one it did not hold)."""
        self.put(nums, self.take(nums) + values)
