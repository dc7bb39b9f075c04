"""Build hook: compile the engine's hot modules with Cython where a C
compiler exists, as PyYAML or msgspec do; fall back to the pure-Python engine
with one warning where it cannot. Everything else about the package is in
pyproject.toml.

The modules, their Cython directives and the typing ``.pxd`` files are those of
``cayuga build-engine`` (``air/engine/build.py``), which stays for
rebuilding in place. ``CAYUGA_ENGINE=python`` at install time skips the build.
The modules are built without debug information, stripped, and without the
build machine's RUNPATH; when none could be compiled the build says so and the
wheel is tagged ``py3-none-any`` (it holds Python only).
"""

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
FALLBACK = ("cayuga: the compiled engine was not built ({why}); the pure-Python engine will run "
            "(1.2-3x fewer events per second). Install a C compiler and the Python headers, then run "
            "`cayuga build-engine` (or reinstall).")


def _engine_build():
    """air/engine/build.py, loaded by path: importing the package would pick an engine."""
    spec = importlib.util.spec_from_file_location("_cayuga_engine_build", HERE / "air" / "engine" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PURE = ("cayuga: WARNING: no engine module was compiled: building the pure-Python engine "
        "(the wheel is py3-none-any)")


def _warn(why) -> None:
    print(FALLBACK.format(why=why), file=sys.stderr)


def _is_rpath(arg: str) -> bool:
    """A linker flag that records a library path in the module (RUNPATH/RPATH)."""
    return arg.startswith(("-Wl,-rpath", "-Wl,-R", "-Wl,--rpath")) or arg == "-R"


class OptionalBuildExt(build_ext):
    """build_ext that turns a failed compilation into the warning, not an error,
    and compiles the modules side by side (one per processor: most of an install's time)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1
        self.built: list[str] = []

    def build_extensions(self):
        # Python's own LDSHARED may carry the build machine's library path (pyenv's
        # -Wl,-rpath,...): it means nothing on a user's machine, so it stays out of the modules.
        for attr in ("linker_so", "linker_so_cxx"):
            flags = getattr(self.compiler, attr, None)
            if isinstance(flags, list):
                setattr(self.compiler, attr, [f for f in flags if not _is_rpath(f)])
        super().build_extensions()

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - distutils raises its own error types
            _warn(f"{type(exc).__name__}: {exc}")
        if self.extensions and not self.built:
            # nothing to ship but Python: a wheel tagged for this platform would claim otherwise
            print(PURE, file=sys.stderr)
            self.distribution.ext_modules = []
            return
        if self.built:  # the digests of the sources, beside the modules (see build.stale)
            dest = Path(self.get_ext_fullpath(self.extensions[0].name)).parent
            if dest.is_dir():
                _engine_build().write_stamp(HERE / "air" / "engine", dest)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            _warn(f"{type(exc).__name__}: {exc}")
        else:
            self.built.append(ext.name)


class Wheel(bdist_wheel):
    """bdist_wheel that tags the wheel py3-none-any when no module was compiled
    (no C compiler): it decides the tag before the build, from the modules it
    was asked to build, and the build is what finds out."""

    def run_command(self, command):
        super().run_command(command)
        if command == "build" and not self.distribution.has_ext_modules():
            self.root_is_pure = True


def _extensions() -> list:
    if os.environ.get("CAYUGA_ENGINE", "").lower() == "python":
        return []
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError as exc:
        _warn(f"Cython is missing: {exc}")
        return []
    build = _engine_build()
    # no debug information (-g0 after Python's -g) and stripped symbols: 1 MB instead of 6 MB of modules
    unix = sys.platform != "win32"
    exts = [Extension(f"air.engine.{m}", [f"air/engine/{m}.py"], extra_compile_args=["-g0"] if unix else [],
                      extra_link_args=["-s"] if sys.platform.startswith("linux") else [])
            for m in build.MODULES]
    try:
        return cythonize(exts, compiler_directives=build.DIRECTIVES, include_path=[str(HERE)], quiet=True,
                         build_dir="build/cython")
    except Exception as exc:  # noqa: BLE001
        _warn(f"Cython failed: {exc}")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt, "bdist_wheel": Wheel})
