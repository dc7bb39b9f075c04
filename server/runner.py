"""Offline runs: queries (AIR or CEL) over an event file, witnesses to JSON lines.

This wires the pieces together without a server: stream declarations, query
loading, a line decoder and the engine. Input events are sorted by detection
time (stably, so simultaneous events keep file order) because a file is
complete; the server instead releases events through its T-delayed queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, TextIO

from air.airxml import load_air_many, load_stream_types
from air.model import Automaton, StreamSchema, parse_stream_decl
from air.errors import CayugaError
from server.engine import Engine, EngineError, Event, FunctionRegistry
from server.formats import LineError, encode_json, make_decoder, witness_dict


class QueryError(CayugaError):
    """A query file that cannot be loaded; the message starts with its path."""


@dataclass
class Rejected:
    line: int
    text: str
    reason: str


@dataclass
class RunResult:
    witnesses: list[dict] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    events: int = 0


def load_streams(decls: Iterable[str] = (), schema_files: Iterable[str | Path] = ()) -> list[StreamSchema]:
    out = [parse_stream_decl(d) for d in decls]
    for f in schema_files:
        out.extend(load_stream_types(Path(f).read_bytes()))
    return out


def load_query(path: str | Path, streams: dict[str, StreamSchema],
               functions: FunctionRegistry | None = None) -> list[Automaton]:
    """Automata of one query file: ``.xml`` is AIR, ``.cel`` is CEL (compiled)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".cel":
        from air.cel import compile_cel

        fns = (functions or FunctionRegistry.default()).return_types()
        return list(compile_cel(text, streams, functions=fns, name_prefix=p.stem).automata)
    return load_air_many(text, name=p.stem)


def decode_file(lines: Iterable[str], fmt: str, streams: Callable, result: RunResult,
                default_stream: str | None = None) -> list[Event]:
    decoder = make_decoder(fmt, streams, default_stream=default_stream)
    events: list[Event] = []
    for no, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        try:
            ev = decoder.decode(line)
        except LineError as exc:
            result.rejected.append(Rejected(no, line, str(exc)))
            continue
        if ev is not None:
            events.append(ev)
    return events


def load_engine(streams: Iterable[StreamSchema], queries: Iterable[str | Path],
                functions: FunctionRegistry | None = None) -> tuple[Engine, list[tuple[str, list[Automaton]]]]:
    """An engine with ``streams`` declared and each query file loaded under its
    file stem, in order (so later queries may read earlier outputs); returns it
    with the (owner, automata) pairs. Raises QueryError naming the file."""
    engine = Engine(functions)
    for s in streams:
        engine.declare(s)
    loaded = []
    for q in queries:
        try:
            autos = load_query(q, engine.streams, engine.functions)
            engine.add(autos, owner=Path(q).stem)
        except (CayugaError, EngineError) as exc:
            raise QueryError(f"{q}: {exc}") from None
        loaded.append((Path(q).stem, autos))
    return engine, loaded


def run_offline(streams: list[StreamSchema], queries: list[str | Path], events_in: TextIO,
                fmt: str = "jsonl", *, include_resub: bool = False,
                functions: FunctionRegistry | None = None,
                on_witness: Callable[[dict], None] | None = None) -> RunResult:
    engine, _ = load_engine(streams, queries, functions)
    result = RunResult()
    events = decode_file(events_in, fmt, engine.schema, result)
    events.sort(key=lambda e: e.t1)
    result.events = len(events)

    def emit(em) -> None:
        if em.kind == "OUT" or include_resub:
            w = witness_dict(em.stream, em.event, engine.schema(em.stream))
            result.witnesses.append(w)
            if on_witness is not None:
                on_witness(w)

    engine.on_emit = emit
    for ev in events:
        engine.feed(ev)
    engine.flush()
    return result


def write_witnesses(witnesses: Iterable[dict], out: TextIO) -> None:
    for w in witnesses:
        out.write(encode_json(w) + "\n")
