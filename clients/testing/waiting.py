"""Waiting on a condition instead of sleeping a fixed time.

A fixed ``time.sleep(0.2)`` is either too long (slow tests) or, on a busy
machine, too short (flaky tests). :func:`wait_until` polls a condition until
it holds and fails with a message that says what it waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition a test waited for did not come true in time."""


def wait_until(pred: Callable[[], T], timeout: float = 20.0, what: str = "the condition",
               interval: float = 0.01) -> T:
    """Poll ``pred`` until it returns a truthy value, and return that value.

    ``timeout`` only bounds a hang: it is never a claim about speed. On
    timeout, raise :class:`WaitTimeout` naming ``what`` and the last value
    ``pred`` returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout} s waiting for {what} (last value: {value!r})")
        time.sleep(interval)
