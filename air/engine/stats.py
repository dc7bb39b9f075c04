"""The engine's running totals (``Engine.stats``).

A plain dataclass in both builds, kept apart from the event loop (runtime.py)
so that the modules working beside it (air/engine/enginelike.py) can name it
without importing that. ``air.engine`` and ``air.engine.runtime`` export it.
The event loop counts its events, epochs and witnesses in fields of the
engine's own (C integers, compiled) and ``Engine.stats`` adds them here each
time it is read: read the totals through it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineStats:
    events: int = 0
    epochs: int = 0
    witnesses: int = 0
    resubscribed: int = 0
    eval_errors: int = 0
    last_eval_error: str = ""
    late: int = 0
    evicted: int = 0  # instances removed by Engine.evict_oldest
    evicted_shared: int = 0  # ... of which other owners saw too (they lost them with it)
    expired: int = 0  # instances past their filter's DUR bound, dropped by air/engine/footprint.expire
