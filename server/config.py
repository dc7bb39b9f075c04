"""Settings: one pydantic-settings class, loaded from config.yaml and overridden
by ``CAYUGA_*`` environment variables (environment wins)."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from air.model import Attribute, ModelError, StreamSchema, normalize_type

#: The configuration shipped with the project, used when none is given.
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config.yaml"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message says which and why."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CAYUGA_", extra="forbid", env_nested_delimiter="__")

    streams: dict[str, dict[str, str]] = {}
    time_unit_ms: float = 1.0

    @field_validator("streams")
    @classmethod
    def _types(cls, v: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for stream, attrs in v.items():
            for name, typ in attrs.items():
                try:
                    normalize_type(str(typ))
                except ModelError as exc:
                    raise ValueError(f"stream {stream}, attribute {name}: {exc}") from None
        return v

    @field_validator("time_unit_ms")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be a positive number of milliseconds")
        return v

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return env_settings, init_settings

    def stream_schemas(self) -> list[StreamSchema]:
        return [StreamSchema(name, tuple(Attribute(a, normalize_type(t)) for a, t in attrs.items()))
                for name, attrs in self.streams.items()]


def load_settings(path: str | Path | None = None, **overrides) -> Settings:
    """Settings from ``path`` (default: the bundled config.yaml), then the
    environment, then explicit ``overrides`` (e.g. from command-line flags)."""
    p = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) if p.exists() else {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    if path is not None and not p.exists():
        raise ConfigError(f"{p}: no such configuration file")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of setting names to values")
    try:
        settings = Settings(**data)
        if overrides:
            settings = settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})
            Settings.model_validate(settings.model_dump())
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{p} (or a CAYUGA_* environment variable): {problems}") from None
    return settings
