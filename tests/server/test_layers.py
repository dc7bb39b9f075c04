"""Imports in server/ point one way (issue 24): the rooms (ingest, subscriptions,
durability, delivery, observability) never import the daemon, the app, the api
or the server runner, and no module of server/, air/ or clients/ takes part in
an import circle, not even one only a type checker follows (``if TYPE_CHECKING:``);
and no module there grows past MAX_LINES (issue 32)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("ingest", "subscriptions", "durability", "delivery", "observability", "security")
#: What a room must not import: the wiring above the rooms.
ABOVE_ROOMS = ("server.daemon", "server.app", "server.api", "server.serve", "server.processing")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


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
                # ``from air.engine import state`` imports the module air.engine.state
                subs = {f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")}
                found.update(subs)
                if len(subs) < len(node.names):
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


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
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
    return circles


@pytest.mark.parametrize("package", ["server", "air", "clients"])
def test_no_import_circles(package):
    """Not even through ``if TYPE_CHECKING:``. In air/engine/ this keeps the
    modules beside the event loop (eviction, state, introspect, footprint)
    from importing runtime.py, which imports them: they take an
    ``EngineLike`` (air/engine/enginelike.py) instead (issue 32)."""
    circles = _circles(_imports(package))
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_circle_check_sees_type_checking_imports():
    graph = _imports("air/engine/runtime.py", "air/engine/eviction.py", "air/engine/enginelike.py")
    assert "air.engine.eviction" in graph["air.engine.runtime"]  # ``from air.engine import eviction``
    assert "air.engine.loader" in graph["air.engine.enginelike"]  # under ``if TYPE_CHECKING:``
    graph["air.engine.eviction"].add("air.engine.runtime")
    assert [set(c) for c in _circles(graph)] == [{"air.engine.runtime", "air.engine.eviction"}]


def test_the_language_and_the_engine_import_nothing_above_them():
    bad = [(mod, imp) for mod, imps in _imports("air").items() for imp in imps if imp.split(".")[0] != "air"]
    assert not bad, bad


def test_the_offline_runner_and_spark_need_the_engine_not_the_server():
    """``cayuga run`` and the Spark executors run the engine (air/) without a server."""
    graph = _imports("clients/offline.py", "clients/spark")
    bad = [(mod, imp) for mod, imps in graph.items() for imp in imps if imp.split(".")[0] == "server"]
    assert not bad, bad



#: What a TCP connection's reader may import from server/: values, exceptions and functions of
#: the socket, none of the server's state. Everything else goes through its Intake, the seam a
#: reader in a process of its own crosses (docs/design/receivers.md).
READER_MAY_IMPORT = {"server.ingest.intake", "server.ingest.limits", "server.ingest.protocol",
                     "server.observability.counters", "server.security", "server.security.tls",
                     "server.durability.diskfull"}


def test_a_connections_reader_reaches_the_server_only_through_its_intake():
    from server.ingest.intake import Intake

    graph = _imports("server/ingest/connection.py")
    assert list(graph) == ["server.ingest.connection"], graph
    bad = {imp for imp in graph["server.ingest.connection"] if imp.startswith("server.")} - READER_MAY_IMPORT
    assert not bad, f"the reader imports more of the server than its intake: {bad}"
    # every use of the intake is a name Intake has: what a reader in another process is given
    tree = ast.parse((ROOT / "server/ingest/connection.py").read_text())
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and ((isinstance(node.value, ast.Attribute) and node.value.attr == "intake")
                 or (isinstance(node.value, ast.Name) and node.value.id == "intake"))}
    assert {"put", "authenticate", "claim", "durable"} <= used, f"the probe finds too few uses: {used}"
    public = {n for n in dir(Intake) if not n.startswith("_")}
    assert used <= public, f"the reader uses what Intake does not offer: {used - public}"


#: The most lines a module of air/, server/, clients/ or tests/ may have (issue 32). One that
#: needs more holds more than one responsibility: split it along a seam (a part with a
#: job of its own, named for it), keeping its public names importable where they were.
MAX_LINES = 700


def test_no_module_is_longer_than_max_lines():
    lengths = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
               for place in ("air", "server", "clients", "tests") for path in sorted((ROOT / place).rglob("*.py"))}
    assert len(lengths) > 100, "the probe found too few modules: is it looking in the right place?"
    long = {p: n for p, n in lengths.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along a seam): {long}"
