"""The query engine: compiled automata run over time-ordered events. No I/O.

Two builds of the same source exist (see :mod:`air.engine.build`): plain
Python, and, when ``pip install`` (setup.py) or ``cayuga build-engine`` has compiled ``network.py`` and
``runtime.py`` with Cython, extension modules beside them. :data:`BUILD` says
which one this process runs. ``CAYUGA_ENGINE=python`` forces plain Python;
a compiled module built from other sources than those beside it is ignored
(with a warning).
"""

import importlib.util
import os
import sys
import warnings

from air.engine import build as _build


def _load_source(name: str):
    """Import ``air.engine.<name>`` from its ``.py`` even though a compiled
    module of that name sits beside it (the import system prefers those)."""
    full = f"{__name__}.{name}"
    spec = importlib.util.spec_from_file_location(full, _build.HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    globals()[name] = module
    return module


def _choose() -> str:
    present = [m for m in _build.MODULES if _build.compiled_paths(m)]
    if not present:
        return "python"
    if os.environ.get("CAYUGA_ENGINE", "").lower() == "python":
        pass  # asked for: no warning
    elif len(present) < len(_build.MODULES) or any(_build.stale(m) for m in _build.MODULES):
        warnings.warn("cayuga: the compiled engine is incomplete or was built from older sources; run `cayuga "
                      "build-engine` again; running the plain-Python engine", RuntimeWarning, stacklevel=2)
    else:
        return "compiled"
    for m in _build.MODULES:
        _load_source(m)
    return "python"


#: ``"compiled"`` or ``"python"``: which build of the engine this process runs.
BUILD = _choose()

from air.engine.errors import EngineError, LateEvent  # noqa: E402
from air.engine.functions import FunctionRegistry, contains, similarity  # noqa: E402
from air.engine.network import untrack_events  # noqa: E402
from air.engine.runtime import Emission, Engine, EngineStats, Event  # noqa: E402

__all__ = [
    "BUILD", "Emission", "Engine", "EngineError", "EngineStats", "Event", "FunctionRegistry", "LateEvent",
    "contains", "similarity", "untrack_events",
]
