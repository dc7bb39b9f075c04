"""The engine's errors: what a caller asked that the engine cannot honour."""


class EngineError(ValueError):
    """A request the engine cannot honour (unknown stream, clashing schema, ...)."""


class LateEvent(EngineError):
    """An event older than the epoch already being processed."""
