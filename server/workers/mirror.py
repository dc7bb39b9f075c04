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
from contextlib import contextmanager
from typing import Iterator

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
        self._quiet = 0  # inside unmirrored(): a caller mirrors the change itself
        self._shapes: dict[int, tuple[object, int]] = {}  # id(shape) -> (shape, its number at the worker)

    def declare(self, schema: StreamSchema) -> None:
        super().declare(schema)
        self._mirror("declare", schema)

    def add(self, automata, owner: str) -> list[str]:
        autos = (automata,) if isinstance(automata, Automaton) else tuple(automata)
        got = super().add(autos, owner)
        if not self._quiet:
            self._mirror("add", owner, autos)
        return got

    @contextmanager
    def unmirrored(self) -> Iterator[None]:
        """Changes made inside are not sent on: the caller sends them its own way (:meth:`mirror_bound`)."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def mirror_bound(self, owner: str, bq) -> None:
        """A CEL query of a cached shape (air/cel/shapes.py's ``BoundQuery``) was installed as
        ``owner``: the worker gets its shape once, then its constants and names, and installs it
        from its own templates (server/subscriptions/prepared.py), as this engine did."""
        shape = bq.shape
        known = self._shapes.get(id(shape))
        if known is None or known[0] is not shape:
            number = len(self._shapes) + 1
            self._shapes[id(shape)] = known = (shape, number)
            self._mirror("shape", number, shape.dump())
        self._mirror("add_bound", owner, known[1], bq.values, bq.names, bq.prefix)

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
