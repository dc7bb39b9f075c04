"""The garbage collector around large loads of long-lived engine state."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

#: The cyclic garbage collector's young-generation threshold in a process that
#: feeds an engine (``cayuga serve`` and its engine workers; Python's default is
#: 700): above the objects one batch keeps alive for a moment (its emissions,
#: instances, records), as ``cayuga run`` does while it feeds. At 700 a young
#: collection ran every few hundred events: 3.2 s of wall time inside collections
#: in a 1M-tick run that took 17.7 s of the server's CPU (BENCHMARKS.md, "Round 8
#: (2026-11-27): the server's own overhead").
GC_YOUNG_THRESHOLD = 50_000


def raise_young_threshold(young: int = GC_YOUNG_THRESHOLD) -> None:
    """Collect the young generation every ``young`` allocations at most (never more often
    than now; a threshold of 0, collection off by the host's choice, is left so)."""
    current, *older = gc.get_threshold()
    if current:
        gc.set_threshold(max(current, young), *older)


@contextmanager
def paused_gc(freeze: bool = False) -> Iterator[None]:
    """Hold the cyclic garbage collector while many queries load: what they
    allocate lives on, and each full collection would walk the whole, ever
    larger, network again (≈30% of loading 10,000 queries). With ``freeze``,
    everything allocated so far leaves the collector's reach for good
    (``gc.freeze``): the collection that would otherwise follow the pause
    never walks it (1.7 s after loading 10,000 queries)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if collecting:
            gc.enable()

