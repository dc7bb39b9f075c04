"""Stored subscriptions that no longer compile: kept, said, not run (issue 33).

A start whose configuration no longer fits a stored subscription (a stream it
reads was removed, a type change it cannot compile against, a function gone)
used to drop it with one ERROR line while /health said ``ok``. Now it is
*broken*: its row stays in the store with the reason and since when
(``broken`` table), GET /subscriptions and GET /subscriptions/{id} list it with
``broken: {reason, since}``, /health is ``degraded`` naming it, the console
shows a badge, and a watcher is closed with :data:`BROKEN_CLOSE` and a reason
that says why and what to do. It can be deleted; a later start whose
configuration fits it again installs it afresh (server/durability/recovery.py),
with its witnesses numbered on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

#: WebSocket close code for a watcher of a broken subscription (as HTTP 409: the
#: subscription's state, not the request, is the problem; retrying cannot help).
BROKEN_CLOSE = 4409
#: What to do about a broken subscription.
FIX = ("fix the configuration (the streams it reads, their types, its functions) and restart: it comes back by "
       "itself; or delete it")


@dataclass
class Broken:
    """A stored subscription that does not compile against this server's configuration."""

    id: str
    kind: str
    text: str
    name: str | None
    created: float
    reason: str  # why it does not compile, in words
    since: float = field(default_factory=time.time)
    upstream: str | None = None  # the broken subscription whose outputs it reads, when that is why

    #: (as a Subscription: a broken one publishes nothing, reads nothing)
    outputs: list[str] = field(default_factory=list)
    internal: list[str] = field(default_factory=list)

    def public(self) -> dict:
        """As the API shows it."""
        return {"reason": self.reason, "since": self.since, "upstream": self.upstream, "fix": FIX}

    def close_reason(self) -> str:
        """A WebSocket close reason (at most 123 bytes, what a close frame carries): that it is broken,
        why (cut to fit: GET /subscriptions/{id} has it whole) and what to do."""
        tail = "; fix the config and restart, or DELETE it"
        head = f"{self.id} is broken: "
        cause = self.reason[3:] if self.reason.startswith("it ") else self.reason
        room = 123 - len((head + tail).encode())
        if len(cause.encode()) > room:
            cause = cause.encode()[:max(room - 3, 0)].decode(errors="ignore") + "..."
        return head + cause + tail

    def summary(self) -> str:
        return f"{self.id}{f' ({self.name})' if self.name else ''}: {self.reason}"


def reason_from(message: str | None) -> str:
    """A broken subscription's reason from a compiler's (or the engine's) message: its first line."""
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else "unknown error"
    return f"it no longer compiles against this server's configuration: {first}"
