"""The engine as the modules beside its event loop see it.

``eviction.py``, ``state.py``, ``introspect.py`` and ``footprint.py`` work on a
running engine between events, and :class:`air.engine.Engine` (runtime.py)
hands some of its methods on to them (``evict_oldest``, ``export_state``,
``instances``, ...). So that the imports point one way (runtime.py imports
them, never the reverse; tests/server/test_layers.py checks it), they take an
:class:`EngineLike`: what of the engine they read and write, declared here.
Nothing here runs: a Protocol, for readers and type checkers."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from air.engine.loader import Holding, Loader
    from air.engine.network import Node
    from air.engine.stats import EngineStats
    from air.model import StreamSchema


class EngineLike(Protocol):
    """What of ``air.engine.runtime.Engine`` the modules beside its loop use."""

    stats: EngineStats
    # where the epoch in progress stands (state.py saves, restores and clears it)
    _epoch: object
    _closed: bool
    _installed_t1: object
    _epoch_events: int
    _dirty: list[Node]  # nodes the epoch in progress touched
    _resub: deque  # witnesses waiting to be fed back (resubscription)
    # the catalogue of streams (introspect.StreamView reads it)
    _declared: dict[str, StreamSchema]
    _published: dict[str, tuple[StreamSchema, set[str]]]

    @property
    def epoch(self) -> object: ...

    @property
    def network(self) -> Loader: ...

    def holding(self, owner: str) -> Holding: ...

    def holdings(self) -> dict[str, Holding]: ...

    def schema(self, stream: str) -> StreamSchema | None: ...

    def close_epoch(self) -> None: ...
