"""Settings: one pydantic class, loaded from config.yaml, overridden by
``CAYUGA_*`` environment variables, overridden by command-line flags.

An environment value is read by the type of its setting (:func:`env_value`):
text stays text (``CAYUGA_HOST=::``), a list of strings is JSON or ``[a, b]``
with every item a string (``CAYUGA_AUTH_TOKENS='["s3cr3t", "0123"]'``; tokens with
scopes are JSON objects: ``'[{"name": "dashboard", "token": "...", "scopes": ["watch"]}]'``),
numbers, booleans and mappings are YAML (``CAYUGA_DELAY=250``)."""

from __future__ import annotations

import json
import os
import socket
import types
import typing
from pathlib import Path
from typing import Literal

import yaml

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from air.model import Attribute, ModelError, StreamSchema, normalize_type
from air.names import name_problem

#: The configuration shipped with the project, used when none is given: package data
#: beside this module, so a wheel and a checkout load the same defaults.
DEFAULT_CONFIG = Path(__file__).resolve().parent / "config.yaml"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message says which and why."""


ENV_PREFIX = "CAYUGA_"


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", description="module:attribute")
    returns: str

    @field_validator("returns")
    @classmethod
    def _type(cls, v: str) -> str:
        try:
            return normalize_type(v)
        except ModelError as exc:
            raise ValueError(str(exc)) from None


#: What a token may do (README, "Tokens and scopes"): send events; read subscriptions' witnesses
#: and the console's read-only views; register and delete streams and subscriptions; scrape
#: /metrics; everything (the audit log included).
SCOPES = ("ingest", "watch", "manage", "metrics", "admin")
Scope = Literal["ingest", "watch", "manage", "metrics", "admin"]


class TokenSpec(BaseModel):
    """One entry of ``auth_tokens`` with a name and scopes (a plain string is a token with every
    scope, named ``auth_tokens[i]`` after its place in the list)."""

    model_config = ConfigDict(extra="forbid")

    #: How the audit log, the logs and /whoami name the token (never the secret itself).
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$",
                      description="1-64 characters of A-Z a-z 0-9 . _ : @ -")
    token: str = Field(min_length=1)
    scopes: list[Scope] = Field(min_length=1)
    #: Only the subscriptions this token registered (for manage and watch) ...
    own: bool = False
    #: ... or (also) those whose name starts with one of these; such a token names what it registers so.
    prefixes: list[str] = []

    @model_validator(mode="after")
    def _admin_reaches_all(self) -> "TokenSpec":
        if "admin" in self.scopes and (self.own or self.prefixes):
            raise ValueError(f"token {self.name}: an admin token reaches every subscription; drop 'own' and "
                             "'prefixes', or give it the scopes it needs instead of admin")
        for p in self.prefixes:
            problem = name_problem(p, what=f"prefix of token {self.name}")  # no name could start with a bad one
            if problem is not None:
                raise ValueError(problem + " (an empty prefix would match every name)")
        return self


#: The most engine worker processes one server runs.
MAX_ENGINE_WORKERS = 64


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: Where each setting :func:`load_settings` read came from (see :meth:`origin`).
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    streams: dict[str, dict[str, str]] = {}
    time_unit_ms: float = 1.0
    #: User-defined functions for CEL and AIR: NAME -> {"path": "module:attribute", "returns": type}.
    functions: dict[str, FunctionSpec] = {}

    # --- the server (cayuga serve)
    host: str = "127.0.0.1"
    http_port: int = Field(8400, ge=0, le=65535)
    tcp_port: int = Field(8401, ge=0, le=65535)
    data_dir: Path = Path("data")
    #: T: an event leaves the priority queue only when t1 < now - T (time units).
    delay: float = Field(0.0, ge=0)
    queue_capacity: int = Field(100_000, ge=1)
    batch_size: int = Field(1024, ge=1)
    max_connections: int = Field(64, ge=1)
    #: TCP event connections one client address may hold at once.
    max_connections_per_address: int = Field(16, ge=1)
    #: Seconds a TCP event connection may go without sending a complete line.
    idle_timeout: float = Field(300.0, gt=0)
    max_line_bytes: int = Field(1 << 20, ge=64)
    #: Concurrent HTTP connections, WebSockets not included. One more evicts the oldest connection
    #: that has not sent a complete request (or is idle between requests), else it is refused (503).
    max_http_connections: int = Field(256, ge=1)
    #: Concurrent WebSockets (watchers), all clients together, beside max_http_connections: one
    #: more is refused with 503 (its body names the setting).
    max_websockets: int = Field(256, ge=1)
    #: Of those, from one client address.
    max_websockets_per_address: int = Field(128, ge=1)
    #: Seconds an HTTP connection has to send complete request headers (from when it opens, and
    #: from the first byte of each later request); it is answered 408 and closed otherwise.
    http_header_timeout: float = Field(10.0, gt=0)
    #: Seconds a request body may pause while the server reads it; it is answered 408 and closed then.
    http_body_timeout: float = Field(30.0, gt=0)
    #: Largest HTTP request body (POST /events, subscriptions), in bytes: 413 beyond.
    max_body_bytes: int = Field(16 << 20, ge=1024)
    #: Longest string value of an event attribute, in bytes (UTF-8).
    max_value_bytes: int = Field(64 << 10, ge=1)
    #: "clock": the server's clock orders events (t1 < now - delay leaves the queue);
    #: "event": event time, the watermark is the newest t1 received minus delay (replays).
    time: Literal["clock", "event"] = "clock"
    #: With time: clock, how far ahead of the server clock an event's t1 may be, in seconds.
    max_future: float = Field(86_400.0, ge=0)
    #: Subscriptions one server holds; registering one more is refused (403).
    max_subscriptions: int = Field(1_000_000, ge=1)
    #: States of one automaton, and predicate atoms over all its edges; larger ones are refused.
    max_states: int = Field(256, ge=2)
    max_predicate_atoms: int = Field(4096, ge=1)
    #: Memory for automaton state (every subscription's partial matches), in bytes, as the
    #: engine estimates it from its own instance layout (air/engine/footprint.py): an int, a
    #: size ("4GiB", "512MB"), a share of the machine's memory ("25%"), or "auto" (25% of
    #: physical memory or of the cgroup's limit, whichever is smaller). Checked every
    #: server/budget.py CHECK_EVENTS events; above it, the heaviest subscriptions lose their
    #: oldest instances down to 90% of it, deterministically, and are marked inexact.
    max_state_bytes: int = Field("auto", validate_default=True)
    #: An optional cap on the live instances of every subscription (0: none, the default; a
    #: subscription may set its own in its registration body: max_instances, max_state_bytes).
    max_instances_per_subscription: int = Field(0, ge=0)
    #: Engine workers (server/workers/): 1 (the default) runs the automata in a worker process of
    #: their own, beside this process's interpreter lock, not under it; 0 on an engine thread here;
    #: N (or "auto": the machine's cores but one) partitions the subscriptions over N workers.
    engine_workers: int = Field(1, ge=0, le=MAX_ENGINE_WORKERS, validate_default=True)
    #: TCP reader processes (server/ingest/readers.py): 1 parses every TCP connection's lines in a
    #: process of its own, beside this process's interpreter lock, not under it; 0 on a thread here
    #: each; "auto" (the default) 1 on a machine of 4 cores or more, else 0.
    receivers: int = Field("auto", ge=0, le=1, validate_default=True)
    #: Row scaling with N > 1 engine workers (server/workers/placement.py): "auto" (the default)
    #: splits a subscription that keeps instances and has a partition key (a NEXT or FOLD on
    #: $1.Name = $2.Name) by its key's value over every worker; "on" splits every subscription
    #: with a key; "off" places each subscription whole on one worker (column scaling only).
    row_scaling: Literal["auto", "on", "off"] = "auto"
    #: Witnesses buffered in memory per WebSocket client; a client that lets it fill
    #: lags: it is served from the witness log until it catches up.
    client_buffer: int = Field(100_000, ge=1)
    #: Retired: a slow client now lags on the witness log instead of being cut or losing
    #: witnesses. Still accepted (any value; a warning at start-up) so old files start.
    slow_client_policy: str | None = None
    #: The witness log (data_dir/witnesses): whole segments, oldest first, are deleted
    #: beyond this many bytes or once their newest witness is older than this many seconds.
    witness_log_bytes: int = Field(1 << 30, ge=4096)
    witness_log_seconds: float = Field(86_400.0, gt=0)
    #: Bearer tokens: plain strings (every scope) or TokenSpec entries (a name, scopes, a reach).
    auth_tokens: list[str | TokenSpec] = []
    #: TLS on the HTTP port (REST, WebSockets, console) and the TCP event port: a PEM certificate
    #: (chain) and its private key (None: the key is in the certificate file); reloaded on SIGHUP.
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    #: Mutual TLS: every client must present a certificate signed by a CA of this PEM file.
    tls_client_ca: Path | None = None
    #: The audit log (data_dir/audit): a file is rotated beyond this many bytes; this many are kept.
    audit_log_bytes: int = Field(16 << 20, ge=4096)
    audit_log_files: int = Field(8, ge=1)
    #: The event journal (server/durability/journal.py): "fsync" acknowledges events once synced to disk
    #: (survives power loss), "write" once written to the OS (survives kill -9 of the server),
    #: "off" keeps no journal (acknowledged once queued; a crash loses what is queued).
    durability: Literal["fsync", "write", "off"] = "fsync"
    #: A start whose configured streams change the schemas of stored subscriptions (a type changed,
    #: an attribute removed or moved, an output re-typed) is refused unless this accepts it: those
    #: subscriptions are then recompiled and start afresh (server/subscriptions/schemacheck.py).
    #: ``cayuga serve --accept-schema-changes`` sets it for one start.
    accept_schema_changes: bool = False
    #: A new journal segment starts beyond this many bytes.
    journal_segment_bytes: int = Field(64 << 20, ge=4096)
    #: ``durability: fsync``: milliseconds at least between two syncs of the journal nobody waits for
    #: (group commit: what comes meanwhile joins the next); one is waited for (``POST /events``, a TCP
    #: sender's acknowledgement once its input pauses, a snapshot) starts at once. 0: as often as it can.
    journal_sync_ms: float = Field(10.0, ge=0, le=1000)
    #: History kept on purpose (docs/design/backfill.md): journal segments recovery no longer needs
    #: stay while they hold events newer than the newest event's time less this duration ("24h",
    #: "90m", "30s", "2d", or seconds; "0": none kept for it) ...
    retain_duration: float = Field("24h", validate_default=True)
    #: ... and while the journal holds at most this many bytes ("1GiB", "512MB"); the oldest go first.
    retain_bytes: int = Field("1GiB", validate_default=True)
    shutdown_timeout: float = Field(10.0, gt=0)
    #: A snapshot of the processing state at most this many seconds apart (0: only at shutdown) ...
    snapshot_seconds: float = Field(60.0, ge=0)
    #: ... or once the engine has taken this many events since the last one, whichever comes first.
    snapshot_events: int = Field(1_000_000, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: /metrics: ``cayuga_subscription_instances{subscription}`` for the subscriptions holding
    #: the most live instances, this many of them (0: none); the aggregates cover every one.
    metrics_top_subscriptions: int = Field(10, ge=0, le=10_000)
    #: /metrics: ``cayuga_subscription_instances`` for every subscription instead, one series
    #: each (10K subscriptions made a 438 KB scrape; max_subscriptions allows 1M).
    metrics_per_subscription: bool = False

    @field_validator("streams")
    @classmethod
    def _types(cls, v: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        for stream, attrs in v.items():
            problem = name_problem(str(stream), what="stream name", identifier=True)
            if problem is not None:
                raise ValueError(problem)
            for name, typ in attrs.items():
                problem = name_problem(str(name), what=f"attribute name in stream {stream}", identifier=True)
                if problem is not None:
                    raise ValueError(problem)
                try:
                    normalize_type(str(typ))
                except ModelError as exc:
                    raise ValueError(f"stream {stream}, attribute {name}: {exc}") from None
        return v

    @field_validator("auth_tokens", mode="before")
    @classmethod
    def _token_entries(cls, v):
        """Each entry a string or a TokenSpec, with the errors of the entry and nothing of the union's."""
        if not isinstance(v, list):
            return v
        out = []
        for i, entry in enumerate(v):
            if isinstance(entry, (str, TokenSpec)):
                out.append(entry)
                continue
            if not isinstance(entry, dict):
                raise ValueError(f"auth_tokens[{i}] is not a string (YAML read it as {type(entry).__name__}; the "
                                 "value is not shown: it may be a secret): quote the token ('0123'), or write it as "
                                 '{"name": ..., "token": ..., "scopes": [...]}')
            try:
                out.append(TokenSpec.model_validate(entry))
            except ValidationError as exc:
                what = f"auth_tokens[{i}]" + (f" ({entry['name']})" if isinstance(entry.get("name"), str) else "")
                problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}" for e in exc.errors())
                raise ValueError(f"{what}: {problems} (scopes are {', '.join(SCOPES)}; a name is 1-64 "
                                 "characters of A-Z a-z 0-9 . _ : @ -)") from None
        return out

    @field_validator("auth_tokens")
    @classmethod
    def _distinct_tokens(cls, v: list) -> list:
        names, secrets = set(), set()
        for i, entry in enumerate(v):
            name, secret = (f"auth_tokens[{i}]", entry) if isinstance(entry, str) else (entry.name, entry.token)
            if not secret:
                raise ValueError(f"auth_tokens[{i}] is empty: a token must be at least one character")
            if name in names:
                raise ValueError(f"two tokens are named {name}: names identify tokens in the audit log; "
                                 "give each its own")
            if secret in secrets:
                raise ValueError(f"{name} has the same secret as an earlier token: each token needs its own, "
                                 "or the server could not tell them apart")
            names.add(name)
            secrets.add(secret)
        return v

    @model_validator(mode="after")
    def _tls_needs_a_certificate(self) -> "Settings":
        for name in ("tls_keyfile", "tls_client_ca"):
            if getattr(self, name) is not None and self.tls_certfile is None:
                raise ValueError(f"{name} is set but tls_certfile is not: TLS needs the server's certificate "
                                 "(tls_certfile, CAYUGA_TLS_CERTFILE) as well")
        return self

    @field_validator("engine_workers", mode="before")
    @classmethod
    def _workers(cls, v):
        if isinstance(v, str) and v.strip().lower() == "auto":
            return max(1, min((os.cpu_count() or 2) - 1, MAX_ENGINE_WORKERS))
        return v

    @field_validator("receivers", mode="before")
    @classmethod
    def _receivers(cls, v):
        if isinstance(v, str) and v.strip().lower() == "auto":
            return 1 if (os.cpu_count() or 1) >= 4 else 0
        return v

    @field_validator("max_state_bytes", mode="before")
    @classmethod
    def _state_bytes(cls, v):
        return parse_bytes(v, what="max_state_bytes", auto=True)

    @field_validator("retain_duration", mode="before")
    @classmethod
    def _retain_duration(cls, v):
        return parse_duration(v, what="retain_duration")

    @field_validator("retain_bytes", mode="before")
    @classmethod
    def _retain_bytes(cls, v):
        return parse_bytes(v, what="retain_bytes")

    @property
    def retain_units(self) -> float:
        """retain_duration in event time units (time_unit_ms)."""
        return self.retain_duration * 1000.0 / self.time_unit_ms

    @field_validator("durability", mode="before")
    @classmethod
    def _off(cls, v):
        return "off" if v is False else v  # YAML reads a bare off (config.yaml, CAYUGA_DURABILITY=off) as false

    @field_validator("time_unit_ms")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be a positive number of milliseconds")
        return v

    def origin(self, name: str) -> str:
        """Where setting ``name`` came from, for a message that names it: ``the flag --http-port``,
        ``CAYUGA_HTTP_PORT=8400``, ``http_port in FILE``, or its default."""
        return self._origins.get(name) or f"the default {name}"

    def function_specs(self) -> dict[str, tuple[str, str]]:
        """NAME -> (module:attribute, return type): plain data that can be shipped
        to another process (Spark executors) and imported there."""
        return {name: (spec.path, spec.returns) for name, spec in self.functions.items()}

    def function_registry(self):
        """The built-in functions plus the configured ones, imported now."""
        return import_functions(self.function_specs())

    def stream_schemas(self) -> list[StreamSchema]:
        return [StreamSchema(name, tuple(Attribute(a, normalize_type(t)) for a, t in attrs.items()))
                for name, attrs in self.streams.items()]


#: "auto" for max_state_bytes: this share of the machine's memory (server/budget.py says why).
AUTO_STATE_SHARE = 0.25
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
          "t": 1000 ** 4, "tb": 1000 ** 4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's physical memory, or
    its cgroup's limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) where smaller."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value, *, what: str) -> float:
    """Seconds from a number or a string: ``"24h"``, ``"90m"``, ``"30s"``, ``"2d"``, ``"1w"``, ``"500ms"``."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a duration such as 24h, 90m, 30s or 2d, not {value!r}")
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        try:
            n = float(digits) * _SECONDS[text[len(digits):] or "s"]
        except (ValueError, KeyError):
            raise ValueError(f"{what}: {value!r} is not a duration; write e.g. 24h, 90m, 30s, 2d or a number "
                             "of seconds") from None
    if not n >= 0 or n == float("inf"):
        raise ValueError(f"{what}: must be a finite duration of at least 0, not {value!r}")
    return n


def parse_bytes(value, *, what: str, auto: bool = False, percent_of: int | None = None) -> int:
    """A size in bytes from an int or a string: ``"4GiB"``, ``"512 MB"``, ``"25%"``
    (of the machine's memory, or of ``percent_of``), or (with ``auto``) ``"auto"``."""
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a size such as 4GiB, 512MB, 25% or a number of bytes, not {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    else:
        text = str(value).strip().lower().replace(" ", "").replace("_", "")
        if auto and text == "auto":
            return int(machine_memory() * AUTO_STATE_SHARE)
        try:
            if text.endswith("%"):
                share = float(text[:-1]) / 100
                if not 0 < share <= 1:
                    raise ValueError
                n = int((percent_of if percent_of is not None else machine_memory()) * share)
            else:
                digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
                n = int(float(digits) * _UNITS[text[len(digits):]])
        except (ValueError, KeyError):
            raise ValueError(f"{what}: {value!r} is not a size; write e.g. 4GiB, 512MB, 25% (of memory)"
                             + (", auto" if auto else "") + " or a number of bytes") from None
    if n < 1:
        raise ValueError(f"{what}: must be at least 1 byte, not {value!r}")
    return n


def import_functions(specs: dict[str, tuple[str, str]]):
    """A FunctionRegistry of the built-ins plus ``specs`` (see Settings.function_specs);
    a function that cannot be imported is a :class:`ConfigError`."""
    from air.engine.functions import FunctionImportError
    from air.engine.functions import import_functions as import_registry

    try:
        return import_registry(specs)
    except FunctionImportError as exc:
        raise ConfigError(str(exc)) from None


def env_value(annotation, raw: str):
    """A ``CAYUGA_*`` variable's value for a setting of type ``annotation``:
    text settings (host, paths, names, durability) keep the string as it is
    (``CAYUGA_HOST=::`` is the host ``::``); a list of strings is JSON
    (``'["a", "b"]'``), or ``[a, b]`` / one bare value, every item a string (a
    token ``0123`` stays ``"0123"``); numbers, booleans and mappings are read
    as YAML (``CAYUGA_DELAY=250``, ``CAYUGA_STREAMS='{T: {X: int}}'``)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:  # optional: empty means none
        inner = [a for a in args if a is not type(None)]
        if not raw.strip():
            return None
        if len(inner) == 1:
            return env_value(inner[0], raw)
    if annotation in (str, Path) or origin is Literal:
        return raw
    if origin is list and args and args[0] is not str and str in typing.get_args(args[0]):
        value = None  # a list of strings or objects (auth_tokens): JSON, else the plain forms below
        try:
            value = json.loads(raw.strip())
        except ValueError:
            pass
        if isinstance(value, list):
            return value
        annotation = list[str]
    if origin is list and typing.get_args(annotation) == (str,):
        text = raw.strip()
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, list):
            return value
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
            return [item.strip().strip("'\"") for item in text.split(",") if item.strip()]
        return [text] if text else []
    try:
        return yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw


def load_settings(path: str | Path | None = None, **overrides) -> Settings:
    """Settings from ``path`` (default: the bundled config.yaml), then the
    environment, then explicit ``overrides`` (e.g. from command-line flags)."""
    p = Path(path) if path is not None else DEFAULT_CONFIG
    if path is None and not p.exists():  # never run on silently empty defaults (no streams, no limits)
        raise ConfigError(f"the bundled default configuration {p} is missing: this installation is incomplete; "
                          "reinstall cayuga, or give --config FILE")
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
    merged = dict(data)
    origins = {name: f"{name} in {'the bundled ' if path is None else ''}{p}" for name in data}
    for name, field in Settings.model_fields.items():
        raw = os.environ.get(ENV_PREFIX + name.upper())
        if raw is not None:
            merged[name] = env_value(field.annotation, raw)
            origins[name] = f"{ENV_PREFIX}{name.upper()}" + ("" if name == "auth_tokens" else f"={raw}")
    given = {k: v for k, v in overrides.items() if v is not None}
    merged.update(given)
    origins.update({k: f"the flag --{k.replace('_', '-')}" for k in given})  # cayuga serve's flags
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{p} (or a CAYUGA_* environment variable): {problems}") from None
    settings._origins = origins
    return settings


#: The server's ports: what each is called in a message, and the flag that sets it.
_PORTS = {"http_port": ("HTTP", "--http-port"), "tcp_port": ("TCP event", "--tcp-port")}


def port_clash(settings: Settings) -> ConfigError | None:
    """The refusal when ``http_port`` and ``tcp_port`` name the same port (not 0): the HTTP
    API and the event port need one each. Both sockets would bind (each allows a port
    bound but not yet listened on) and the second to listen would fail after the start."""
    port = settings.http_port
    if not port or port != settings.tcp_port:
        return None
    return ConfigError(f"cannot start: the HTTP port and the TCP event port are both {port} (http_port from "
                       f"{settings.origin('http_port')}, tcp_port from {settings.origin('tcp_port')}); each needs "
                       f"a port of its own: give one of them another, e.g. --tcp-port N or {ENV_PREFIX}TCP_PORT=N "
                       "(0 picks a free one, and --port-file FILE says which)")


def port_refusal(exc: OSError, settings: Settings, name: str) -> ConfigError:
    """Why the server cannot listen on its ``http_port`` or ``tcp_port`` (``name``), in
    one line: the port, the setting that chose it, and how to choose another."""
    import errno

    what, flag = _PORTS[name]
    port, host = getattr(settings, name), settings.host
    other = (f"give this server another port: {flag} N or {ENV_PREFIX}{name.upper()}=N (0 picks a free one, "
             "and --port-file FILE says which)")
    if exc.errno == errno.EADDRINUSE:
        why = (f"the {what} port {port} on {host} is in use (by another cayuga serve, or another program: "
               f"`ss -ltnp 'sport = :{port}'` names it)")
    elif exc.errno == errno.EACCES:
        why = f"the {what} port {port} on {host} may not be used by this user (ports below 1024 need privileges)"
    elif exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return ConfigError(f"cannot start: {host} is no address of this machine ({exc.strerror or exc}; the host "
                           f"comes from {settings.origin('host')}): give --host or {ENV_PREFIX}HOST an address of its own, "
                           "e.g. 127.0.0.1, or 0.0.0.0 for all")
    else:
        why = f"cannot listen on the {what} port {port} on {host}: {exc}"
    return ConfigError(f"cannot start: {why}; the port comes from {settings.origin(name)}: {other}")
