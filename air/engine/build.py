"""The optional compiled build of the engine's hot modules.

``network.py``, ``runtime.py`` and ``convert.py`` (records to events and
emissions to witness records, at the engine's edge) are plain Python and run
as such everywhere. With Cython and a C compiler at hand (``pip install -e
'.[fast]'``), ``cayuga build-engine`` compiles the same files, typed by the
declarations beside them (``network.pxd``, ``runtime.pxd``, ``convert.pxd``),
into extension modules next to them; Python then imports those instead. Nothing else changes: the compiled
build must give exactly the results of the pure-Python one, and
``tests/engine/test_compiled_build.py`` runs the engine, CEL, benchmark,
server, Spark and ``cayuga run`` suites against it.

A compiled module built from other sources than the ``.py`` and ``.pxd``
beside it is *stale* (the digests of the sources it was built from are kept in
``compiled.json`` beside it; without that file, a module older than its
sources is): ``air.engine`` ignores it and loads the source instead (with a
warning), as it does when ``CAYUGA_ENGINE=python`` is set.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import shutil
import tempfile
from pathlib import Path

#: The compiled modules of ``air.engine``, in import order.
MODULES = ("network", "runtime", "convert")

HERE = Path(__file__).resolve().parent

#: Cython directives: annotations stay hints (typing comes only from the .pxd
#: files, so a compiled function accepts exactly what the Python one does).
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "boundscheck": True, "wraparound": True}


def compiled_paths(name: str, where: Path = HERE) -> list[Path]:
    """The extension modules built for ``name`` in ``where`` (any suffix)."""
    return [where / f"{name}{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES
            if (where / f"{name}{suffix}").exists()]


#: Beside the compiled modules: the digest of the sources each was built from.
STAMP = "compiled.json"


#: Declarations every compiled module cimports (the instance slot names as C constants).
SHARED_PXD = ("instance.pxd",)


def source_digest(name: str, where: Path = HERE) -> str:
    """SHA-256 of a module's ``.py`` and ``.pxd`` and of :data:`SHARED_PXD`, as they are now."""
    h = hashlib.sha256()
    for p in (where / f"{name}.py", where / f"{name}.pxd", *(where / s for s in SHARED_PXD)):
        if p.exists():
            h.update(p.read_bytes())
    return h.hexdigest()


def write_stamp(sources: Path = HERE, dest: Path | None = None) -> Path:
    """Record the digests of ``sources``' modules in ``dest`` (where the compiled
    modules went; ``sources`` by default)."""
    out = Path(dest or sources) / STAMP
    out.write_text(json.dumps({m: source_digest(m, sources) for m in MODULES}, indent=1) + "\n")
    return out


def stale(name: str, where: Path = HERE) -> bool:
    """Whether a compiled ``name`` exists but was built from other sources than
    those beside it: by the digests in :data:`STAMP` (an installed wheel's files
    all get the time of installation, in any order), or without one, by age."""
    built = compiled_paths(name, where)
    if not built:
        return False
    stamp = where / STAMP
    if stamp.exists():
        try:
            return json.loads(stamp.read_text()).get(name) != source_digest(name, where)
        except (OSError, ValueError):
            return True
    newest_source = max(p.stat().st_mtime for p in (where / f"{name}.py", where / f"{name}.pxd",
                                                    *(where / s for s in SHARED_PXD)) if p.exists())
    return min(p.stat().st_mtime for p in built) < newest_source


def build(where: Path = HERE, *, quiet: bool = True) -> list[Path]:
    """Compile :data:`MODULES` in ``where`` (an ``air/engine`` directory);
    returns the extension modules written. Raises ``RuntimeError`` with what
    to install when Cython or the compiler is missing."""
    try:
        from Cython.Build import cythonize
        from setuptools import Distribution, Extension
    except ImportError as exc:
        raise RuntimeError(f"the compiled engine needs Cython and setuptools: pip install -e '.[fast]' ({exc})"
                           ) from None
    where = Path(where).resolve()
    root = where.parent.parent  # the directory holding the ``air`` package
    with tempfile.TemporaryDirectory(prefix="cayuga-build-") as tmp:
        exts = [Extension(f"air.engine.{m}", [str(where / f"{m}.py")]) for m in MODULES]
        exts = cythonize(exts, compiler_directives=DIRECTIVES, build_dir=tmp, quiet=quiet,
                         include_path=[str(root)], force=True)
        dist = Distribution({"ext_modules": exts, "script_name": "cayuga-build-engine"})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_temp = str(Path(tmp) / "obj")
        cmd.build_lib = str(Path(tmp) / "lib")
        cmd.ensure_finalized()
        try:
            cmd.run()
        except Exception as exc:  # noqa: BLE001 - distutils raises its own CompileError/LinkError types
            raise RuntimeError(f"compiling the engine failed ({type(exc).__name__}: {exc}); "
                               "is a C compiler (gcc) and the Python headers installed?") from None
        written = []
        for m in MODULES:
            for old in compiled_paths(m, where):
                old.unlink()
            out = Path(cmd.get_ext_fullpath(f"air.engine.{m}"))
            dest = where / out.name
            shutil.copy2(out, dest)
            os.utime(dest)  # newer than the sources it was built from
            written.append(dest)
        write_stamp(where)
    return written


def remove(where: Path = HERE) -> list[Path]:
    """Delete the compiled modules: the engine runs as plain Python again."""
    gone = []
    for m in MODULES:
        for p in compiled_paths(m, where):
            p.unlink()
            gone.append(p)
    if (where / STAMP).exists():
        (where / STAMP).unlink()
    return gone
