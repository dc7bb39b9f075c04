"""What a change of the configured streams does to the stored subscriptions,
checked before a start (issue 33).

The store records the configuration's streams each start runs with
(``Store.started_with``). When a start's differ, every stored subscription is
compiled against the streams of the last start and against the new ones, in
registration order (a query may read another's outputs), and compared:

- an attribute of a stream it reads whose type changed, that was removed, or
  that moved (a journal's events hold values by position), or a change of what
  it publishes (its output streams' attributes and types), is a **schema
  change**: the start is refused (``cayuga serve`` exits 2, one line per such
  subscription naming the stream, the attribute, the old and the new type)
  unless ``accept_schema_changes`` (``--accept-schema-changes``) accepts it:
  then it is recompiled against the new schemas and installed afresh once the
  recovery's replay is over (its partial matches and the journal's old events
  were of the old schemas), with every subscription reading its outputs, its
  witnesses numbered on. An attribute added at the end of a stream it reads
  changes nothing it sees;
- a subscription that no longer compiles (it reads a stream no longer
  declared, or its query no longer type-checks) is **broken**: kept in the
  store, listed with the reason (server/subscriptions/broken.py), not run, and
  back by itself at a start whose configuration fits it again.

A broken subscription's last working schemas are stored with it, so that a
later start compares against those (its config fitted then), not against a
configuration it never ran with.
"""

from __future__ import annotations

import json
import logging
import time
from collections import ChainMap
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from air.cel.shapes import ShapeCache
from air.errors import CayugaError
from air.model import Attribute, StreamSchema
from server.config import ConfigError
from server.durability.store import BrokenRow, StoredSubscription
from server.subscriptions.registry import compile_subscription

log = logging.getLogger("cayuga.daemon")

Attrs = tuple[tuple[str, str], ...]  # a stream's attributes: (name, type), in order
#: At most this many affected subscriptions are listed, one a line, when a start is refused.
MAX_LINES = 100


class SchemaChangeRefused(ConfigError):
    """A start refused: the configured streams' new schemas change stored subscriptions."""


@dataclass
class Compiled:
    """What one subscription reads and publishes, compiled against one set of streams."""

    reads: dict[str, Attrs] = field(default_factory=dict)  # streams it reads (not its own), their attributes
    outputs: dict[str, Attrs] = field(default_factory=dict)  # its output streams
    published: dict[str, Attrs] = field(default_factory=dict)  # every stream it publishes (outputs, internal)
    error: str | None = None  # why it does not compile (the first line of the compiler's message)

    def schemas(self) -> str:
        """As stored with a broken subscription: what it last ran with."""
        return json.dumps({"reads": self.reads, "outputs": self.outputs}, separators=(",", ":"))

    @classmethod
    def stored(cls, text: str | None) -> "Compiled | None":
        try:
            data = json.loads(text) if text else None
            outputs = {k: tuple(map(tuple, v)) for k, v in data["outputs"].items()}
            return cls({k: tuple(map(tuple, v)) for k, v in data["reads"].items()}, outputs, dict(outputs))
        except (TypeError, ValueError, KeyError, AttributeError):
            return None


@dataclass
class Outcome:
    """What the new streams do to one stored subscription."""

    sid: str
    name: str | None
    changes: list[str]  # its schema changes: "input Trade.Qty int -> string", "output Rising.After ..."
    broken: BrokenRow | None = None  # it no longer compiles

    def line(self) -> str:
        return f"{self.sid}{f' ({self.name})' if self.name else ''}: {'; '.join(self.changes)}"


@dataclass
class SchemaCheck:
    """The outcome of a start's check: what to record, refuse, recompile or mark broken."""

    streams: dict[str, list[tuple[str, str]]]  # the configuration's streams of this start (recorded)
    affected: list[Outcome] = field(default_factory=list)  # schema changes
    broken: list[BrokenRow] = field(default_factory=list)  # no longer compile
    fresh: list[str] = field(default_factory=list)  # installed afresh (accepted changes and their readers)

    def refusal(self) -> str:
        n = len(self.affected)
        lines = [f"  {o.line()}" for o in self.affected[:MAX_LINES]]
        if n > MAX_LINES:
            lines.append(f"  and {n - MAX_LINES} more")
        return (f"cannot start: the configured streams changed since this data directory's last start, and the "
                f"change alters the schemas of {n} stored subscription{'s' if n > 1 else ''}:\n"
                + "\n".join(lines) + "\n"
                "Restore the streams' previous attributes and types in the configuration (config.yaml's streams, "
                "or CAYUGA_STREAMS), or start with --accept-schema-changes (CAYUGA_ACCEPT_SCHEMA_CHANGES=true) to "
                "recompile them against the new schemas: each then starts afresh once the journal is replayed (no "
                "partial match carried over), its witnesses numbered on; one that no longer compiles is kept, "
                "marked broken")


def catalogue(schemas: Iterable[StreamSchema]) -> dict[str, list[tuple[str, str]]]:
    return {s.name: [(a.name, a.type) for a in s.attributes] for s in schemas}


def _schema(name: str, attrs) -> StreamSchema:
    return StreamSchema(name, tuple(Attribute(a, t) for a, t in attrs))


def compile_all(stored: list[StoredSubscription], streams: Mapping[str, StreamSchema], functions: dict[str, str],
                time_unit_ms: float) -> dict[str, Compiled]:
    """Each stored subscription compiled against ``streams`` and the outputs of
    those before it that compile (registration order), one compile per CEL
    query shape."""
    shapes = ShapeCache()
    published: dict[str, StreamSchema] = {}
    view = ChainMap(published, streams)
    out: dict[str, Compiled] = {}
    for st in stored:
        try:
            autos, outs = compile_subscription(st.kind, st.text, view, st.id, functions, time_unit_ms, shapes)
        except CayugaError as exc:
            out[st.id] = Compiled(error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            continue
        c = Compiled()
        for a in autos:
            for state, o in a.outputs:
                attrs = tuple((x.name, x.type) for x in state.schema)
                c.published.setdefault(o.name, attrs)
                if o.name in outs:
                    c.outputs.setdefault(o.name, attrs)
        for a in autos:
            for state in a.states:
                s = state.input_stream
                if s and s not in c.published and s in view:
                    c.reads[s] = tuple((x.name, x.type) for x in view[s].attributes)
        for name, attrs in c.published.items():
            published.setdefault(name, _schema(name, attrs))
        out[st.id] = c
    return out


def _diff(stream: str, old: Attrs, new: Attrs, reading: bool) -> list[str]:
    """The changes of ``stream``'s attributes as one of its readers (``reading``)
    or its publisher sees them."""
    where = "input" if reading else "output"
    pos = {a: (i, t) for i, (a, t) in enumerate(new)}
    out = []
    for i, (a, t) in enumerate(old):
        if a not in pos:
            out.append(f"{where} {stream}.{a} {t} -> (removed)")
        elif pos[a][1] != t:
            out.append(f"{where} {stream}.{a} {t} -> {pos[a][1]}")
        elif pos[a][0] != i:
            out.append(f"{where} {stream}.{a} moved from attribute {i + 1} to {pos[a][0] + 1}")
    if not reading:
        had = {a for a, _t in old}
        out += [f"{where} {stream}.{a} (none) -> {t}" for a, t in new if a not in had]
    return out


def check(stored: list[StoredSubscription], last: dict[str, list[tuple[str, str]]] | None,
          config: list[StreamSchema], declared: list[tuple[str, list[tuple[str, str]]]],
          broken: dict[str, BrokenRow], functions: dict[str, str], time_unit_ms: float,
          accept: bool) -> SchemaCheck:
    """Compare the stored subscriptions under the configuration's streams of the
    last start (``last``; None: not recorded, nothing to compare) and of this one
    (``config``); ``declared``: streams declared through the API (unchanged);
    ``broken``: the broken ones' rows. Raises :class:`SchemaChangeRefused` when
    schemas change and ``accept`` is false."""
    now = catalogue(config)
    result = SchemaCheck(now)
    if last is None or {n: [tuple(a) for a in v] for n, v in last.items()} == now or not stored:
        return result
    api = {n: _schema(n, attrs) for n, attrs in declared}
    before = compile_all(stored, {**{n: _schema(n, a) for n, a in last.items()}, **api}, functions, time_unit_ms)
    after_streams = {**{s.name: s for s in config}, **api}
    after = compile_all(stored, after_streams, functions, time_unit_ms)
    owner: dict[str, str] = {}  # stream -> the subscription that published it before
    new_published: dict[str, Attrs] = {}
    fresh: set[str] = set()
    for st in stored:
        old, new = before[st.id], after[st.id]
        if old.error is not None:  # it did not compile then either: compare with what it last ran with
            old = Compiled.stored(broken[st.id].schemas) if st.id in broken else None
        changes: list[str] = []
        gone: list[str] = []
        if old is not None:
            for stream, attrs in old.reads.items():
                now_attrs = new.reads.get(stream) if new.error is None else (
                    new_published.get(stream) or (tuple((a.name, a.type) for a in after_streams[stream].attributes)
                                                  if stream in after_streams else None))
                if now_attrs is None:
                    gone.append(stream)
                else:
                    changes += _diff(stream, attrs, now_attrs, reading=True)
            if new.error is None:
                for stream, attrs in old.outputs.items():
                    if stream not in new.outputs:
                        changes.append(f"output {stream} is no longer published")
                    else:
                        changes += _diff(stream, attrs, new.outputs[stream], reading=False)
        if changes:
            result.affected.append(Outcome(st.id, st.name, changes))
            if accept:
                fresh.add(st.id)
        if old is not None and any(owner.get(s) in fresh for s in old.reads):
            fresh.add(st.id)  # it reads what a recompiled subscription publishes: it starts afresh with it
        if new.error is not None:
            row = broken.get(st.id)
            reason = _reason(new.error, gone, owner, {b.sid for b in result.broken}, changes)
            upstream = next((owner[s] for s in gone if s in owner), None)
            since = row.since if row is not None else time.time()
            schemas = (row.schemas if row is not None and before[st.id].error is not None
                       else old.schemas() if old is not None else None)
            result.broken.append(BrokenRow(st.id, reason, since, upstream, schemas))
        else:
            new_published.update(new.published)
        if old is not None:
            for stream in old.published:
                owner.setdefault(stream, st.id)
    result.fresh = [st.id for st in stored if st.id in fresh and after[st.id].error is None]
    if result.affected and not accept:
        raise SchemaChangeRefused(result.refusal())
    return result


def _reason(error: str, gone: list[str], owner: dict[str, str], broken: set[str], changes: list[str]) -> str:
    """Why a subscription no longer compiles, in words."""
    for stream in gone:
        if owner.get(stream) in broken:
            return (f"it reads {stream}, which subscription {owner[stream]} publishes, and {owner[stream]} is "
                    "broken")
    if gone:
        return (f"it reads stream {', '.join(gone)}, which the configuration no longer declares (streams in "
                "config.yaml or CAYUGA_STREAMS)")
    if changes:
        return f"it no longer compiles against the streams' new schemas ({'; '.join(changes)}): {error}"
    return f"it no longer compiles: {error}"
