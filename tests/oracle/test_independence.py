"""The oracle shares nothing with the product: none of its modules imports
``air``, ``server`` or ``clients`` — not directly, not through a
relative import that climbs out of the package, not through another test
module (which may import the product), not dynamically — and importing it
loads none of them."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PRODUCT = ("air", "server", "clients")
#: the oracle's own modules (its test modules compare it with the product, so import it)
MODULES = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("test_"))


def _package_of(path: Path) -> list[str]:
    return list(path.relative_to(ROOT).with_suffix("").parts[:-1])  # ["tests", "oracle"]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``path``; dynamic
    imports (``__import__``, ``importlib``, ``exec``/``eval``) as ``"<dynamic ...>"``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package_of(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level - 1 <= len(package) else []
                if node.level - 1 > len(package) or not base:
                    out.append((node.lineno, "<relative import above the root>"))
                    continue
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in ("__import__", "exec", "eval", "compile"):
                out.append((node.lineno, f"<dynamic {f.id}>"))
            elif isinstance(f, ast.Attribute) and f.attr in ("__import__", "import_module", "run_module",
                                                             "run_path", "spec_from_file_location"):
                out.append((node.lineno, f"<dynamic {f.attr}>"))
        elif isinstance(node, ast.Name) and node.id == "importlib":
            out.append((node.lineno, "<dynamic importlib>"))
    return out


def forbidden(mod: str) -> bool:
    if mod.startswith("<"):
        return True
    root = mod.split(".")[0]
    if root in PRODUCT or root in ("importlib", "runpy", "pkgutil"):  # the tools of dynamic imports
        return True
    # any other test module may import the product: only the oracle's own package is allowed
    return root == "tests" and not (mod == "tests" or mod == "tests.oracle" or mod.startswith("tests.oracle."))


def test_the_oracle_has_modules_to_check():
    names = {p.name for p in MODULES}
    assert {"__init__.py", "air.py", "expr.py", "machine.py", "gen.py", "regen.py", "cel.py", "celeval.py",
            "cel_gen.py", "sase.py", "sase_gen.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_module_of_the_oracle_imports_the_product(path):
    bad = [(line, mod) for line, mod in imported_modules(path) if forbidden(mod)]
    assert not bad, f"{path.name} imports outside the oracle: {bad}"


@pytest.mark.parametrize("source,expected", [
    ("import air.engine", True), ("from air import cel", True), ("from clients.cli import main", True),
    ("import clients.bench", True), ("from tests.conftest import STOCK", True), ("from .. import conftest", True),
    ("from ...server import engine", True), ("from ... import air", True), ("__import__('server')", True),
    ("import importlib\nimportlib.import_module('air')", True), ("from importlib import import_module", True),
    ("exec('import server')", True), ("import runpy\nrunpy.run_module('server')", True),
    ("from . import expr", False), ("import re\nre.compile('x')", False),
    ("from tests.oracle.expr import parse", False),
    ("import xml.etree.ElementTree", False),
])
def test_the_checker_catches_every_kind_of_import(tmp_path, source, expected):
    pkg = tmp_path / "tests" / "oracle"
    pkg.mkdir(parents=True)
    mod = pkg / "probe.py"
    mod.write_text(source + "\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = any(forbidden(m) for _, m in imported_modules(mod))
    finally:
        ROOT = saved
    assert found == expected, imported_modules(mod)


def test_importing_the_oracle_loads_no_product_module():
    code = ("import sys, json; import tests.oracle, tests.oracle.gen, tests.oracle.regen, tests.oracle.celeval, "
            "tests.oracle.cel_gen, tests.oracle.sase, tests.oracle.sase_gen; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in %r)))" % (PRODUCT,))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []
