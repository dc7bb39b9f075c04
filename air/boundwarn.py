"""Registration warnings: states that keep automaton instances without a time
bound (docs/design/semantics.md#automata). No I/O.

An instance at a non-start state waits for an event that *affects* it (one
that satisfies the state's filter predicate θ). With θ TRUE every event of
the state's stream affects it, so it does not wait long; with a θ that bounds
the composite's duration in every clause (``DUR < 1 HOUR``, air/bounds.py) it
is dropped once no event can affect it any more. Any other θ keeps each
instance that no event ever satisfies for as long as the server runs: the
README's Rising query keeps every quote whose stock never rises 5%, a FOLD
whose filter no event meets keeps one instance per event. Such a query still
registers; :func:`cel_warnings` and :func:`air_warnings` say which clause does
it and how to bound it, one :class:`BoundWarning` per clause.

For CEL the clause is the NEXT or FOLD that made the state (the compiler's
``CompiledQuery.origins``): the warning carries the line and column of its
keyword and a caret excerpt. For AIR it is the state, with its line in the
XML when the loader recorded it.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import Iterable, NamedTuple

from air.bounds import clause_horizon, filter_horizon
from air.cel.compiler import CompiledQuery, Origin
from air.errors import excerpt, render
from air.model import Automaton, State

#: The stable code of this warning (clients may match on it).
UNBOUNDED = "unbounded_instances"


class BoundWarning(NamedTuple):
    """One clause that keeps instances without a time bound."""

    code: str
    #: what keeps them, and for how long
    message: str
    #: how to bound them
    fix: str
    #: the automaton (its name) and state (its id) holding the instances
    automaton: str
    state: str
    #: the stream whose events the instances wait for
    stream: str
    #: "NEXT" or "FOLD" (CEL), None (AIR)
    operator: str | None
    #: where in the text (1-based; 0 when not known) and the line with a caret under the column
    line: int
    column: int
    excerpt: str

    def to_dict(self) -> dict:
        return self._asdict()

    def render(self) -> str:
        """``line L, column C: warning: ...; fix`` and the excerpt, as a terminal shows it."""
        return render(f"warning: {self.message}; {self.fix}", self.line, self.column, self.excerpt)


def keeps_unbounded(state: State) -> bool:
    """Whether ``state`` keeps instances that no event affects with no time
    bound: a non-start state with an input stream whose filter is neither
    TRUE (every event affects them) nor bounded in every clause."""
    f = state.filter
    return (not state.is_start and state.input_stream is not None and f is not None and not f.is_true
            and filter_horizon(f) is None)


def unbounded_states(automata: Iterable[Automaton]) -> list[tuple[int, State]]:
    """``(automaton index, state)`` of every state :func:`keeps_unbounded`."""
    return [(i, s) for i, a in enumerate(automata) for s in a.states if keeps_unbounded(s)]


def _alternatives(state: State) -> str:
    """Why an OR filter is unbounded when some of its alternatives are bounded ("" otherwise)."""
    clauses = state.filter.clauses  # type: ignore[union-attr]
    bare = sum(1 for c in clauses if clause_horizon(c) is None)
    if bare == len(clauses):
        return ""
    return f" ({bare} of the {len(clauses)} alternatives of its OR {'has' if bare == 1 else 'have'} no DUR bound)"


# --------------------------------------------------------------------------- CEL


def _cel_text(operator: str, state: State, has_pred: bool) -> tuple[str, str]:
    """Message and fix for the NEXT or FOLD that made ``state``."""
    either = len(state.filter.clauses) > 1  # type: ignore[union-attr]
    stream = state.input_stream
    if operator == "NEXT":
        message = (f"NEXT keeps each partial match until a later {stream} event satisfies its condition; "
                   "those that no event ever satisfies are kept as long as the server runs"
                   + _alternatives(state))
        if not has_pred:
            fix = "give it a time bound: NEXT{DUR < 1 HOUR}"
        elif either:
            fix = "bound every alternative: NEXT{(...) AND DUR < 1 HOUR}"
        else:
            fix = "add a time bound inside the braces: NEXT{... AND DUR < 1 HOUR}"
    else:
        message = (f"FOLD keeps each partial match until a later {stream} event satisfies its filter (the first "
                   "predicate of FOLD{filter, rebind, aggregates}); those that no event ever satisfies are kept "
                   "as long as the server runs" + _alternatives(state))
        if not has_pred:
            fix = "give FOLD a time bound as its filter: FOLD{DUR < 1 HOUR, ..., ...}"
        elif either:
            fix = "bound every alternative of its filter: FOLD{(...) AND DUR < 1 HOUR, ..., ...}"
        else:
            fix = "add a time bound to its filter: FOLD{... AND DUR < 1 HOUR, ..., ...}"
    return message, fix + " (any bound will do: a match older than it is dropped)"


#: What may hold the word NEXT or FOLD without it being an operator: comments and
#: strings (as air/expr.py tokenizes them).
_QUOTED = re.compile(r"--[^\n]*|//[^\n]*|/\*.*?\*/|'(?:[^']|'')*'", re.S)
#: NEXT or FOLD in any case, as part of a word or not (a text that is not ASCII, whose
#: ``upper()`` may not keep its length).
_CANDIDATE = re.compile(r"[Nn][Ee][Xx][Tt]|[Ff][Oo][Ll][Dd]")
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_0123456789")
_DIGITS = frozenset("0123456789")


def operator_positions(text: str, count: int | None = None) -> list[tuple[int, int]]:
    """(line, column) of each NEXT and FOLD operator of ``text``, in source
    order: a scan of the words outside comments and strings, far cheaper than
    parsing (a query bound from a cached shape is not parsed at all). Should
    the scan not find the ``count`` operators the compiler saw, the parser
    decides. A word is a run of letters, digits and ``_`` less the digits it
    starts with (the tokenizer's names: ``9NEXT`` holds the word NEXT, ``a9NEXT``
    does not). C-level searches for the two words, then a look at each place
    found: a Python step a word made this scan 40% of the CPU of registering
    10,000 per-symbol queries (BENCHMARKS.md, "Engine workers, round 25")."""
    if text.isascii():
        upper = text.upper()
        places = [i for word in ("NEXT", "FOLD") for i in _finds(upper, word)]
        places.sort()
    else:
        places = [m.start() for m in _CANDIDATE.finditer(text)]
    found: list[tuple[int, int]] = []
    if places:
        quoted = [m.span() for m in _QUOTED.finditer(text)] if "'" in text or "-" in text or "/" in text else []
        starts = [0] + [m.end() for m in re.finditer("\n", text)]
        for at in places:
            if not _is_word(text, at) or _inside(quoted, at):
                continue
            line = bisect_right(starts, at)
            found.append((line, at - starts[line - 1] + 1))
    if count is None or len(found) == count:
        return found
    return _parsed_positions(text)


def _finds(text: str, word: str) -> list[int]:
    out, i = [], text.find(word)
    while i >= 0:
        out.append(i)
        i = text.find(word, i + len(word))
    return out


def _is_word(text: str, at: int) -> bool:
    """Whether the four letters at ``at`` are a word of their own."""
    end = at + 4
    if end < len(text) and text[end] in _NAME_CHARS:
        return False
    while at > 0 and text[at - 1] in _DIGITS:
        at -= 1
    return at == 0 or text[at - 1] not in _NAME_CHARS


def _inside(spans: list[tuple[int, int]], at: int) -> bool:
    """Whether ``at`` lies in one of ``spans`` (sorted, apart)."""
    k = bisect_right(spans, (at, 1 << 62)) - 1  # (the last span starting at or before it)
    return k >= 0 and spans[k][0] <= at < spans[k][1]


def _parsed_positions(text: str) -> list[tuple[int, int]]:
    from air.cel import ast
    from air.cel.parser import parse

    out: list[tuple[int, int]] = []
    todo: list = [parse(text).source]
    while todo:
        e = todo.pop()
        if isinstance(e, (ast.Next, ast.Fold)):
            out.append((e.line, e.column))
            todo += (e.left, e.right)
        elif isinstance(e, ast.Filter):
            todo.append(e.input)
        elif isinstance(e, ast.SubQuery):
            todo.append(e.query.source)
    return sorted(out)


def cel_warnings(text: str, compiled: CompiledQuery) -> list[BoundWarning]:
    """The warnings of a CEL query ``text`` compiled into ``compiled``, one per
    NEXT or FOLD that keeps instances without a time bound, in source order."""
    found = unbounded_states(compiled.automata)
    if not found:
        return []
    origins: dict[tuple[int, str], Origin] = {(o.automaton, o.state): o for o in compiled.origins}
    positions = operator_positions(text, len(compiled.origins)) if origins else []
    out: dict[object, BoundWarning] = {}
    for i, state in found:
        auto = compiled.automata[i]
        o = origins.get((i, state.id))
        if o is None or o.ordinal >= len(positions):  # not from compile_cel: no position to give
            op = "FOLD" if state.rebind is not None else "NEXT"
            message, fix = _cel_text(op, state, True)
            out.setdefault((i, state.id), BoundWarning(UNBOUNDED, message, fix, auto.name, state.id,
                                                       state.input_stream or "", op, 0, 0, ""))
            continue
        line, column = positions[o.ordinal]
        message, fix = _cel_text(o.operator, state, o.has_pred)
        out.setdefault(o.ordinal, BoundWarning(UNBOUNDED, message, fix, auto.name, state.id, state.input_stream or "",
                                               o.operator, line, column, excerpt(text, line, column)))
    return sorted(out.values(), key=lambda w: (w.line == 0, w.line, w.column))


# --------------------------------------------------------------------------- AIR


def _const(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


def air_warnings(automata: Iterable[Automaton], text: str = "", time_unit_ms: float = 1.0) -> list[BoundWarning]:
    """The warnings of AIR automata (``text``: the XML they were read from, for
    excerpts), one per state that keeps instances without a time bound."""
    autos = tuple(automata)
    hour = _const(3_600_000 / time_unit_ms)
    out: dict[tuple[str, str], BoundWarning] = {}
    for i, state in unbounded_states(autos):
        name = autos[i].name
        line = state.line or 0
        message = (f"state {state.id} of automaton {name} keeps each instance until an event of "
                   f"{state.input_stream} satisfies its filter predicate (<FilterEdge>); those that no event ever "
                   "satisfies are kept as long as the server runs" + _alternatives(state))
        fix = (f'add <DurationPred Type="COMPOSITE" OP="&lt;" Const="{hour}"/> (one hour; any bound will do) to '
               "every <PredClause> of its <FilterEdge>")
        out.setdefault((name, state.id), BoundWarning(UNBOUNDED, message, fix, name, state.id,
                                                      state.input_stream or "", None, line, 0,
                                                      excerpt(text, line, 0)))
    return list(out.values())


__all__ = ["BoundWarning", "UNBOUNDED", "keeps_unbounded", "unbounded_states", "cel_warnings", "air_warnings",
           "operator_positions"]
