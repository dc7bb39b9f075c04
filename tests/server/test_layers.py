"""Imports in server/ point one way (issue 24): the rooms (ingest, subscriptions,
durability, delivery, observability) never import the daemon, the app, the api
or the server runner, and no module of server/ takes part in an import circle,
not even one only a type checker follows (``if TYPE_CHECKING:``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("ingest", "subscriptions", "durability", "delivery", "observability", "security")
#: What a room must not import: the wiring above the rooms.
ABOVE_ROOMS = ("server.daemon", "server.app", "server.api", "server.serve", "server.processing")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(*places: str) -> dict[str, set[str]]:
    """Per module under ``places`` (server/ by default), the server/air/clients
    modules it imports (every import, anywhere in it)."""
    graph = {}
    paths = [p for place in places or ("server",)
             for p in ([ROOT / place] if place.endswith(".py") else sorted((ROOT / place).rglob("*.py")))]
    for path in paths:
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[_module(path)] = {m for m in found if m.split(".")[0] in ("server", "air", "clients")}
    return graph


def test_rooms_do_not_import_the_wiring_above_them():
    bad = [(mod, imp) for mod, imps in _imports().items() if mod.split(".")[1:2] and mod.split(".")[1] in ROOMS
           for imp in imps if imp == "server" or imp.startswith(tuple(p for p in ABOVE_ROOMS))]
    assert not bad, f"rooms importing the daemon/app/api/serve/processing: {bad}"


def test_server_imports_nothing_from_clients():
    bad = [(mod, imp) for mod, imps in _imports().items() for imp in imps if imp.split(".")[0] == "clients"]
    assert not bad, bad


def test_no_import_circles_in_server():
    graph = _imports()
    circles, state = [], {}

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = "open"
        path.append(mod)
        for nxt in sorted(graph.get(mod, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == "open":
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[mod] = "done"

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_language_and_the_engine_import_nothing_above_them():
    bad = [(mod, imp) for mod, imps in _imports("air").items() for imp in imps if imp.split(".")[0] != "air"]
    assert not bad, bad


def test_the_offline_runner_and_spark_need_the_engine_not_the_server():
    """``cayuga run`` and the Spark executors run the engine (air/) without a server."""
    graph = _imports("clients/offline.py", "clients/spark")
    bad = [(mod, imp) for mod, imps in graph.items() for imp in imps if imp.split(".")[0] == "server"]
    assert not bad, bad
