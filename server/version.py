"""The version, written once: pyproject.toml's ``[project] version``. The API
(``/openapi.json``) and ``cayuga_build_info`` both report it from here."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path


def version() -> str:
    """The installed distribution's version, or in a source tree that was never
    installed, its pyproject.toml's ("0+unknown" when neither can be read)."""
    try:
        return importlib.metadata.version("cayuga")
    except importlib.metadata.PackageNotFoundError:
        try:
            return tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
                "project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"
