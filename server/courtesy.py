"""Giving the interpreter's lock away during a long piece of work on a request's thread.

A thread that computes keeps the lock until the switch interval (20 ms in ``cayuga serve``,
server/serve.py) forces it to let go; each time the TCP thread, the engine thread or the
event loop wants it back after a system call, it waits that long. A registration of 10,000
queries — validating the body, compiling, storing, making the answer — held the live
events for seconds before it gave the lock away between its steps (BENCHMARKS.md, "Engine
workers, round 25" and "round 27").
"""

from __future__ import annotations

import time


class Courtesy:
    """Called between two steps of a long piece of work on a request's thread: gives the
    interpreter's lock away (``time.sleep(0)``) once ``every`` seconds have passed since it
    last did. Without it the receivers, the engine thread and the event loop waited a switch
    interval (20 ms) each time they wanted the lock back, and compiling 10,000 queries held
    the live events up to 1.2 s; after every query, it cost 60 us a query even with nothing
    else to run (BENCHMARKS.md, "Engine workers, round 25")."""

    __slots__ = ("every", "_next")

    def __init__(self, every: float = 0.0005) -> None:
        self.every = every
        self._next = time.perf_counter() + every

    def __call__(self) -> None:
        if time.perf_counter() >= self._next:
            time.sleep(0)
            self._next = time.perf_counter() + self.every
