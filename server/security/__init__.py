"""Security: who may do what (tokens and scopes), who did what (the audit log),
guessed tokens slowed down, and TLS on both ports (issue 38).

A room below the API and the TCP receiver: it imports the settings, the
counters and the store, nothing above. The daemon builds one :class:`Security`;
the API (server/api/deps.py), the WebSocket route and the TCP receiver ask it
who a token is (:meth:`Security.authenticate`), whether that may do a thing
(:meth:`Security.authorize`) and reach a subscription (:meth:`Security.reaches`),
and tell it what changed (:meth:`Security.registered`, ...), which it writes to
the audit log.

- tokens.py: the tokens, their scopes and reach (:class:`Principal`);
- throttle.py: the per-address backoff after repeated wrong tokens;
- audit.py: the append-only, rotated audit log;
- owners.py: which token registered each subscription (for tokens limited to their own);
- tls.py: the TLS context, its reload on SIGHUP, and TLS on the TCP port.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from typing import Iterable

from server.config import Settings
from server.observability.counters import AUTH_FAILURES, Counters
from server.security.audit import AuditLog
from server.security.owners import Owners
from server.security.throttle import AuthThrottle
from server.security.tls import ServerTls
from server.security.tokens import OPEN, Principal, TokenTable

__all__ = ["AuthRefused", "OPEN", "Principal", "Security"]


class Repeats:
    """At most one audit record a window per key: :meth:`seen` says how many were held back since the
    last one written (0: none), or None to hold this one back too. Bounded like the backoff's table."""

    WINDOW = 60.0
    KEYS = 10_000

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._keys: OrderedDict[tuple, list] = OrderedDict()  # key -> [when written, held back since]

    def seen(self, key: tuple) -> int | None:
        now = self.clock()
        with self._lock:
            entry = self._keys.pop(key, None)
            if entry is not None and now - entry[0] < self.WINDOW:
                entry[1] += 1
                self._keys[key] = entry
                return None
            held = entry[1] if entry is not None else 0
            self._keys[key] = [now, 0]
            while len(self._keys) > self.KEYS:
                self._keys.popitem(last=False)
            return held


class AuthRefused(Exception):
    """A request that may not go on. ``reason``: ``missing`` (no token), ``wrong``
    (not a token of the server), ``throttled`` (its address sent too many wrong
    ones: ``retry_after`` seconds), ``scope`` (a known token without the scope
    or the reach it needs: ``scope`` names it, the message says what to do)."""

    def __init__(self, reason: str, message: str = "", *, retry_after: int | None = None,
                 scope: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason, self.retry_after, self.scope = reason, retry_after, scope


class Security:
    def __init__(self, settings: Settings, store, counters: Counters) -> None:
        self.settings = settings
        self.counters = counters
        self.tokens = TokenTable(settings.auth_tokens)
        self.throttle = AuthThrottle()
        self.audit = AuditLog(settings.data_dir / "audit", settings.audit_log_bytes, settings.audit_log_files,
                              counters)
        self.owners = Owners(store)
        self.repeats = Repeats()
        #: None without tls_certfile; raises TlsError (a ConfigError) when the files cannot be used
        self.tls: ServerTls | None = ServerTls.from_settings(settings, counters)

    # ------------------------------------------------------------------ who, and may it

    @property
    def enabled(self) -> bool:
        """Whether the server wants tokens."""
        return self.tokens.enabled

    def authenticate(self, token: str | bytes | None, address: str, port: str, what: str) -> Principal:
        """The principal of ``token`` sent from ``address`` on ``port`` (``http``
        or ``tcp``) for ``what`` (e.g. ``POST /subscriptions``); anyone is
        :data:`OPEN` on a server without tokens. Raises :class:`AuthRefused`,
        counted, written to the audit log, and (for a wrong token) held
        against the address."""
        if not self.tokens.enabled:
            return OPEN
        wait = self.throttle.wait(address)
        if wait > 0:
            self.counters.add(AUTH_FAILURES[port, "throttled"])
            raise AuthRefused("throttled", f"too many wrong tokens from {address}: retry in {math.ceil(wait)} s",
                              retry_after=math.ceil(wait))
        if not token:
            self._failed(port, "missing", address, what)
            raise AuthRefused("missing")
        who = self.tokens.identify(token)
        if who is None:
            self._failed(port, "wrong", address, what)
            imposed = self.throttle.failed(address)
            if imposed > 0:
                self.audit.record("auth.throttled", token=None, address=address, port=port,
                                  failures=self.throttle.failures(address), wait_seconds=math.ceil(imposed))
            raise AuthRefused("wrong")
        return who

    def authorize(self, who: Principal, scope: str, address: str, port: str, what: str) -> None:
        """Raise :class:`AuthRefused` (``scope``) unless ``who`` has ``scope``."""
        if who.allows(scope):
            return
        have = ", ".join(sorted(who.scopes)) or "none"
        self.refuse(who, address, port, what, scope,
                    f"token {who.name} lacks the {scope} scope that {what} needs (its scopes: {have}); use a "
                    f"token with {scope} (or admin), or add {scope} to this token's scopes in auth_tokens")

    def refuse(self, who: Principal, address: str, port: str, what: str, scope: str | None, message: str):
        """Count, record and raise a refusal of a known token (a scope or a reach it lacks)."""
        self._failed(port, "scope", address, what, token=who.name)
        raise AuthRefused("scope", message, scope=scope)

    def _failed(self, port: str, reason: str, address: str, what: str, token: str | None = None) -> None:
        """Count a refusal; write it to the audit log, but for a missing token or a scope at most once a
        minute per address (and token): a flood of requests without a token must not rotate the records of
        changes out of the log. Wrong tokens are bounded by the backoff: each is written."""
        self.counters.add(AUTH_FAILURES[port, reason])
        repeated = 0
        if reason != "wrong":
            repeated = self.repeats.seen((address, reason, token, port))
            if repeated is None:
                return
        self.audit.record("auth.failure", token=token, address=address, port=port, reason=reason, what=what,
                          **({"repeated": repeated} if repeated else {}))

    # ------------------------------------------------------------------ reach

    def reaches(self, who: Principal, sub) -> bool:
        """Whether ``who`` reaches the subscription ``sub`` (an id and a name)."""
        return not who.restricted or who.reaches(sub.name, self.owners.get(sub.id))

    def stream_publishers_out_of_reach(self, who: Principal, stream: str, subscriptions) -> list[str]:
        """The subscriptions publishing ``stream`` that ``who`` does not reach."""
        if not who.restricted:
            return []
        return [s.id for s in list(subscriptions.values())
                if (stream in s.outputs or stream in s.internal) and not self.reaches(who, s)]

    def reads_out_of_reach(self, who: Principal, sub, subscriptions, declared: Iterable[str]) -> list[str]:
        """The streams ``sub`` reads that others' subscriptions (out of ``who``'s
        reach) publish: a restricted token must not read them through its own."""
        if not who.restricted:
            return []
        inputs = set(declared)
        reads = sub.reads() - inputs - set(sub.internal)
        return sorted(r for r in reads if self.stream_publishers_out_of_reach(who, r, subscriptions))

    # ------------------------------------------------------------------ what changed (the audit log)

    def own(self, who: Principal, subs) -> None:
        """Subscriptions ``who`` has just registered are its own (a token limited to its own reaches them)."""
        if who.name is not None:
            self.owners.set([s.id for s in subs], who.name)

    def registered(self, who: Principal, subs, address: str | None) -> None:
        """Subscriptions registered by ``who``, written to the audit log (synced)."""
        self.audit.record("subscription.register", token=who.name, address=address,
                          subscriptions=[s.id for s in subs], names=[s.name for s in subs])

    def deleted(self, who: Principal, sids: list[str], address: str | None) -> None:
        self.owners.forget(sids)
        self.audit.record("subscription.delete", token=who.name, address=address, subscriptions=sids)

    def declared(self, who: Principal, stream: str, schema: dict[str, str], address: str | None) -> None:
        self.audit.record("stream.declare", token=who.name, address=address, stream=stream, schema=schema)

    def close(self) -> None:
        self.audit.close()
