"""Who a client is: the server's ``auth_tokens``, each with a name, its scopes and its reach.

A plain string in ``auth_tokens`` is a token with every scope (``admin``), named
``auth_tokens[i]`` after its place in the list; an entry ``{"name", "token",
"scopes", "own", "prefixes"}`` is a token with those scopes only. The name is
what the audit log, the server's log and ``/whoami`` show: never the secret.

Scopes (server.config.SCOPES): ``ingest`` sends events (TCP, ``POST /events``);
``watch`` reads subscriptions' witnesses (WebSockets) and the console's
read-only views; ``manage`` declares streams and registers, validates and
deletes subscriptions; ``metrics`` reads ``/metrics``; ``admin`` all of these
and ``GET /audit``. A token with ``own`` reaches only the subscriptions it
registered, one with ``prefixes`` those whose name starts with one of them
(and must name what it registers so); with both, either will do.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from server.config import SCOPES, TokenSpec

ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """An authenticated client: its token's name, scopes and reach."""

    #: The token's name; None on a server without tokens (everyone may do everything).
    name: str | None
    scopes: frozenset[str]
    own: bool = False
    prefixes: tuple[str, ...] = ()

    def allows(self, scope: str) -> bool:
        return ADMIN in self.scopes or scope in self.scopes

    @property
    def restricted(self) -> bool:
        """Whether it reaches only some subscriptions."""
        return ADMIN not in self.scopes and (self.own or bool(self.prefixes))

    def reaches(self, name: str | None, owner: str | None) -> bool:
        """Whether a subscription of this ``name``, registered by the token named
        ``owner`` (None: unknown, or registered without a token), is in reach."""
        if not self.restricted:
            return True
        if self.own and owner is not None and owner == self.name:
            return True
        return bool(self.prefixes) and name is not None and name.startswith(self.prefixes)

    def naming_problem(self, name: str | None) -> str | None:
        """Why this token may not register a subscription named ``name`` (None: it may)."""
        if not self.restricted or self.own:
            return None  # what it registers is its own, whatever the name
        if name is not None and name.startswith(self.prefixes):
            return None
        shown = "no name" if name is None else f"the name {name!r}"
        return (f"token {self.name} registers only subscriptions named with a prefix of its own "
                f"({', '.join(self.prefixes)}); give the subscription such a name (it has {shown})")

    def reach_text(self) -> str:
        """The subscriptions it reaches, in words (for error messages)."""
        parts = (["those it registered"] if self.own else []) + (
            [f"those named {' or '.join(p + '...' for p in self.prefixes)}"] if self.prefixes else [])
        return " and ".join(parts) if parts else "every subscription"

    def public(self) -> dict:
        """What ``GET /whoami`` says of it."""
        return {"name": self.name, "scopes": sorted(self.scopes, key=SCOPES.index),
                "effective_scopes": [s for s in SCOPES if self.allows(s)],
                "own": self.own, "prefixes": list(self.prefixes)}


#: The client of a server without auth_tokens: anyone may do anything.
OPEN = Principal(None, frozenset({ADMIN}))


def principal_of(index: int, entry: str | TokenSpec) -> tuple[bytes, Principal]:
    """(secret, principal) of one entry of ``auth_tokens``."""
    if isinstance(entry, str):
        return entry.encode(), Principal(f"auth_tokens[{index}]", frozenset({ADMIN}))
    return entry.token.encode(), Principal(entry.name, frozenset(entry.scopes), entry.own, tuple(entry.prefixes))


class TokenTable:
    """The configured tokens; :meth:`identify` finds the one a client sent."""

    def __init__(self, entries) -> None:
        self._entries = [principal_of(i, e) for i, e in enumerate(entries)]
        self.names = [p.name for _, p in self._entries]

    @property
    def enabled(self) -> bool:
        """Whether the server wants tokens at all."""
        return bool(self._entries)

    def identify(self, token: str | bytes | None) -> Principal | None:
        """The principal whose secret ``token`` is, or None. Compared with every
        configured secret in constant time (hmac.compare_digest), without
        stopping at a match: no timing tells a client how much of a guess was
        right, nor which token it matched."""
        if not token:
            return None
        given = token.encode() if isinstance(token, str) else token
        found = None
        for secret, who in self._entries:
            if hmac.compare_digest(given, secret):
                found = who
        return found
