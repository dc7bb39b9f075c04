"""Slowing down guessed tokens: a per-address backoff after repeated failures.

Every port that checks a token (HTTP, WebSockets, TCP) asks :meth:`AuthThrottle.wait`
before it looks at the token a client sent, and tells :meth:`AuthThrottle.failed`
of each wrong one. The first FREE_FAILURES wrong tokens from an address cost
nothing (a mistyped token, a client restarted with an old one); each one after
that closes the address for twice as long as the one before, from FIRST_WAIT
seconds up to MAX_WAIT: while it is closed, every request from it that carries a
token is refused (HTTP 429 with Retry-After, WebSocket close 4429, an
``error:`` line on TCP) without the token being compared, so a guess can be
tried at most once per wait. Missing tokens do not count: they guess nothing.

Nothing is held while an address waits (no sleeping request, no thread, no
connection kept open): a refusal costs the server what a 401 costs, and other
addresses are never slowed. A client that shares an address with the failing
one (behind the same NAT) waits with it. An address forgets its failures after
FORGET_SECONDS without one, and at most MAX_ADDRESSES addresses are remembered
(the least recently failing is forgotten first), so the table stays bounded
whatever the number of addresses that fail.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

#: Wrong tokens from one address that are not slowed down.
FREE_FAILURES = 5
#: Seconds the first failure beyond those closes the address for; each next one doubles it ...
FIRST_WAIT = 1.0
#: ... up to this.
MAX_WAIT = 60.0
#: An address without a failure for this long starts afresh.
FORGET_SECONDS = 600.0
#: Addresses remembered at most.
MAX_ADDRESSES = 10_000


class _Record:
    __slots__ = ("failures", "last", "until")

    def __init__(self) -> None:
        self.failures = 0
        self.last = 0.0
        self.until = 0.0


class AuthThrottle:
    """Failures per client address; thread-safe (the event loop and the TCP
    receiver threads share one)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._addresses: OrderedDict[str, _Record] = OrderedDict()

    def wait(self, address: str) -> float:
        """Seconds ``address`` must still wait before its token is looked at (0: none)."""
        with self._lock:
            rec = self._addresses.get(address)
            return max(rec.until - self.clock(), 0.0) if rec is not None else 0.0

    def failed(self, address: str) -> float:
        """Count a wrong token from ``address``; the seconds it must now wait (0: none yet)."""
        now = self.clock()
        with self._lock:
            rec = self._addresses.pop(address, None) or _Record()
            if now - rec.last > FORGET_SECONDS:
                rec.failures = 0
            rec.failures += 1
            rec.last = now
            beyond = rec.failures - FREE_FAILURES
            if beyond > 0:
                rec.until = now + min(FIRST_WAIT * 2 ** min(beyond - 1, 32), MAX_WAIT)
            self._addresses[address] = rec  # the most recent failure last
            while len(self._addresses) > MAX_ADDRESSES:
                self._addresses.popitem(last=False)
            return max(rec.until - now, 0.0)

    def failures(self, address: str) -> int:
        """Failures of ``address`` that count now."""
        with self._lock:
            rec = self._addresses.get(address)
            return 0 if rec is None or self.clock() - rec.last > FORGET_SECONDS else rec.failures

    def __len__(self) -> int:
        with self._lock:
            return len(self._addresses)
