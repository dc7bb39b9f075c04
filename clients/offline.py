"""Offline runs: queries (AIR or CEL) over an event file, witnesses to JSON lines.

This wires the pieces together without a server: stream declarations, query
loading, a line decoder and the engine. Input events are sorted by detection
time (stably, so simultaneous events keep file order) because a file is
complete; the server instead releases events through its T-delayed queue.
"""

from __future__ import annotations

import gc
import itertools
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Mapping, TextIO

from air.airxml import load_air_many, load_stream_types
from air.boundwarn import BoundWarning, air_warnings, cel_warnings
from air.cel.shapes import ShapeCache
from air.engine.memory import paused_gc
from air.engine import Engine, EngineError, Event, FunctionRegistry
from air.engine.convert import sort_by_t1
from air.errors import CayugaError
from air.formats import encode_emissions, encode_json, make_decoder, witness_dict
from air.model import Automaton, StreamSchema, parse_stream_decl


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
    witness_count: int = 0


def load_streams(decls: Iterable[str] = (), schema_files: Iterable[str | Path] = ()) -> list[StreamSchema]:
    out = [parse_stream_decl(d) for d in decls]
    for f in schema_files:
        out.extend(load_stream_types(Path(f).read_bytes()))
    return out


def load_query(path: str | Path, streams: Mapping[str, StreamSchema],
               functions: FunctionRegistry | None = None, shapes: ShapeCache | None = None,
               function_types: Mapping[str, str] | None = None,
               on_warning: Callable[[BoundWarning], None] | None = None) -> list[Automaton]:
    """Automata of one query file: ``.xml`` is AIR, ``.cel`` is CEL (compiled,
    through ``shapes`` when given: queries that differ only in constants are
    compiled once), ``.sase`` is SASE (docs/design/sase.md). ``on_warning`` is
    called with each clause that keeps automaton instances without a time
    bound (air/boundwarn.py)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    check_language(p, text)
    if p.suffix.lower() == ".sase":
        from air.sase import compile_sase

        fns = function_types if function_types is not None else (functions or FunctionRegistry.default()).return_types()
        sase = compile_sase(text, streams, functions=fns, name_prefix=p.stem)
        if on_warning is not None:
            for w in sase.warnings:
                on_warning(w)
        return list(sase.automata)
    if p.suffix.lower() == ".cel":
        from air.cel import compile_cel

        fns = function_types if function_types is not None else (functions or FunctionRegistry.default()).return_types()
        compile_ = shapes.compile if shapes is not None else compile_cel
        compiled = compile_(text, streams, functions=fns, name_prefix=p.stem)
        if on_warning is not None:
            for w in cel_warnings(text, compiled):
                on_warning(w)
        return list(compiled.automata)
    autos = load_air_many(text, name=p.stem)
    if on_warning is not None:
        for w in air_warnings(autos, text):
            on_warning(w)
    return autos


#: A query file's language, by its suffix: the one list the commands and their messages read.
QUERY_FILES = {".cel": "CEL", ".xml": "AIR XML", ".sase": "SASE"}
QUERY_SUFFIXES = tuple(QUERY_FILES)


def _looks_like(text: str) -> str:
    """The suffix ``text`` reads as: AIR XML starts with '<', SASE with EVENT (after comments and
    blanks), CEL with neither."""
    import re

    head = re.sub(r"^(?:\s+|\ufeff|--[^\n]*|//[^\n]*|/\*.*?\*/)*", "", text, flags=re.S)
    return ".xml" if head.startswith("<") else ".sase" if re.match(r"EVENT\b", head, re.I) else ".cel"


def check_language(p: Path, text: str) -> None:
    """Refuse a file whose suffix names no query language (``q.txt``), or XML in a file of
    another language and text in a ``.xml`` one, saying what to rename it to."""
    suffix, guess = p.suffix.lower(), _looks_like(text)
    looks = f"it looks like {QUERY_FILES[guess]}: rename it {p.with_suffix(guess).name}"
    if suffix not in QUERY_FILES:
        named = ", ".join(f"{s} for {lang}" for s, lang in QUERY_FILES.items())
        raise CayugaError(f"a query file's suffix says its language ({named}), and {p.suffix or 'no suffix'} says "
                          f"none ({looks})")
    if (suffix == ".xml") != (guess == ".xml"):
        starts = "starts" if guess == ".xml" else "does not start"
        raise CayugaError(f"a {suffix} file is read as {QUERY_FILES[suffix]}, and this one {starts} with '<' "
                          f"({looks})")


def expand_queries(paths: Iterable[str | Path]) -> list[Path]:
    """Query files in order: a directory stands for its ``.cel``, ``.xml`` and
    ``.sase`` files, sorted by name (not recursive)."""
    out: list[Path] = []
    for q in paths:
        p = Path(q)
        if p.is_dir():
            out.extend(sorted(f for f in p.iterdir() if f.suffix.lower() in QUERY_SUFFIXES and f.is_file()))
        else:
            out.append(p)
    return out


def decode_file(source, fmt: str, streams: Callable, result: RunResult,
                default_stream: str | None = None, names: Iterable[str] = ()) -> list[Event]:
    """The events of ``source`` (a binary or text file, or an iterable of
    lines), decoded a block of lines at a time; rejected lines go to
    ``result.rejected`` with their numbers. ``names``: the streams expected."""
    decoder = make_decoder(fmt, streams, default_stream=default_stream, streams=names)
    events: list[Event] = []
    number = 1
    for data in _blocks(source):
        batch = decoder.decode_batch(data, number)
        events.extend(batch.events)
        if batch.errors:
            lines = data.split(b"\n" if isinstance(data, bytes) else "\n")
            for no, reason in batch.errors:
                text = lines[no - number]
                text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
                result.rejected.append(Rejected(no, text.rstrip("\r\n"), reason))
        number += data.count(b"\n" if isinstance(data, bytes) else "\n")
    return events


#: Bytes read from an event file at a time (whole lines are decoded together).
BLOCK = 1 << 20


def _blocks(source, size: int = BLOCK):
    """Blocks of whole lines (each but perhaps the last ending in a newline):
    about ``size`` bytes of a binary file at a time, cut after its last
    newline; text files and iterables of lines 4096 lines at a time."""
    read = getattr(source, "read", None)
    if read is not None and isinstance(source.read(0), bytes):
        parts: list[bytes] = []  # a line longer than a block, so far
        while chunk := read(size):
            cut = chunk.rfind(b"\n") + 1
            if not cut:
                parts.append(chunk)
                continue
            if parts:
                parts.append(chunk[:cut])
                yield b"".join(parts)
                parts.clear()
            else:
                yield chunk[:cut] if cut < len(chunk) else chunk
            if cut < len(chunk):
                parts.append(chunk[cut:])
        if parts:
            yield b"".join(parts)
        return
    it = iter(source)
    while lines := list(itertools.islice(it, 4096)):
        lines = [_terminated(line) for line in lines]
        yield lines[0][:0].join(lines)


def _terminated(line: str | bytes) -> str | bytes:
    if isinstance(line, bytes):
        return line if line.endswith(b"\n") else line + b"\n"
    return line if line.endswith("\n") else line + "\n"


#: Witnesses encoded at once (a block of the engine's emissions).
WITNESS_BLOCK = 4096

#: The young generation's threshold while events are fed: above the objects a
#: block of pending witnesses keeps alive (an emission and an event each), so
#: they do not set off collections that walk them and age them into the older
#: generations (at Python's default, 700, a third of the run's CPU time went
#: to collections; BENCHMARKS.md, round 7).
YOUNG_THRESHOLD = 50_000


@contextmanager
def fewer_collections(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Raise the cyclic collector's young-generation threshold to ``young``
    for the block (not where collection is turned off, threshold 0), and set
    it back after."""
    old = gc.get_threshold()
    if old[0]:
        gc.set_threshold(max(old[0], young), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def load_engine(streams: Iterable[StreamSchema], queries: Iterable[str | Path],
                functions: FunctionRegistry | None = None, progress: Callable[[int], None] | None = None,
                *, freeze: bool = False, on_warning: Callable[[Path, BoundWarning], None] | None = None,
                ) -> tuple[Engine, list[tuple[str, list[Automaton]]]]:
    """An engine with ``streams`` declared and each query file (or each file
    of a directory, see :func:`expand_queries`) loaded under its file stem, in
    order (so later queries may read earlier outputs); returns it with the
    (owner, automata) pairs. Raises QueryError naming the file. ``progress``
    is called with the number of queries loaded so far after each one.
    ``freeze``: for a process that keeps the network to its end (``cayuga
    run``): move what is allocated so far out of the cyclic collector's reach
    for good (``gc.freeze``) instead of having it walk the network again.
    ``on_warning(file, warning)``: each clause of a query that keeps automaton
    instances without a time bound (air/boundwarn.py).

    Each query costs the same whether it is the first or the ten-thousandth:
    CEL shapes are compiled once (:class:`~air.cel.shapes.ShapeCache`), the
    compiler looks streams up in the engine's live view, and the cyclic
    garbage collector, whose full passes would walk the ever larger network,
    waits until loading is done."""
    engine = Engine(functions)
    for s in streams:
        engine.declare(s)
    loaded = []
    shapes = ShapeCache()
    fn_types = engine.functions.return_types()
    with paused_gc(freeze):
        for q in expand_queries(queries):
            warn = None if on_warning is None else (lambda w, q=q: on_warning(q, w))
            try:
                autos = load_query(q, engine.stream_view, engine.functions, shapes, fn_types, warn)
                engine.add(autos, owner=q.stem)
            except (CayugaError, EngineError) as exc:
                raise QueryError(f"{q}: {exc}") from None
            loaded.append((q.stem, autos))
            if progress is not None:
                progress(len(loaded))
    return engine, loaded


def run_offline(streams: list[StreamSchema], queries: list[str | Path], events_in: TextIO | BinaryIO,
                fmt: str = "jsonl", *, include_resub: bool = False,
                functions: FunctionRegistry | None = None,
                on_witness: Callable[[dict], None] | None = None,
                out: BinaryIO | None = None, freeze: bool = False,
                on_warning: Callable[[Path, BoundWarning], None] | None = None) -> RunResult:
    """Run ``queries`` over the events of ``events_in``. Witnesses are kept in
    ``result.witnesses`` (and handed to ``on_witness``) as dicts, or, with
    ``out``, written there as JSON lines and only counted. ``freeze``: for a
    process that ends with the run: see :func:`load_engine`; the decoded events
    are frozen too, and events are fed with :func:`fewer_collections` (a
    setting of the whole process). ``on_warning``: see :func:`load_engine`."""
    engine, _ = load_engine(streams, queries, functions, freeze=freeze, on_warning=on_warning)
    result = RunResult()
    # The decoded events live until the run ends and hold no cycles: no
    # collection needs to walk them while they are made (and, with
    # ``freeze``, after).
    with paused_gc(freeze):
        events = decode_file(events_in, fmt, engine.schema, result, names=[s.name for s in streams])
    sort_by_t1(events)
    result.events = len(events)
    schema = engine.schema
    feed = engine.feed

    if out is not None:
        # Witnesses are the engine's own emissions until a block of them is
        # encoded at once: no Python call per witness.
        pending: list = []
        engine.on_emit = pending.append
        makers: dict = {}  # (each stream's record type, made once for the run)

        def flush() -> None:
            data, count = encode_emissions(pending, schema, include_resub, makers)
            out.write(data)
            result.witness_count += count
            pending.clear()

        with fewer_collections() if freeze else nullcontext():
            for ev in events:
                feed(ev)
                if len(pending) >= WITNESS_BLOCK:
                    flush()
            engine.flush()
            flush()
        return result

    def emit(em) -> None:
        if em.kind == "OUT" or include_resub:
            w = witness_dict(em.stream, em.event, schema(em.stream))
            result.witnesses.append(w)
            result.witness_count += 1
            if on_witness is not None:
                on_witness(w)

    engine.on_emit = emit
    with fewer_collections() if freeze else nullcontext():
        for ev in events:
            feed(ev)
        engine.flush()
    return result


def write_witnesses(witnesses: Iterable[dict], out: TextIO) -> None:
    for w in witnesses:
        out.write(encode_json(w) + "\n")
