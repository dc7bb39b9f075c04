"""The main process's engine when an engine worker runs the automata: the
catalogue (streams, schemas, what each subscription holds in the network)
that registrations are checked and compiled against, and every change to it
sent on to the worker, in order, on the link's one pipe.

It never sees an event: its nodes hold no instance. What holds instances —
counts, snapshots, shedding — is asked of the worker (server/workers/dispatch.py).
A change the worker refuses where this engine took it would leave the two
apart: it is logged and :attr:`MirroredEngine.diverged` says so (/health is
then degraded); it cannot happen while both run the same code on the same
changes.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

from air.engine import Engine
from air.model import Automaton, StreamSchema
from server.workers.link import WorkerLink

log = logging.getLogger("cayuga.daemon")


class MirroredEngine(Engine):
    """See the module's docstring."""

    def __init__(self, link: WorkerLink, **kw) -> None:
        super().__init__(**kw)
        self.link = link
        self.diverged: str | None = None

    def declare(self, schema: StreamSchema) -> None:
        super().declare(schema)
        self._mirror("declare", schema)

    def add(self, automata, owner: str) -> list[str]:
        autos = (automata,) if isinstance(automata, Automaton) else tuple(automata)
        got = super().add(autos, owner)
        self._mirror("add", owner, autos)
        return got

    def mirror_prepared(self, owner: str, automata) -> None:
        """``add_prepared`` installed ``owner`` here: the worker adds its automata."""
        self._mirror("add", owner, tuple(automata))

    def remove(self, owner: str) -> None:
        super().remove(owner)
        self._mirror("remove", owner)

    def _mirror(self, name: str, *args) -> None:
        self.link.command(name, *args).add_done_callback(lambda fut: self._check(fut, name, args))

    def _check(self, fut: Future, name: str, args: tuple) -> None:
        exc = fut.exception()
        if exc is None:
            return
        what = f"{name} {args[0] if args else ''}".strip()
        self.diverged = f"the engine worker refused a change this process made ({what}): {exc}"
        log.error("%s; restart the server", self.diverged)
