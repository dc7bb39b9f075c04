"""Built-in and user-defined functions callable from predicates and schema maps.

The original Cayuga offered ``CONTAINS`` and ``SIMILARITY``; users can register
more Python functions, each with a declared return type so that the CEL
compiler can type-check expressions that use it.
"""

from __future__ import annotations

import importlib
import os
import sysconfig
from collections import Counter
from dataclasses import dataclass
from types import FrameType
from typing import Callable, Mapping

from air.engine.errors import EngineError
from air.model import normalize_type


def contains(text: str, pattern: str) -> int:
    """1 if ``pattern`` occurs in ``text``, else 0."""
    return 1 if pattern in text else 0


SIMILARITY_WIDTH = 10


def similarity(a: str, b: str) -> float:
    """Share of 10-character substrings common to both strings (as multisets),
    relative to the string with fewer of them; 0 when either is shorter than 10."""
    w = SIMILARITY_WIDTH
    if len(a) < w or len(b) < w:
        return 0.0
    ga = Counter(a[i:i + w] for i in range(len(a) - w + 1))
    gb = Counter(b[i:i + w] for i in range(len(b) - w + 1))
    common = sum((ga & gb).values())
    return common / min(len(a) - w + 1, len(b) - w + 1)


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    fn: Callable
    return_type: str
    arity: int | None = None


class FunctionRegistry:
    """Name (case-insensitive) -> function. Copy before changing a shared one."""

    def __init__(self, functions: dict[str, Function] | None = None) -> None:
        self._fns: dict[str, Function] = dict(functions or {})

    @classmethod
    def default(cls) -> "FunctionRegistry":
        reg = cls()
        reg.register("CONTAINS", contains, "int", arity=2)
        reg.register("SIMILARITY", similarity, "float", arity=2)
        return reg

    def register(self, name: str, fn: Callable, return_type: str, arity: int | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"function {name} is not callable")
        key = name.upper()
        self._fns[key] = Function(key, fn, normalize_type(return_type), arity)

    def get(self, name: str) -> Function | None:
        return self._fns.get(name.upper())

    def return_types(self) -> dict[str, str]:
        return {k: f.return_type for k, f in self._fns.items()}

    def copy(self) -> "FunctionRegistry":
        return FunctionRegistry(self._fns)

    def __contains__(self, name: str) -> bool:
        return name.upper() in self._fns

    def running_in(self, frame: FrameType | None) -> dict[str, str | None]:
        """Where the thread whose innermost frame is ``frame`` runs (``sys._current_frames()``
        gives it): the registered function on its stack nearest to it (``function``, None when
        none is: the engine's own work), and the innermost place outside Python's own library
        (``at``: file, line, function: the user's line that waits, not the inside of the wait).
        What names a function that does not return (server/workers/worker.py's watch)."""
        codes = {getattr(f.fn, "__code__", None): name for name, f in self._fns.items()}
        codes.pop(None, None)
        at = None if frame is None else _place(_outside_python(frame))
        function = None
        while frame is not None:
            function = codes.get(frame.f_code)
            if function is not None:
                break
            frame = frame.f_back
        return {"function": function, "at": at}


def _place(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}, in {frame.f_code.co_name}"


#: Where Python's own library lives (its frozen modules are named ``<frozen ...>``).
_STDLIB = tuple({os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "platstdlib")})


def _outside_python(frame: FrameType) -> FrameType:
    """The innermost frame of ``frame``'s stack that is not in Python's own library (the user's
    line that called ``time.sleep``, ``socket.recv`` or ``os.path.exists``, not that function's
    inside), or ``frame`` where every one is."""
    f: FrameType | None = frame
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith("<frozen ") or (name.startswith(_STDLIB) and "-packages" not in name)):
            return f
        f = f.f_back
    return frame


class FunctionImportError(EngineError):
    """A user function named in the configuration that cannot be imported."""


def import_functions(specs: Mapping[str, tuple[str, str]]) -> FunctionRegistry:
    """A registry of the built-ins plus ``specs``: each name's ``"module:attribute"``
    and declared return type (the ``functions`` setting; ``Settings.function_specs``)."""
    reg = FunctionRegistry.default()
    for name, (path, returns) in specs.items():
        module, _, attr = path.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise FunctionImportError(f"functions.{name}: cannot import {path}: {exc}") from None
        reg.register(name, fn, returns)
    return reg
