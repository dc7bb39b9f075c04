"""The plan of a ``cayuga spark stream`` job (driver, :func:`plan_stream`):
which queries run together in one engine (*units*), which of the state
store's groups each unit's events go to, and what each engine runs
(:class:`EngineSpec`). clients/spark/stream.py explains the three ways a
unit scales (by a key, by a constant, by columns) and runs the plan; the
planner of ``spark run`` (:mod:`air.partitioning`) finds the keys
and constants. Plain data and pure functions: no Spark here.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from air.model import Automaton, StreamSchema
from clients.spark import executors as X
from air.partitioning import Owned, constant_route, plan_stages


@dataclass(frozen=True)
class EngineSpec:
    """What one engine runs: input schemas and queries (owner, automata)."""

    schemas: tuple[StreamSchema, ...]
    queries: tuple[tuple[str, tuple[Automaton, ...]], ...]
    outputs: tuple[StreamSchema, ...]  # the OUT streams whose witnesses are written


@dataclass(frozen=True)
class Unit:
    """Queries run together; their events go to groups ``base .. base+size-1``.

    ``kind``: ``key`` (hash of the key attribute), ``constant`` (hash of the
    attribute, only events whose value is one of ``constants``) or ``column``
    (every event of ``inputs`` to the one group ``base``)."""

    kind: str
    owners: tuple[str, ...]
    inputs: tuple[str, ...]
    base: int
    size: int
    key_index: tuple[tuple[str, int], ...] = ()
    constants: frozenset = frozenset()
    specs: tuple[tuple[int, int], ...] = ()  # group offset -> engine spec index
    describe: str = ""


@dataclass
class StreamPlan:
    units: list[Unit]
    specs: list[EngineSpec]
    key_groups: int
    column_groups: int
    owners: list[str]
    output_streams: dict[str, StreamSchema]
    input_schemas: list[StreamSchema]

    @property
    def groups(self) -> int:
        return max((u.base + u.size for u in self.units), default=0)

    def spec_of_group(self) -> dict[int, int]:
        out = {}
        for u in self.units:
            for off, si in u.specs:
                out[u.base + off] = si
        return out

    def describe(self) -> str:
        lines = [(f"{len(self.units)} unit(s), {self.groups} group(s) in the state store; "
                  f"{self.key_groups} key group(s) and {self.column_groups} column group(s), fixed at the first start")]
        lines += [u.describe for u in self.units]
        return "\n".join(lines)

    def token(self) -> str:
        return hashlib.sha256(pickle.dumps((self.specs, self.units), protocol=4)).hexdigest()[:16]


def _components(owned: Sequence[Owned]) -> list[list[Owned]]:
    """Queries tied by resubscription (one reads what another publishes), in order."""
    parent = list(range(len(owned)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    publisher: dict[str, int] = {}
    for i, q in enumerate(owned):
        for a in q.automata:
            for _, o in a.outputs:
                publisher.setdefault(o.name, i)
    for i, q in enumerate(owned):
        for a in q.automata:
            for s in a.input_streams:
                if s in publisher and publisher[s] != i:
                    parent[find(i)] = find(publisher[s])
    groups: dict[int, list[Owned]] = {}
    for i, q in enumerate(owned):
        groups.setdefault(find(i), []).append(q)
    return sorted(groups.values(), key=lambda g: owned.index(g[0]))


def _reads(queries: Sequence[Owned]) -> tuple[str, ...]:
    read = {s.input_stream for q in queries for a in q.automata for s in a.states if s.input_stream}
    pub = {o.name for q in queries for a in q.automata for _, o in a.outputs}
    return tuple(sorted(read - pub))


def plan_stream(owned: Sequence[Owned], declared: Mapping[str, StreamSchema], all_schemas: Mapping[str, StreamSchema],
                key_groups: int, column_groups: int | None) -> StreamPlan:
    """Units for ``owned`` (see the module's docstring). ``column_groups``
    None: one per unkeyed component, at most ``key_groups``."""
    specs: list[EngineSpec] = []
    spec_ids: dict[tuple[str, ...], int] = {}
    outputs_all: dict[str, StreamSchema] = {}

    def spec(queries: Sequence[Owned]) -> int:
        ids = tuple(q.owner for q in queries)
        if ids in spec_ids:
            return spec_ids[ids]
        inputs = _reads(queries)
        outs: dict[str, StreamSchema] = {}
        for q in queries:
            for a in q.automata:
                for _, o in a.outputs:
                    if o.type == "OUT":
                        outs[o.name] = all_schemas[o.name]
        outputs_all.update(outs)
        specs.append(EngineSpec(tuple(declared[s] for s in inputs), tuple((q.owner, q.automata) for q in queries),
                                tuple(outs.values())))
        spec_ids[ids] = len(specs) - 1
        return spec_ids[ids]

    keyed: dict[tuple, list[Owned]] = {}
    routed: dict[tuple, list[tuple[Owned, object]]] = {}
    unkeyed: list[tuple[list[Owned], str]] = []
    for comp in _components(owned):
        plan = plan_stages(comp, declared)
        st = plan.stages[0]
        if len(plan.stages) == 1 and st.key is not None:
            keyed.setdefault(st.key.attributes, []).extend(comp)
            continue
        route = constant_route([a for q in comp for a in q.automata], declared) if len(comp) == 1 else None
        if route is not None:
            routed.setdefault(route.attributes, []).append((comp[0], route.value))
            continue
        reason = (st.reason if len(plan.stages) == 1
                  else f"resubscription needs {len(plan.stages)} stages in spark run; one engine here")
        unkeyed.append((comp, reason))

    units: list[Unit] = []
    base = 0
    for attrs, queries in keyed.items():
        si = spec(queries)
        key_index = tuple((s, declared[s].index(a)) for s, a in attrs)
        names = ", ".join(q.owner for q in queries)
        units.append(Unit("key", tuple(q.owner for q in queries), _reads(queries), base, key_groups, key_index,
                          specs=tuple((i, si) for i in range(key_groups)),
                          describe=(f"[{names}] row scaling: hash-partitioned by "
                                    f"{', '.join(f'{s}.{a}' for s, a in attrs)} into groups {base}-{base + key_groups - 1}")))
        base += key_groups
    for attrs, items in routed.items():
        by_group: dict[int, list[Owned]] = {}
        for q, value in items:
            by_group.setdefault(X.stable_hash(value) % key_groups, []).append(q)
        group_specs = tuple((g, spec(qs)) for g, qs in sorted(by_group.items()))
        consts = frozenset(X.normalize_key(v) for _, v in items)
        key_index = tuple((s, declared[s].index(a)) for s, a in attrs)
        shown = "; ".join(f"{q.owner}: {v!r} -> group {base + X.stable_hash(v) % key_groups}" for q, v in items)
        queries = [q for q, _ in items]
        units.append(Unit("constant", tuple(q.owner for q in queries), _reads(queries), base, key_groups, key_index,
                          consts, group_specs,
                          describe=(f"[{', '.join(q.owner for q in queries)}] routed by the constant of "
                                    f"{', '.join(f'{s}.{a}' for s, a in attrs)} ({shown})")))
        base += key_groups
    if unkeyed:
        n = column_groups or min(len(unkeyed), key_groups)
        buckets: list[list[tuple[list[Owned], str]]] = [[] for _ in range(n)]
        for i, item in enumerate(unkeyed):
            buckets[i % n].append(item)
        for ci, bucket in enumerate(buckets):
            if not bucket:
                continue
            queries = [q for comp, _ in bucket for q in comp]
            reasons = "; ".join(dict.fromkeys(r for _, r in bucket))
            units.append(Unit("column", tuple(q.owner for q in queries), _reads(queries), base, 1,
                              specs=((0, spec(queries)),),
                              describe=(f"[{', '.join(q.owner for q in queries)}] column group {ci + 1}/{n}, "
                                        f"group {base}: every event (no key: {reasons})")))
            base += 1
        column_groups = n
    return StreamPlan(units, specs, key_groups, column_groups or 0, [q.owner for q in owned],
                      dict(sorted(outputs_all.items())), list(declared.values()))
