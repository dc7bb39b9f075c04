"""/subscriptions/{id}/automaton: a subscription's automata as a graph.

States (with schema, input stream, outputs and live instance count), edges
(filter, rebind, forward; each with its predicate as text and its schema map),
links between the subscription's own automata (RESUB streams) and
resubscription links to other subscriptions. Built from the automata model the
subscription was compiled to; the only engine read is the per-state instance
count, done on the engine thread (``Daemon.state_counts``). Never lays the
graph out: the console does that in the browser.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from air.expr import And, Binary, Call, Compare, Dur, Expr, Or, Ref, Unary, to_air
from air.model import (Automaton, ComplexAtom, Computed, DurationAtom, DynamicAtom, Edge, Predicate, StaticAtom,
                       State)
from server.api.deps import AUTH_ERRORS, DaemonDep, Watch, require_reach
from server.api.errors import errors
from server.subscriptions.broken import FIX

router = APIRouter(prefix="/subscriptions", tags=["subscriptions"], responses=errors(*AUTH_ERRORS))
#: What the automaton reads may answer besides 200.
_ERRORS = errors(404, 409, 422, 503, why={
    409: "The subscription is broken (its stored query no longer compiles against the configuration): it has "
         "no automata; GET /subscriptions/{id} says why",
    503: "The engine did not answer in time: its thread is busy, or the engine worker that runs the "
         "subscription has ended and is being started again, or is stopped (the detail says which): retry"})


def _not_in_time(exc: TimeoutError) -> HTTPException:
    """The 503 of a count the engine did not give: why, where the engine said (an engine worker
    that has ended, or is stopped: server/workers/dispatch.py), and retry."""
    why = str(exc) or "the engine thread did not answer in time"
    return HTTPException(503, detail=f"{why}; retry")


def _not_broken(d, sid: str, request: Request, who) -> None:
    """409 for a broken subscription (one ``who`` reaches): it has no automata to show."""
    b = d.broken.get(sid)
    if b is not None:
        require_reach(request, who, b)
        raise HTTPException(409, detail=f"subscription {sid} is broken: {b.reason}; it has no automata. {FIX}")

#: Binding strength of arithmetic operators (docs/design/semantics.md#cel: ^ and % above * and /, above + and -).
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "^": 3, "%": 3}


def expr_text(e: Expr) -> str:
    """An expression as a person would write it: infix, parentheses only where needed."""
    if isinstance(e, Ref):
        return f"{e.source}.{e.name}" if e.source in ("EV", "NODE") else e.name
    if isinstance(e, Binary):
        p = _PREC.get(e.op, 0)
        left, right = expr_text(e.left), expr_text(e.right)
        if isinstance(e.left, Binary) and _PREC.get(e.left.op, 0) < p:
            left = f"({left})"
        if isinstance(e.right, Binary) and _PREC.get(e.right.op, 0) <= p:
            right = f"({right})"
        return f"{left} {e.op} {right}"
    if isinstance(e, Unary):
        inner = expr_text(e.operand)
        return f"-({inner})" if isinstance(e.operand, Binary) else f"-{inner}"
    if isinstance(e, Call):
        return f"{e.name}(" + ", ".join(expr_text(a) for a in e.args) + ")"
    if isinstance(e, Compare):
        return f"{expr_text(e.left)} {e.op} {expr_text(e.right)}"
    if isinstance(e, (And, Or)):
        word = " AND " if isinstance(e, And) else " OR "
        return word.join(f"({expr_text(a)})" if isinstance(a, (And, Or)) else expr_text(a) for a in e.items)
    if isinstance(e, Dur):
        return "DUR"
    return to_air(e)  # literals


def atom_text(a) -> str:
    if isinstance(a, StaticAtom):
        return f"EV.{a.event_attr} {a.op} {a.const}"
    if isinstance(a, DynamicAtom):
        return f"EV.{a.event_attr} {a.op} NODE.{a.node_attr}"
    if isinstance(a, DurationAtom):
        const = int(a.const) if float(a.const).is_integer() else a.const
        return f"{'DUR' if a.kind == 'EVENT' else 'DUR(composite)'} {a.op} {const}"
    if isinstance(a, ComplexAtom):
        return expr_text(a.expr)
    raise TypeError(a)


def predicate_text(p: Predicate | None) -> str:
    """``TRUE``, ``FALSE``, or the DNF with AND inside and OR between clauses."""
    if p is None or p.is_true:
        return "TRUE"
    if not p.clauses:
        return "FALSE"
    clauses = [" AND ".join(atom_text(a) for a in c.atoms) for c in p.clauses]
    return clauses[0] if len(clauses) == 1 else " OR ".join(f"({c})" for c in clauses)


def _map_text(edge: Edge) -> list[str]:
    return [f"{m.attr} := {expr_text(m.expr)}" if isinstance(m, Computed) else f"{m.new} := {m.source}.{m.old}"
            for m in edge.schema_map]


def _edge(kind: str, src: str, dest: str, edge: Edge | None, pred: Predicate | None) -> dict:
    out = {"from": src, "to": dest, "kind": kind, "predicate": predicate_text(pred)}
    if edge is not None:
        out["map"] = _map_text(edge)
        out["resets_start"] = edge.resets_start
    return out


def _state(key: str, ai: int, s: State, count: int | None) -> dict:
    return {"key": key, "automaton": ai, "id": s.id, "start": s.is_start, "end": s.is_end,
            "input_stream": s.input_stream, "schema": [{"name": a.name, "type": a.type} for a in s.schema],
            "outputs": [{"name": o.name, "type": o.type} for o in s.outputs],
            "instances": None if s.is_start or s.is_end else count}  # end states keep no instances


def automaton_graph(automata: tuple[Automaton, ...], counts: dict[str, int]) -> dict:
    """States, edges and internal links of one subscription's automata; state
    keys are ``"<automaton index>/<state id>"`` like the engine's."""
    states, edges, links = [], [], []
    publishers: dict[str, list[str]] = {}  # stream -> keys of states that output it
    for ai, auto in enumerate(automata):
        for s in auto.states:
            key = f"{ai}/{s.id}"
            states.append(_state(key, ai, s, counts.get(key, 0)))
            for o in s.outputs:
                publishers.setdefault(o.name, []).append(key)
            if s.filter is not None and not s.is_start:
                edges.append(_edge("filter", key, key, None, s.filter))
            if s.rebind is not None:
                edges.append(_edge("rebind", key, key, s.rebind, s.rebind.predicate))
            for f in s.forwards:
                edges.append(_edge("forward", key, f"{ai}/{f.destination}", f, f.predicate))
    for ai, auto in enumerate(automata):
        for s in auto.start_states:
            for src in publishers.get(s.input_stream, ()):
                links.append({"from": src, "to": f"{ai}/{s.id}", "stream": s.input_stream})
    return {"automata": [{"index": ai, "name": a.name} for ai, a in enumerate(automata)],
            "states": states, "edges": edges, "links": links}


def resubscriptions(d, sid: str) -> dict:
    """Streams this subscription reads from other subscriptions, and its
    output streams that other subscriptions read. Scans every subscription."""
    me = d.subscriptions[sid]
    reads = me.reads()
    mine = set(me.outputs) | set(me.internal)
    publishes = set(me.outputs)
    from_others, to_others = [], []
    for other in list(d.subscriptions.values()):
        if other.id == sid:
            continue
        for stream in sorted(reads & (set(other.outputs) - mine)):
            from_others.append({"stream": stream, "subscription": other.id, "name": other.name})
        other_reads = other.reads()
        for stream in sorted(publishes & other_reads):
            to_others.append({"stream": stream, "subscription": other.id, "name": other.name})
    return {"reads": from_others, "read_by": to_others}


async def _state_counts(d, sid: str) -> dict[str, int]:
    """``Daemon.state_counts``; none while the subscription's backfill runs (issue 36): its
    instances are on the backfill's own engine until the hand-over, not yet on the live one."""
    try:
        return await run_in_threadpool(d.state_counts, sid)
    except KeyError:
        b = d.backfill(sid) if sid in d.subscriptions else None
        if b and b.get("state") in ("running", "handing_over"):
            return {}
        raise


@router.get("/{sid}/automaton", summary="A subscription's automata as a graph", responses=_ERRORS)
async def get_automaton(sid: str, d: DaemonDep, who: Watch, request: Request) -> dict:
    """The subscription's automata as a graph, with live instance counts per state."""
    _not_broken(d, sid, request, who)
    sub = d.subscriptions.get(sid)
    if sub is None:
        raise HTTPException(404, detail=f"no subscription {sid!r}; GET /subscriptions lists them")
    require_reach(request, who, sub)
    try:
        counts = await _state_counts(d, sid)
        links = await run_in_threadpool(resubscriptions, d, sid)
    except KeyError:
        raise HTTPException(404, detail=f"subscription {sid!r} was just removed") from None
    except TimeoutError as exc:
        raise _not_in_time(exc) from None
    graph = automaton_graph(sub.automata, counts)
    return {"id": sid, "name": sub.name, "kind": sub.kind, "outputs": sub.outputs, "internal_streams": sub.internal,
            **graph, "resubscriptions": links}


@router.get("/{sid}/automaton/instances", summary="Live instances per state of a subscription", responses=_ERRORS)
async def get_automaton_instances(sid: str, d: DaemonDep, who: Watch, request: Request) -> dict:
    """Live instances per state (keys as in the graph), counted on the engine thread."""
    _not_broken(d, sid, request, who)
    sub = d.subscriptions.get(sid)
    if sub is not None:
        require_reach(request, who, sub)
    try:
        counts = await _state_counts(d, sid)
    except KeyError:
        raise HTTPException(404, detail=f"no subscription {sid!r}; GET /subscriptions lists them") from None
    except TimeoutError as exc:
        raise _not_in_time(exc) from None
    return {"id": sid, "instances": counts, "total": sum(counts.values())}
