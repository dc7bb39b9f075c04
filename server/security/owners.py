"""Which token registered each subscription: what a token limited to its own
subscriptions (``own``) reaches. Kept in the store (table ``owners``, deleted
with the subscription) and in memory; the name of the token, never its secret.

A subscription registered without a token (a server without auth_tokens), or
whose owner could not be stored (the store refused the write after the
subscription was registered), has no owner: no ``own`` token reaches it, an
``admin`` token does.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

log = logging.getLogger("cayuga.security")


class Owners:
    def __init__(self, store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._owner: dict[str, str] = store.owners()

    def get(self, sid: str) -> str | None:
        return self._owner.get(sid)

    def set(self, sids: list[str], token: str) -> None:
        if not sids:
            return
        try:
            self.store.save_owners([(sid, token) for sid in sids])
        except sqlite3.Error as exc:
            log.error("could not store that token %s registered %s (%s): after a restart only an admin token "
                      "reaches them", token, ", ".join(sids[:5]) + (" ..." if len(sids) > 5 else ""), exc)
        with self._lock:
            for sid in sids:
                self._owner[sid] = token

    def forget(self, sids: list[str]) -> None:
        """The subscriptions were deleted (the store deleted their rows with them)."""
        with self._lock:
            for sid in sids:
                self._owner.pop(sid, None)
