"""The query engine: compiled automata run over time-ordered events. No I/O."""

from server.engine.functions import FunctionRegistry, contains, similarity
from server.engine.runtime import Emission, Engine, EngineError, EngineStats, Event, LateEvent

__all__ = [
    "Emission", "Engine", "EngineError", "EngineStats", "Event", "FunctionRegistry", "LateEvent",
    "contains", "similarity",
]
