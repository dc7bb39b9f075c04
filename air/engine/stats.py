"""The engine's running totals (``Engine.stats``).

A plain dataclass in both builds (the compiled event loop adds to it as to
any Python object), kept apart from the event loop (runtime.py) so that the
modules working beside it (air/engine/enginelike.py) can name it without
importing that. ``air.engine`` and ``air.engine.runtime`` export it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)  # the engine adds to three of these per event: a slot is read and set faster
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
