"""SASE, the complex event language of the SASE paper (Wu, Diao, Rizvi: "High-Performance
Complex Event Processing over Streams"), as a second front end to the same
automata: parser (with positions), analysis (with the refusals of what AIR
cannot express exactly) and compiler to :mod:`air.model` automata. The
semantics, the construction and what is refused: docs/design/sase.md.

    EVENT SEQ(SHELF x, !(COUNTER y), EXIT z)
    WHERE [tag] AND x.shelf = 'A'
    WITHIN 12 hours
    RETURN x.tag, z.gate
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from air.boundwarn import UNBOUNDED, BoundWarning
from air.errors import excerpt
from air.model import Automaton, StreamSchema
from air.sase.analysis import analyze
from air.sase.compiler import compile_plan
from air.sase.errors import SaseError, SaseNameError, SaseRefused, SaseSyntaxError, SaseTypeError
from air.sase.parser import parse


@dataclass(frozen=True, slots=True)
class CompiledSase:
    automata: tuple[Automaton, ...]
    #: user-visible output streams (one: the query's)
    outputs: tuple[str, ...]
    #: schema of every stream the query publishes, the internal union stream included
    schemas: dict[str, StreamSchema]
    #: warnings of a query without WITHIN (air/boundwarn.py's kind: instances kept without a time bound)
    warnings: tuple[BoundWarning, ...] = ()


def _schemas(streams) -> Mapping[str, StreamSchema]:
    if isinstance(streams, Mapping):
        return streams
    return {s.name: s for s in streams}


def compile_sase(text: str, streams: Mapping[str, StreamSchema] | Iterable[StreamSchema], *,
                 functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0,
                 name_prefix: str | None = None) -> CompiledSase:
    """Compile one SASE query into automata.

    ``streams`` declares the event types (streams); ``functions`` maps user
    functions to their return types; WITHIN with a unit is converted into
    units of ``time_unit_ms`` milliseconds. The output stream is the query's
    PUBLISH name, else ``name_prefix`` (default ``"Q"``); the internal union
    stream is ``<prefix>__u``. Raises a :class:`SaseError` for any user error,
    :class:`SaseRefused` for what the automata cannot compute exactly.

    >>> from air.model import parse_stream_decl
    >>> q = compile_sase("EVENT SEQ(A x, !(B y), A z) WHERE [k] WITHIN 10 RETURN x.v, z.v AS w",
    ...                  [parse_stream_decl("A(k int, v int)"), parse_stream_decl("B(k int)")])
    >>> q.outputs, len(q.automata), q.schemas["Q"].names
    (('Q',), 3, ('v', 'w'))
    """
    query = parse(text)
    output = query.publish or name_prefix or "Q"
    try:
        plan = analyze(query, text, _schemas(streams), functions=functions, time_unit_ms=time_unit_ms,
                       output=output)
        automata, schemas = compile_plan(plan, name_prefix or output)
    except RecursionError:
        raise SaseSyntaxError("the query nests too deeply to compile (thousands of operators)", 1, 1, text) from None
    warnings: list[BoundWarning] = []
    if plan.window is None:
        main = automata[-1]
        for j, c in enumerate(plan.positives[1:], 1):
            line, col = c.node.line, c.node.column
            prev = plan.positives[j - 1]
            warnings.append(BoundWarning(
                UNBOUNDED, f"without WITHIN, each partial match up to {prev.var} is kept for every later "
                f"{'/'.join(c.types)} event, as long as the server runs", "add a window: WITHIN 1 hour (any bound "
                "will do: a match older than it is dropped)", main.name, str(j), main.states[1].input_stream or "",
                None, line, col, excerpt(text, line, col)))
    return CompiledSase(automata, (output,), schemas, tuple(warnings))


def validate(text: str, streams: Mapping[str, StreamSchema] | Iterable[StreamSchema], *,
             functions: Mapping[str, str] | None = None, time_unit_ms: float = 1.0) -> list[SaseError]:
    """The error a registration would meet (SASE stops at the first), or ``[]``."""
    try:
        compile_sase(text, streams, functions=functions, time_unit_ms=time_unit_ms)
    except SaseError as e:
        return [e]
    return []


__all__ = ["compile_sase", "validate", "parse", "CompiledSase", "SaseError", "SaseSyntaxError", "SaseNameError",
           "SaseTypeError", "SaseRefused"]
